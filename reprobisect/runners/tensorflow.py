"""The TensorFlow / Keras recorder: one training step's chain, recorded without code changes.

Runs inside the user's process: the launcher activates it when the script imports
``tensorflow`` or ``keras`` (``reprobisect.runners.registry``); ``reprobisect.tensorflow.record``
installs it around explicit code. It never imports torch. Keras 3 on the TensorFlow backend.

What a step is: one optimizer update, i.e. one outermost call of a Keras optimizer's
``apply`` (``apply_gradients`` calls it; a ``LossScaleOptimizer``'s inner call is part of
it): the batch, forward pass and loss that lead to it, the gradients it applies, the
variables after it. What is observed, and how (class-level wraps, undone by ``remove``):

- ``batch``: ``model.fit`` is wrapped to wrap the model's ``train_step`` (on the instance:
  an overridden ``train_step`` is covered too); its ``data`` gives ``data[i]`` records
  (every tensor of the batch). ``ids`` (int64 sample indices): when ``x`` given to ``fit``
  is one NumPy array whose rows are unique, each batch row is found in it by content, so
  the IDs are Keras' own order (with ``shuffle``) whatever its shuffling does. The same for
  a ``tf.data`` pipeline traced back to ``from_tensor_slices`` through shuffle / batch /
  repeat / prefetch / take / skip / cache (its first component's rows). Otherwise (a
  ``map``, a generator, repeated rows, several inputs) the IDs are not derivable and the
  manifest says so (``extra.tensorflow.batch_ids``); the batch content is recorded anyway.
  A custom loop's batches: ``next()`` on a ``tf.data`` iterator (``for xb, yb in ds``) is
  wrapped; a drawn batch waits for the training forward that uses it (eager), or for the
  step's end (the last one drawn, when the step ran in a graph); a forward with no tape
  (evaluation) drops the waiting batches.
- ``input`` / ``activation`` / ``output``: ``keras.layers.Layer.__call__`` is wrapped. A
  layer called with no layer on the call stack while a ``GradientTape`` is recording is the
  training root: its tensor arguments are ``input``, its result ``output``; every layer it
  calls is an ``activation`` named by its path of layer names (``block.dense_1``), with
  ``#k`` for the k-th repeat call in the step and ``[i]`` for the i-th tensor of a
  structured result, ``module`` = the layer's class, ``inputs`` = its inputs' fingerprints.
  Calls with no tape recording (validation, ``predict``, building) are not records.
- Evaluation, summarised where compare does not look for its verdict (as the torch
  recorder): ``fit``'s validation, ``evaluate``, ``predict`` (their ``Trainer`` methods are
  wrapped, and the model's ``test_step``/``predict_step`` on the instance for the batches)
  and any root layer call with no tape recording go into ``scalars["eval"]`` of the step
  they ran before: one entry per run of one ``phase`` (``validation``, ``evaluate``,
  ``predict``, ``no_tape``) with ``after_step``, ``forwards``, ``batches``, ``samples`` and
  ``ids_fingerprint`` (rows of the ``x`` evaluated, when unique), ``outputs_fingerprint``
  (of the first 16 root outputs). In graph mode a tap on the root output counts them at run
  time; under XLA nothing is summarised. After the last step: ``extra.eval_after_last_step``.
- ``loss``: ``tf.GradientTape.gradient`` is wrapped: its ``target`` is the loss (in ``fit``
  the loss as scaled by a ``LossScaleOptimizer``), one record per ``gradient`` call.
- ``init`` (step 0), ``grad``, ``param``, ``optim_state``: the optimizer's ``apply``: the
  variables before the first update, each gradient as passed to ``apply`` (named like its
  variable: ``sequential/dense/kernel``), every variable of the call after the update, and
  every optimizer variable (``iterations``, moments). ``scalars.lr`` is the learning rate
  the update used; ``scalars.grad_norm`` the norm of the gradients as applied.
- ``None`` gradients are findings: the variables are printed on stderr once (one line
  naming all), and every step holding them has ``scalars.none_grad_variables`` (and
  ``scalars.no_gradients`` when none had one); the manifest's
  ``extra.tensorflow.none_gradients`` names them. The optimizer is then called exactly as
  without the recorder (Keras skips those variables with its own warning).

Eager and graph: in eager execution (``run_eagerly=True``, a plain eager loop) every tensor
is fingerprinted on the spot. Under ``tf.function`` (``fit``'s default) the wraps run once,
at tracing, and insert ``tf.py_function`` taps that hand the runtime values to the recorder
(the variables after the update are read in the graph after the update ops, so the
recorder sees exactly what the next step uses). Layer outputs inside the model are not
tapped in graph mode: a tap is an extra consumer that can stop Grappler from fusing ops,
i.e. could change the numerics being recorded; the manifest says so
(``extra.tensorflow.layer_outputs``), and the model's input and output, loss, gradients
and variables are still recorded. Under XLA (``jit_compile=True``) no tap can run inside
the compiled function: ``fit`` then records the variables after each step and the
optimizer variables from a callback, and says what is missing. ``REPROBISECT_TF_EAGER=1``
makes ``fit`` run eagerly (``run_eagerly=True``) for full detail; this can change numerics
and is recorded (``extra.tensorflow.forced_eager``); by default the user's mode is kept.

Detail: ``full`` records all of the above; ``sentinel`` only ``init``, ``batch``, ``loss``,
``param`` and the scalars (``grad_norm`` then comes from one float64 norm over the gradients,
computed beside them). At most ``policy.max_records_per_step`` input/activation/output
records a step; the rest are counted (``scalars.records_dropped``). Complete state after
the policy's state steps: ``reprobisect.runners.tf_state.capture_state``.

Replay (``--replay-from``, ``runners.replay_tf``): steps before ``record_from`` run quiet
(nothing fingerprinted or written); recording starts at it, numbered as in the original.

Stopping: after ``policy.steps`` steps ``StopRun`` is raised: at once from ``apply`` in
eager mode, else when the ``tf.function`` running the step returns (``fit``'s train
function or the script's own). With ``policy.defer_stop`` (``bisect resume``: a preemption
comes after the step's own code, its checkpoint save) the stop waits until the next step
begins: the next call of a ``tf.function`` a step ended in, or an eager loop's next
``GradientTape.gradient``; or the process ends by itself.

How it is built: a step chain plus observers, as the torch recorder. ``TFRecorder`` owns the
step (its buffer, graph taps, chain order, the end of a step, the policy and the record
budget); each observation is an observer of its own (``runners.observers.tf_*``: batches,
evaluation, layers, the optimizer step, Keras' ``fit``), sharing the framework-free core
(``runners.chain``: names, loss scalars, the evaluation summary) with the torch recorder.
"""

