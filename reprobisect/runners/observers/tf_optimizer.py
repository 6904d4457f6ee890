"""The TensorFlow recorder's optimizer step: ``init``, ``grad``, ``param``, ``optim_state``.

A Keras optimizer's outermost ``apply`` (``apply_gradients`` calls it; a
``LossScaleOptimizer``'s inner call is part of it) is one step: the variables before the
first update (``init``, step 0), each gradient as passed to ``apply`` (named like its
variable), every variable after the update and every optimizer variable; ``scalars.lr``, and
``scalars.hyperparams`` (one group: the optimizer's ``beta_1``, ``beta_2``, ``epsilon``,
``weight_decay``, ``momentum``, ``nesterov``, ``amsgrad``, ... that are plain numbers or bools,
read from the optimizer's attributes at each step's end).
In graph mode the values after the update are tapped in the graph, after the update ops.
``None`` gradients are findings (printed once, in the step's scalars and the manifest).
Trainable variables of the model never passed to ``apply`` (a loop that filters the
``(grad, var)`` pairs) are named in the manifest: ``extra.tensorflow.unapplied_variables``.
``manual_step`` ends a step by hand after an update the recorder cannot see.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import tensorflow as tf

from reprobisect.errors import UsageError
from reprobisect.runners.chain import Observer, plain_settings, register_observer, unique
from reprobisect.runners.observers.tf_common import _Apply, _dense, _in_xla, _read, _tensors, _total_norm, _var_name

__all__ = ["TFOptimizerObserver", "HYPERPARAMS"]

HYPERPARAMS = ("beta_1", "beta_2", "epsilon", "weight_decay", "momentum", "nesterov", "amsgrad", "rho",
               "centered", "clipnorm", "clipvalue", "global_clipnorm")
"""Keras optimizer attributes that change the update besides the learning rate (Adam/AdamW,
SGD, RMSprop; gradient clipping happens inside ``apply``, after the recorded gradients)."""


def _hyperparams(opt: Any) -> list[dict[str, Any]] | None:
    """``opt``'s ``HYPERPARAMS`` that are plain bools or numbers, as one group (None without
    an optimizer: a step ended by hand). A variable or schedule is left out (not plain)."""
    if opt is None:
        return None
    return [plain_settings(lambda key: getattr(opt, key, None), HYPERPARAMS)]


class TFOptimizerObserver(Observer):
    """What an optimizer's ``apply`` is given and leaves; steps ended by hand."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.depth = 0  # inside apply (a LossScaleOptimizer's inner call is part of the outer one)
        self.none_seen: set[str] = set()
        self.applied: set[int] = set()  # ids of every variable any apply was given (doctor's ``update``)

    def apply(self, orig: Callable, opt: Any, grads: Any, variables: Any) -> Any:
        """``opt.apply(grads, variables)``, observed: the step's end."""
        rec = self.rec
        if not rec.active or self.depth:
            return orig(opt, grads, variables)
        rec.raise_if_stopped()
        self.depth += 1
        try:
            grads = list(grads)
            variables = list(variables) if variables is not None else None
            pre = rec.guarded("apply", self._before, opt, grads, variables)
            out = orig(opt, grads, variables)
            if pre is not None and rec.active:
                rec.guarded("apply", self._after, pre)
        finally:
            self.depth -= 1
        rec.raise_if_stopped()
        return out

    def _before(self, opt: Any, grads: list[Any], variables: list[Any] | None) -> _Apply:
        rec = self.rec
        if variables is None:
            variables = list(getattr(opt, "_trainable_variables", []) or [])
        rec.optimizer_ref = weakref.ref(opt)
        occ: dict[tuple[str, str], int] = {}
        names = [unique(occ, "param", _var_name(v)) for v in variables]
        none_names = [n for n, g in zip(names, grads) if g is None]
        if none_names:
            self._warn_none(none_names, len(none_names) == len(names))
        self._note_unapplied(variables)
        try:
            lr = tf.convert_to_tensor(opt.learning_rate)
        except Exception:
            lr = None
        graph = not tf.executing_eagerly()
        pre = _Apply(opt, variables, names, none_names, lr, graph)
        if rec.step == 0 or graph:
            rec._tap("init", names, [_read(v) for v in variables], step0=True, named=True)
        have = [(n, g) for n, g in zip(names, grads) if g is not None]
        rec._tap("grad", [n for n, _ in have], [_dense(g) for _, g in have], named=True)
        if rec.policy.sentinel and have:
            pre.gnorm = _total_norm([_dense(g) for _, g in have])
        return pre

    def _warn_none(self, names: list[str], all_none: bool) -> None:
        rec = self.rec
        new = [n for n in names if n not in self.none_seen]
        self.none_seen.update(names)
        rec.info["none_gradients"] = {"variables": sorted(self.none_seen),
                                      "first_step": rec.info.get("none_gradients", {}).get("first_step", rec.step)}
        if new:
            what = "no variable had a gradient" if all_none else f"{len(names)} variable(s) had no gradient"
            print(f"reprobisect: warning: {what} (None) at step {rec.step}: {', '.join(names)} "
                  "(used outside the tape, a NumPy round trip, or an unused branch?); recorded in the trace",
                  file=sys.stderr)

    def _note_unapplied(self, variables: list[Any]) -> None:
        """Name the model's trainable variables no ``apply`` has been given so far (the loop
        filtered them out of the ``(grad, var)`` pairs: they never get an update, and the
        recorded steps cannot show what they never hold). Variables of every optimizer count."""
        rec = self.rec
        self.applied.update(id(v) for v in variables)
        model = rec.model_ref() if rec.model_ref is not None else None
        left = [_var_name(v) for v in getattr(model, "trainable_variables", None) or [] if id(v) not in self.applied]
        if left:
            first = rec.info.get("unapplied_variables", {}).get("first_step", rec.step)
            rec.info["unapplied_variables"] = {"variables": left, "first_step": first}
        else:
            rec.info.pop("unapplied_variables", None)

    def _after(self, pre: _Apply) -> None:
        rec = self.rec
        opt_vars = [v for v in getattr(pre.opt, "variables", [])]
        occ: dict[tuple[str, str], int] = {}
        opt_names = [unique(occ, "optim_state", _var_name(v)) for v in opt_vars]
        if not pre.graph:
            hyper = _hyperparams(pre.opt)
            if hyper is not None:
                rec._scalars["hyperparams"] = hyper
            rec._end_step(pre, [_read(v) for v in pre.variables], opt_names, [_read(v) for v in opt_vars], pre.lr,
                          pre.gnorm)
            return
        if _in_xla():
            rec.info.setdefault("xla", "inside an XLA-compiled function (jit_compile=True) the step is not recorded; "
                                       "run it without jit_compile to record it")
            return
        gs = rec._gstate()
        params = [_read(v) for v in pre.variables]
        ostate = [_read(v) for v in opt_vars] if not rec.policy.sentinel else []
        scalars = [x for x in (pre.lr, pre.gnorm) if x is not None]
        n_p, n_o = len(params), len(ostate)

        def at_run(*values: Any) -> None:
            rest = iter(values[n_p + n_o:])
            lr = next(rest) if pre.lr is not None else None
            gnorm = next(rest) if pre.gnorm is not None else None
            hyper = _hyperparams(pre.opt)  # read as this step runs, not when the graph was traced
            if hyper is not None:
                rec._scalars["hyperparams"] = hyper
            rec.guarded("step", rec._end_step, pre, list(values[:n_p]), opt_names if ostate else [],
                        list(values[n_p:n_p + n_o]), lr, gnorm)

        taps, gs["taps"] = gs["taps"], []
        rec._py(at_run, params + ostate + scalars, deps=taps)

    def manual_step(self, *, loss: Any = None, grads: Any = None, variables: Any = None, lr: Any = None) -> bool:
        """See ``TFRecorder.manual_step``."""
        rec = self.rec
        if not tf.executing_eagerly():
            raise UsageError("reprobisect.tensorflow: rec.step() records eager values; call it outside tf.function")
        applied, rec._applied = rec._applied, 0
        if not rec.active or applied:
            return False
        variables = list(variables or [])
        grads = list(grads) if grads is not None else []
        occ: dict[tuple[str, str], int] = {}
        names = [unique(occ, "param", _var_name(v)) for v in variables]
        if loss is not None and not any(it.rec.kind == "loss" for it in rec._items):
            rec._tap("loss", "loss", _tensors(loss))
        none_names = [n for n, g in zip(names, grads) if g is None]
        if none_names:
            self._warn_none(none_names, len(none_names) == len(names))
        have = [(n, g) for n, g in zip(names, grads) if g is not None]
        rec._tap("grad", [n for n, _ in have], [_dense(g) for _, g in have], named=True)
        pre = _Apply(None, variables, names, none_names, lr, False)
        if rec.policy.sentinel and have:
            pre.gnorm = _total_norm([_dense(g) for _, g in have])
        rec._end_step(pre, [_read(v) for v in variables], [], [], lr, pre.gnorm)
        return True


register_observer("tensorflow", "optimizer", TFOptimizerObserver, rank=40)