from __future__ import annotations

import math
import sys
import traceback
import weakref
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.eager import backprop, context
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.framework import ops as tf_ops

from reprobisect.runners import fingerprint_tf as fptf
from reprobisect.runners.chain import first_nonfinite, flatten, json_float, loss_scalars, observer_classes, unique
from reprobisect.runners.observers.tf_common import _Apply, _in_xla, _Item, _tensors
from reprobisect.runners.observers.tf_keras import install_keras
from reprobisect.runners.policy import RecordPolicy, StopRun
from reprobisect.trace.fingerprint import dtype_name
from reprobisect.trace.format import KINDS, SENTINEL_KINDS, Record

__all__ = ["RecordPolicy", "StopRun", "TFRecorder", "current", "install_keras"]

_KIND_RANK = {k: i for i, k in enumerate(KINDS)}
_HOOKS = ("step_scalars",)

_CURRENT: "TFRecorder | None" = None


def current() -> "TFRecorder | None":
    """The installed recorder, if any."""
    return _CURRENT


def _observers() -> None:
    """Import the TensorFlow observers (each registers itself, with its rank)."""
    from reprobisect.runners.observers import (tf_batches, tf_evaluation, tf_keras, tf_layers,  # noqa: F401
                                               tf_optimizer)


class TFRecorder:
    """Records steps of a Keras ``fit`` or a ``tf.GradientTape`` loop into a ``TraceWriter``.

    ``install()`` wraps TensorFlow (and Keras, once it is imported: ``install_keras``);
    ``remove()`` undoes it. With ``stop_at_limit`` the recorder raises ``StopRun`` once
    ``policy.steps`` steps are written (the launcher's mode); otherwise it goes quiet.
    The attributes the launcher reads are those of the torch recorder.
    """

    def __init__(self, writer: Any, policy: RecordPolicy, *, stop_at_limit: bool = False) -> None:
        self.writer = writer
        self.policy = policy
        self.stop_at_limit = stop_at_limit
        self.step = 0
        self.done = False
        self.stop: StopRun | None = None
        self.notes: list[str] = []
        self.first_nonfinite: tuple[int, str] | None = None
        self.failed: str | None = None
        self.environment_extra: dict[str, Any] = {}
        self.backwards = 0  # GradientTape.gradient calls seen
        self.info: dict[str, Any] = {}  # the manifest's extra.tensorflow
        self.model_ref: "weakref.ref | None" = None
        self.optimizer_ref: "weakref.ref | None" = None
        self._undo: list[Callable[[], None]] = []
        self._keras = False
        self._stop_raised = False
        self._running: list[Any] = []  # the tf.functions being called (outermost first)
        self._train_fns: set[int] = set()  # ids of the tf.functions a step ended in: their next call is a step
        self._disk = 0  # bytes of full tensors kept so far (policy.max_disk)
        self._in_fit = 0  # inside model.fit: its batches come from train_step, not next()
        self._applied = 0  # steps an optimizer's apply ended since the last manual_step
        self._graph_state: dict[int, dict[str, Any]] = {}  # per FuncGraph: names, taps, seq
        self._modes: set[str] = set()
        self.record_from = 0  # a replay (runners.replay_tf): steps before it run quiet, unwritten
        self._phase: str | None = None  # inside Keras evaluate/predict: "validation", "evaluate", "predict"
        _observers()
        self.observers = {e.name: e.cls(self) for e in observer_classes("tensorflow")}
        self._on = {hook: flatten(list(self.observers.values()), hook) for hook in _HOOKS}
        self._reset_step()

    def _reset_step(self) -> None:
        self._items: list[_Item] = []
        self._occ: dict[tuple[str, str], int] = {}
        self._seq = 0
        self._fp_cache: dict[int, tuple[Any, str]] = {}
        self._batch_ids: list[int] | None = None
        self._scalars: dict[str, Any] = {}
        self._forward = 0  # input/activation/output records this step
        self._dropped = 0  # ... past policy.max_records_per_step: counted, not recorded

    @property
    def active(self) -> bool:
        return not self.done and self.failed is None

    def _unique(self, occ: dict[tuple[str, str], int], kind: str, base: str) -> str:
        return unique(occ, kind, base)

    def _keep(self, step: int | None = None) -> bool:
        return (self.step if step is None else step) in self.policy.full_steps

    def _fp(self, t: Any) -> tuple[str, dict | None, np.ndarray]:
        a = fptf.host_array(t)
        fp, st = fptf.fingerprint_array(a, self.policy.stats)
        return fp, st, a

    def _add_now(self, kind: str, name: str, t: Any, *, seq: int | None = None, module: str | None = None,
                 inputs: tuple[str, ...] | None = None) -> str:
        """Fingerprint the eager tensor ``t`` now and buffer its record; returns the fingerprint."""
        if (self.policy.sentinel and kind not in SENTINEL_KINDS) or self.step < self.record_from:
            return ""
        if kind in ("input", "activation", "output"):
            self._forward += 1
            if self._forward > self.policy.max_records_per_step:
                self._dropped += 1
                return ""
        fp, st, a = self._fp(t)
        if not isinstance(t, np.ndarray):
            self._fp_cache[id(t)] = (t, fp)
        rec = Record(name=name, kind=kind, dtype=dtype_name(a.dtype), shape=tuple(a.shape), fingerprint=fp,
                     stats=st, module=module, inputs=inputs)
        if seq is None:
            seq = self._seq
            self._seq += 1
        self._items.append(_Item(rec, seq, a if self._keep() else None))
        return fp

    # -- graph taps ----------------------------------------------------------------------------

    def _gstate(self) -> dict[str, Any]:
        g = tf_ops.get_default_graph()
        st = self._graph_state.get(id(g))
        if st is None or st["graph"]() is not g:
            st = self._graph_state[id(g)] = {"graph": weakref.ref(g), "occ": {}, "seq": 0, "taps": []}
        return st

    def _py(self, fn: Callable[..., None], tensors: list[Any], deps: list[Any] | None = None) -> list[Any]:
        """A ``tf.py_function`` calling ``fn`` with the runtime values; returns the ops made."""
        g = tf_ops.get_default_graph()
        before = len(g.get_operations())
        with tf.control_dependencies(deps or []):
            tf.py_function(fn, list(tensors), [])
        return [op for op in g.get_operations()[before:] if op.type == "EagerPyFunc"]

    def _tap(self, kind: str, base: str, ts: list[Any], *, module: str | None = None, step0: bool = False,
             named: bool = False) -> None:
        """Record ``ts`` (one record each, ``base[i]`` when several) now (eager) or at run time (graph)."""
        if self.policy.sentinel and kind not in SENTINEL_KINDS:
            return
        names_given = named
        if tf.executing_eagerly():
            if step0 and self.step != 0:
                return
            for i, t in enumerate(ts):
                b = base[i] if names_given else (base if len(ts) == 1 else f"{base}[{i}]")
                self._add_now(kind, self._unique(self._occ, kind, b), t, module=module)
            return
        if _in_xla():
            if kind == "init":  # an XLA fit records it from its callback
                return
            self.info.setdefault("not_recorded_under_xla", [])
            if kind not in self.info["not_recorded_under_xla"]:
                self.info["not_recorded_under_xla"].append(kind)
            return
        gs = self._gstate()
        entries = []
        for i, t in enumerate(ts):
            b = base[i] if names_given else (base if len(ts) == 1 else f"{base}[{i}]")
            entries.append((self._unique(gs["occ"], kind, b), gs["seq"]))
            gs["seq"] += 1

        def at_run(*values: Any) -> None:
            self.guarded("tap", self._add_values, kind, entries, values, module, step0)

        gs["taps"] += self._py(at_run, ts)

    def _add_values(self, kind: str, entries: list[tuple[str, int]], values: tuple, module: str | None,
                    step0: bool) -> None:
        if not self.active or (step0 and self.step != 0):
            return
        for (name, seq), v in zip(entries, values):
            self._add_now(kind, name, v, seq=seq, module=module)

    # -- install -----------------------------------------------------------------------------

    def _patch(self, owner: Any, attr: str, make: Callable[[Callable], Callable]) -> None:
        orig = owner.__dict__[attr]
        new = make(orig)
        new.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(owner, attr, new)
        self._undo.append(lambda: setattr(owner, attr, orig))

    def install(self) -> "TFRecorder":
        """Wrap ``GradientTape.gradient`` and ``tf.function`` calls; Keras too when it is imported."""
        global _CURRENT
        _CURRENT = self
        rec = self

        def gradient(orig: Callable) -> Callable:
            def wrapped(tape: Any, target: Any, sources: Any, *a: Any, **k: Any) -> Any:
                if rec.stop is not None:
                    rec.raise_if_stopped(begin=True)  # a deferred stop: an eager loop's next backward
                if rec.active:
                    rec.backwards += 1
                    rec.guarded("loss", rec._tap, "loss", "loss", _tensors(target))
                return orig(tape, target, sources, *a, **k)
            return wrapped

        def call(orig: Callable) -> Callable:
            def wrapped(fn: Any, *a: Any, **k: Any) -> Any:
                if rec.stop is not None and id(fn) in rec._train_fns:
                    rec.raise_if_stopped(begin=True)  # a deferred stop: the next step begins
                rec._running.append(fn)
                try:
                    out = orig(fn, *a, **k)
                finally:
                    rec._running.pop()
                if rec.stop is not None:
                    rec.raise_if_stopped()
                return out
            return wrapped

        def next_batch(orig: Callable) -> Callable:
            def wrapped(it: Any) -> Any:
                out = orig(it)
                if rec.active and tf.executing_eagerly():
                    rec.guarded("batch", rec.observers["batches"].loop_batch, it, out)
                return out
            return wrapped

        self._patch(backprop.GradientTape, "gradient", gradient)
        self._patch(iterator_ops.OwnedIterator, "__next__", next_batch)
        self._patch(polymorphic_function.Function, "__call__", call)
        if "keras.src.optimizers.base_optimizer" in sys.modules:
            try:
                install_keras(self)
            except (ImportError, AttributeError):  # Keras is still being imported: its own trigger installs it
                self._keras = False
        return self

    def remove(self) -> None:
        """Undo every wrap (newest first)."""
        global _CURRENT
        while self._undo:
            self._undo.pop()()
        self._keras = False
        if _CURRENT is self:
            _CURRENT = None

    # -- failures --------------------------------------------------------------------------------

    def _internal_error(self, where: str, e: BaseException) -> StopRun:
        if self.failed is None:
            self.failed = f"{where}: {type(e).__name__}: {e}"
            detail = (f"reprobisect's recorder failed at step {self.step} ({self.failed}); a reprobisect bug, "
                      "not your program's: this probe is no evidence either way")
            self.notes.append(detail)
            print(f"reprobisect: {detail}", file=sys.stderr)
            self.done = True
            self.stop = StopRun("recorder_error", self.step, detail, traceback.format_exc())
        assert self.stop is not None
        return self.stop

    def guarded(self, where: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(...)``; its failure is the recorder's own: noted, the run stopped as ``infra``
        at the next safe point (never raised here: this may run inside a ``tf.py_function``)."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # StopRun / KeyboardInterrupt are BaseExceptions: they pass
            self._internal_error(where, e)
            return None

    def raise_if_stopped(self, *, begin: bool = False) -> None:
        """Raise the recorder's ``StopRun`` at a safe point (eager Python, never inside a graph
        or a ``tf.py_function``); once, like the torch recorder: a program that swallows it
        runs on unrecorded. With ``policy.defer_stop`` (``bisect resume``'s preemption) the stop
        after the last step waits for a point where the next step begins (``begin``: a call of a
        tf.function a step ended in, a training forward, an optimizer's apply), so the step's own
        code after the update (the checkpoint save) runs first, as it does for torch."""
        deferred = self.policy.defer_stop and self.stop is not None and self.stop.reason == "ok"
        if deferred and not begin:
            return
        if self.stop is not None and self.stop_at_limit and not self._stop_raised and tf.executing_eagerly():
            self._stop_raised = True
            raise self.stop

    # -- the end of a step -------------------------------------------------------------------------

    def _end_step(self, pre: _Apply, params: list[Any], opt_names: list[str], opt_values: list[Any], lr: Any,
                  gnorm: Any = None) -> None:
        if not self.active:
            return
        batches = self.observers["batches"]
        if batches.pending and not any(it.rec.kind == "batch" for it in self._items):
            batches.claim(last_only=True)
        for n, v in zip(pre.names, params):
            self._add_now("param", n, v)
        if not self.policy.sentinel:
            for n, v in zip(opt_names, opt_values):
                self._add_now("optim_state", n, v)
        if pre.opt is not None:
            self._applied += 1
        self.write_step(lr=lr, none_names=pre.none_names, n_vars=len(pre.names), gnorm=gnorm)
        if self.policy.wants_state(self.step - 1) and self.step > self.record_from:
            self._capture_state(self.step - 1, pre.opt, pre.variables)
        self._train_fns.update(id(f) for f in self._running)
        self._check_stop()

    def write_step(self, *, lr: Any = None, none_names: list[str] = (), n_vars: int = 0, gnorm: Any = None) -> None:
        """Write the buffered records as step ``self.step`` (chain order) and start the next."""
        if self.step < self.record_from:  # a replay's quiet step: counted, not written
            self.step += 1
            self._reset_step()
            self.observers["evaluation"].take()
            return
        items = sorted(self._items, key=lambda it: (_KIND_RANK[it.rec.kind], it.seq))
        scalars = self._step_scalars(items, lr, none_names, n_vars)
        for add in self._on["step_scalars"]:  # (evaluation)
            add(scalars)
        if gnorm is not None and "grad_norm" not in scalars:
            scalars["grad_norm"] = json_float(float(fptf.host_array(gnorm)))
        if self._dropped:
            scalars["records_dropped"] = self._dropped
            scalars["max_records_per_step"] = self.policy.max_records_per_step
        kept = sum(it.array.nbytes for it in items if it.array is not None)
        if kept and self.policy.max_disk is not None and self._disk + kept > self.policy.max_disk:
            self.notes.append(f"full tensors of step {self.step} not kept: --max-disk {self.policy.max_disk} bytes "
                              "would be exceeded (fingerprints and stats are recorded)")
            items = [_Item(it.rec, it.seq) for it in items]
            kept = 0
        self._disk += kept
        self.writer.begin_step(self.step)
        for it in items:
            self.writer.record(it.rec, it.array)
        self.writer.end_step(scalars, batch_ids=self._batch_ids)
        self.step += 1
        self._reset_step()

    def _step_scalars(self, items: list[_Item], lr: Any, none_names: list[str], n_vars: int) -> dict[str, Any]:
        s = loss_scalars([it.rec for it in items if it.rec.kind == "loss"], each=False)
        norms = [it.rec.stat("norm") for it in items if it.rec.kind == "grad"]
        if norms and all(n is not None for n in norms):
            s["grad_norm"] = json_float(math.sqrt(sum(n * n for n in norms)))  # type: ignore[operator]
        if lr is not None:
            a = fptf.host_array(lr)
            s["lr"] = [json_float(float(a))] if a.size == 1 else None
        if none_names:
            s["none_grad_variables"] = list(none_names)
            s["no_grad_params"] = list(none_names)
            if n_vars and len(none_names) == n_vars:
                s["no_gradients"] = True
        if self._modes:
            s["mode"] = "+".join(sorted(self._modes))
        s.update(self._scalars)
        bad = first_nonfinite(it.rec for it in items)
        if bad:
            s["first_nonfinite"] = bad
            if self.first_nonfinite is None:
                self.first_nonfinite = (self.step, bad)
        return s

    def _check_stop(self) -> None:
        step = self.step - 1
        if self.first_nonfinite is not None and self.first_nonfinite[0] == step and self.policy.stop_on_nonfinite:
            self._finish(StopRun("nonfinite", step, f"first non-finite value at step {step}: {self.first_nonfinite[1]}"))
        elif self.step >= self.policy.steps:
            self._finish(StopRun("ok", step, f"recorded {self.step} step(s)"))

    def _finish(self, stop: StopRun) -> None:
        self.done = True
        self.stop = stop  # raised by the caller's next safe point (raise_if_stopped, a tf.function's return)

    def _capture_state(self, step: int, opt: Any, variables: list[Any]) -> None:
        from reprobisect.runners.tf_state import capture_state

        model = self.model_ref() if self.model_ref is not None else None
        capture_state(self.writer, step, model=model, variables=variables if model is None else None, optimizer=opt,
                      position=self.observers["keras"].fit_position)

    # -- an explicit step (reprobisect.tensorflow) ------------------------------------------------

    def manual_step(self, *, loss: Any = None, grads: Any = None, variables: Any = None, lr: Any = None) -> bool:
        """End a step by hand after an update the recorder cannot see (``v.assign_sub(lr * g)``):
        ``loss`` unless ``GradientTape.gradient`` recorded one, ``grads`` (aligned with
        ``variables``; ``None`` entries are findings) and ``variables`` after the update.
        Returns False, recording nothing, when the recorder is done or an optimizer's
        ``apply`` already ended a step since the last call."""
        return self.observers["optimizer"].manual_step(loss=loss, grads=grads, variables=variables, lr=lr)

    # -- the launcher's interface -------------------------------------------------------------------

    seed_source = "tf.random.set_seed"
    stop_class = StopRun

    @property
    def seed(self) -> Any:
        """TensorFlow's global seed as the program left it (``tf.random.set_seed``, which
        ``keras.utils.set_random_seed`` calls), or None; read without drawing an op seed."""
        try:
            return context.global_seed()
        except Exception:
            return None

    @property
    def manifest_extra(self) -> dict[str, Any]:
        return {"tensorflow": dict(self.info)} if self.info else {}

    def finish_manual(self) -> None:
        """Nothing to finish: every TF step ends at the optimizer's ``apply``."""

    def shutdown_loaders(self) -> None:
        """No worker processes of ours to stop."""

    def evaluation_after_last_step(self) -> list[dict[str, Any]]:
        """Evaluation that ran after the last written step (a validation after the last epoch), as JSON."""
        return self.observers["evaluation"].take() if self.step > self.record_from else []

    def no_steps_detail(self) -> str:
        if "xla" in self.info and "mode" in self.info and "xla" in self.info["mode"]:
            return ("the training step ran inside an XLA-compiled function (jit_compile=True), which the recorder "
                    "cannot tap; run it without jit_compile to record it")
        if self.backwards:
            return (f"GradientTape.gradient ran {self.backwards} time(s) but no Keras optimizer applied an update; "
                    "record a loop that updates variables by hand with reprobisect.tensorflow.record(...).step(...)")
        return "no GradientTape.gradient and no optimizer update ran (does the script train, e.g. call model.fit?)"
