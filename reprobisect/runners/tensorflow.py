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
function or the script's own).
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.eager import backprop, context, record as tape_record
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

from reprobisect.errors import UsageError
from reprobisect.runners import fingerprint_tf as fptf
from reprobisect.trace import record_array
from reprobisect.trace.fingerprint import dtype_name
from reprobisect.runners.policy import RecordPolicy, StopRun
from reprobisect.trace.format import KINDS, SENTINEL_KINDS, Record

__all__ = ["RecordPolicy", "StopRun", "TFRecorder", "current", "install_keras"]

_KIND_RANK = {k: i for i, k in enumerate(KINDS)}
_MAX_ID_BYTES = 256 << 20  # the rows of a batch source indexed by content up to this size
_ROW_KEEPING = {f"{n}Dataset" for n in ("Batch", "Shuffle", "Prefetch", "Repeat", "Take", "Skip", "Cache", "Options",
                                        "ParallelBatch")}  # tf.data steps that keep rows as they are
_XLA_LAYERS = "not recorded: XLA (jit_compile=True)"
_EVAL_OUTPUTS = 16  # outputs fingerprinted per evaluation run (as the torch recorder)
_GRAPH_LAYERS = "not recorded: graph mode (run_eagerly=False); the model's input and output are"


@dataclass
class _Item:
    rec: Record
    seq: int
    array: np.ndarray | None = None


@dataclass
class _Apply:
    """What the optimizer's ``apply`` was given (before the update)."""

    opt: Any
    variables: list[Any]
    names: list[str]
    none_names: list[str]
    lr: Any
    graph: bool
    gnorm: Any = None  # sentinel detail: the gradients' total norm (no per-gradient records)


_CURRENT: "TFRecorder | None" = None
_XLA_CALLBACK: Any = None  # the Keras callback class of an XLA fit (made when Keras is wrapped)


def current() -> "TFRecorder | None":
    """The installed recorder, if any."""
    return _CURRENT


def _var_name(v: Any) -> str:
    path = getattr(v, "path", None)
    if isinstance(path, str) and path:
        return path
    name = str(getattr(v, "name", "variable"))
    return name[:-2] if name.endswith(":0") else name


def _is_tensor(x: Any) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype != tf.string and x.dtype != tf.resource \
        and x.dtype != tf.variant


def _tensors(obj: Any) -> list[Any]:
    try:
        flat = tf.nest.flatten(obj)
    except Exception:
        return []
    return [t for t in flat if _is_tensor(t)]


def _in_xla() -> bool:
    try:
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))
    except Exception:
        return False


def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")



def _fit_position(x: Any, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """What only ``fit``'s arguments tell of the data position (steps per epoch, shuffle) for
    ``tf_state.capture_state``; None when ``x`` has no length (a dataset, a generator)."""
    n = kwargs.get("steps_per_epoch")
    if n is None:
        try:
            rows = len(x)
        except TypeError:
            return None
        rows = int(int(rows) * (1.0 - float(kwargs.get("validation_split") or 0.0)))  # Keras' split point
        batch = kwargs.get("batch_size", args[2] if len(args) > 2 else None) or 32  # Keras' default batch size
        n = -(-int(rows) // int(batch))
    return {"steps_per_epoch": int(n), "shuffle": bool(kwargs.get("shuffle", True))}

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
        self._stack: list[tuple[Any, bool]] = []
        self._apply_depth = 0
        self._stop_raised = False
        self._disk = 0  # bytes of full tensors kept so far (policy.max_disk)
        self._in_fit = 0  # inside model.fit: its batches come from train_step, not next()
        self._pending: list[tuple[Any, Any]] = []  # batches drawn by a custom loop, not yet used
        self._loop_index: dict[int, tuple[Any, Any]] = {}
        self._applied = 0  # steps an optimizer's apply ended since the last manual_step
        self._graph_state: dict[int, dict[str, Any]] = {}  # per FuncGraph: names, taps, seq
        self._none_seen: set[str] = set()
        self._modes: set[str] = set()
        self.record_from = 0  # a replay (runners.replay_tf): steps before it run quiet, unwritten
        self._phase: str | None = None  # inside Keras evaluate/predict: "validation", "evaluate", "predict"
        self._eval_runs: list[dict[str, Any]] = []  # evaluation since the last step ended (scalars["eval"])
        self._eval_cur: dict[str, Any] | None = None
        self._eval_index: tuple[Any, "_RowIndex | None"] = (None, None)  # (x of evaluate/predict, its row index)
        self._reset_step()

    # -- buffer ------------------------------------------------------------------------------

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
        k = occ.get((kind, base), 0)
        occ[(kind, base)] = k + 1
        return base if k == 0 else f"{base}#{k}"

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

    def _cached_fp(self, t: Any) -> str:
        hit = self._fp_cache.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        fp, _, _ = self._fp(t)
        self._fp_cache[id(t)] = (t, fp)
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
                if rec.active:
                    rec.backwards += 1
                    rec.guarded("loss", rec._tap, "loss", "loss", _tensors(target))
                return orig(tape, target, sources, *a, **k)
            return wrapped

        def call(orig: Callable) -> Callable:
            def wrapped(fn: Any, *a: Any, **k: Any) -> Any:
                out = orig(fn, *a, **k)
                if rec.stop is not None:
                    rec.raise_if_stopped()
                return out
            return wrapped

        def next_batch(orig: Callable) -> Callable:
            def wrapped(it: Any) -> Any:
                out = orig(it)
                if rec.active and tf.executing_eagerly():
                    rec.guarded("batch", rec.loop_batch, it, out)
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

    def raise_if_stopped(self) -> None:
        """Raise the recorder's ``StopRun`` at a safe point (eager Python, never inside a graph
        or a ``tf.py_function``); once, like the torch recorder: a program that swallows it
        runs on unrecorded."""
        if self.stop is not None and self.stop_at_limit and not self._stop_raised and tf.executing_eagerly():
            self._stop_raised = True
            raise self.stop

    # -- layers ------------------------------------------------------------------------------

    def layer_call(self, orig: Callable, layer: Any, args: tuple, kwargs: dict) -> Any:
        if not self.active:
            return orig(layer, *args, **kwargs)
        self.raise_if_stopped()
        top = not self._stack
        training = tape_record.could_possibly_record() if top else self._stack[-1][1]
        if top and tf.executing_eagerly() and self._pending and not training:
            self._pending.clear()  # drawn for an evaluation forward
        if not training:
            self._stack.append((layer, False))
            try:
                out = orig(layer, *args, **kwargs)
            finally:
                self._stack.pop()
            if top:  # evaluation (validation, evaluate, predict, a forward with no tape): summarised
                self.guarded("eval", self._eval_forward, _tensors(out))
            return out
        name = ".".join([str(lay.name) for lay, _ in self._stack[1:]] + [str(layer.name)])
        eager = tf.executing_eagerly()
        ins: list[Any] = _tensors((args, kwargs)) if (top or eager) else []
        if top:
            self._root(layer, eager)
            if eager and self._pending:
                self.guarded("batch", self.claim_batches)
            self.guarded("input", self._tap, "input", "input", ins)
        self._stack.append((layer, True))
        try:
            out = orig(layer, *args, **kwargs)
        finally:
            self._stack.pop()
        outs = _tensors(out)
        if top:
            self.guarded("output", self._tap, "output", "output", outs, module=type(layer).__name__)
        elif eager:
            self.guarded("activation", self._activation, name, layer, ins, outs)
        return out

    def _root(self, layer: Any, eager: bool) -> None:
        if self.model_ref is None or self.model_ref() is None:
            self.model_ref = weakref.ref(layer)
        mode = "eager" if eager else ("xla" if _in_xla() else "graph")
        self._modes.add(mode)
        self.info["mode"] = "+".join(sorted(self._modes))
        if mode == "xla":
            self.info["layer_outputs"] = _XLA_LAYERS
        elif not eager:
            self.info["layer_outputs"] = _GRAPH_LAYERS + " recorded"
        elif "layer_outputs" not in self.info:
            self.info["layer_outputs"] = "recorded (eager)"

    def _activation(self, name: str, layer: Any, ins: list[Any], outs: list[Any]) -> None:
        if self.policy.sentinel or not outs:
            return
        call = self._unique(self._occ, "activation", name)
        inputs = tuple(self._cached_fp(t) for t in ins)
        cls = type(layer).__name__
        for i, t in enumerate(outs):
            self._add_now("activation", call if len(outs) == 1 else f"{call}[{i}]", t, module=cls, inputs=inputs)

    # -- optimizer -------------------------------------------------------------------------------

    def optimizer_apply(self, orig: Callable, opt: Any, grads: Any, variables: Any) -> Any:
        if not self.active or self._apply_depth:
            return orig(opt, grads, variables)
        self.raise_if_stopped()
        self._apply_depth += 1
        try:
            grads = list(grads)
            variables = list(variables) if variables is not None else None
            pre = self.guarded("apply", self._before_apply, opt, grads, variables)
            out = orig(opt, grads, variables)
            if pre is not None and self.active:
                self.guarded("apply", self._after_apply, pre)
        finally:
            self._apply_depth -= 1
        self.raise_if_stopped()
        return out

    def _before_apply(self, opt: Any, grads: list[Any], variables: list[Any] | None) -> _Apply:
        if variables is None:
            variables = list(getattr(opt, "_trainable_variables", []) or [])
        self.optimizer_ref = weakref.ref(opt)
        names: list[str] = []
        occ: dict[tuple[str, str], int] = {}
        for v in variables:
            names.append(self._unique(occ, "param", _var_name(v)))
        none_names = [n for n, g in zip(names, grads) if g is None]
        if none_names:
            self._warn_none(none_names, len(none_names) == len(names))
        try:
            lr = tf.convert_to_tensor(opt.learning_rate)
        except Exception:
            lr = None
        graph = not tf.executing_eagerly()
        pre = _Apply(opt, variables, names, none_names, lr, graph)
        if self.step == 0 or graph:
            self._tap("init", names, [_read(v) for v in variables], step0=True, named=True)
        have = [(n, g) for n, g in zip(names, grads) if g is not None]
        self._tap("grad", [n for n, _ in have], [_dense(g) for _, g in have], named=True)
        if self.policy.sentinel and have:
            pre.gnorm = _total_norm([_dense(g) for _, g in have])
        return pre

    def _warn_none(self, names: list[str], all_none: bool) -> None:
        new = [n for n in names if n not in self._none_seen]
        self._none_seen.update(names)
        self.info["none_gradients"] = {"variables": sorted(self._none_seen),
                                       "first_step": self.info.get("none_gradients", {}).get("first_step", self.step)}
        if new:
            what = "no variable had a gradient" if all_none else f"{len(names)} variable(s) had no gradient"
            print(f"reprobisect: warning: {what} (None) at step {self.step}: {', '.join(names)} "
                  "(used outside the tape, a NumPy round trip, or an unused branch?); recorded in the trace",
                  file=sys.stderr)

    def _after_apply(self, pre: _Apply) -> None:
        opt_vars = [v for v in getattr(pre.opt, "variables", [])]
        opt_names: list[str] = []
        occ: dict[tuple[str, str], int] = {}
        for v in opt_vars:
            opt_names.append(self._unique(occ, "optim_state", _var_name(v)))
        if not pre.graph:
            self._end_step(pre, [_read(v) for v in pre.variables], opt_names, [_read(v) for v in opt_vars], pre.lr,
                           pre.gnorm)
            return
        if _in_xla():
            self.info.setdefault("xla", "inside an XLA-compiled function (jit_compile=True) the step is not recorded; "
                                        "run it without jit_compile to record it")
            return
        gs = self._gstate()
        params = [_read(v) for v in pre.variables]
        ostate = [_read(v) for v in opt_vars] if not self.policy.sentinel else []
        scalars = [x for x in (pre.lr, pre.gnorm) if x is not None]
        n_p, n_o = len(params), len(ostate)

        def at_run(*values: Any) -> None:
            rest = iter(values[n_p + n_o:])
            lr = next(rest) if pre.lr is not None else None
            gnorm = next(rest) if pre.gnorm is not None else None
            self.guarded("step", self._end_step, pre, list(values[:n_p]), opt_names if ostate else [],
                         list(values[n_p:n_p + n_o]), lr, gnorm)

        taps, gs["taps"] = gs["taps"], []
        self._py(at_run, params + ostate + scalars, deps=taps)

    # -- the end of a step -------------------------------------------------------------------------

    def _end_step(self, pre: _Apply, params: list[Any], opt_names: list[str], opt_values: list[Any], lr: Any,
                  gnorm: Any = None) -> None:
        if not self.active:
            return
        if self._pending and not any(it.rec.kind == "batch" for it in self._items):
            self.claim_batches(last_only=True)
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
        self._check_stop()

    def write_step(self, *, lr: Any = None, none_names: list[str] = (), n_vars: int = 0, gnorm: Any = None) -> None:
        """Write the buffered records as step ``self.step`` (chain order) and start the next."""
        if self.step < self.record_from:  # a replay's quiet step: counted, not written
            self.step += 1
            self._reset_step()
            self._take_eval()
            return
        items = sorted(self._items, key=lambda it: (_KIND_RANK[it.rec.kind], it.seq))
        scalars = self._step_scalars(items, lr, none_names, n_vars)
        ev = self._take_eval()
        if ev:
            scalars["eval"] = ev
        if gnorm is not None and "grad_norm" not in scalars:
            scalars["grad_norm"] = _json_float(float(fptf.host_array(gnorm)))
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
        s: dict[str, Any] = {}
        losses = [it.rec for it in items if it.rec.kind == "loss"]
        if losses and all(r.stats is not None and r.shape == () for r in losses):
            s["loss"] = losses[0].stats["mean"] if len(losses) == 1 else _json_float(
                math.fsum(r.stat("mean") for r in losses))  # type: ignore[index,misc]
        norms = [it.rec.stat("norm") for it in items if it.rec.kind == "grad"]
        if norms and all(n is not None for n in norms):
            s["grad_norm"] = _json_float(math.sqrt(sum(n * n for n in norms)))  # type: ignore[operator]
        if lr is not None:
            a = fptf.host_array(lr)
            s["lr"] = [_json_float(float(a))] if a.size == 1 else None
        if none_names:
            s["none_grad_variables"] = list(none_names)
            s["no_grad_params"] = list(none_names)
            if n_vars and len(none_names) == n_vars:
                s["no_gradients"] = True
        if self._modes:
            s["mode"] = "+".join(sorted(self._modes))
        s.update(self._scalars)
        bad = next((f"{it.rec.kind} '{it.rec.name}'" for it in items
                    if it.rec.stats and (it.rec.stats.get("nan") or it.rec.stats.get("inf"))), None)
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
                      position=self._fit_position)

    # -- an explicit step (reprobisect.tensorflow) ------------------------------------------------

    def manual_step(self, *, loss: Any = None, grads: Any = None, variables: Any = None, lr: Any = None) -> bool:
        """End a step by hand after an update the recorder cannot see (``v.assign_sub(lr * g)``):
        ``loss`` unless ``GradientTape.gradient`` recorded one, ``grads`` (aligned with
        ``variables``; ``None`` entries are findings) and ``variables`` after the update.
        Returns False, recording nothing, when the recorder is done or an optimizer's
        ``apply`` already ended a step since the last call."""
        if not tf.executing_eagerly():
            raise UsageError("reprobisect.tensorflow: rec.step() records eager values; call it outside tf.function")
        applied, self._applied = self._applied, 0
        if not self.active or applied:
            return False
        variables = list(variables or [])
        grads = list(grads) if grads is not None else []
        occ: dict[tuple[str, str], int] = {}
        names = [self._unique(occ, "param", _var_name(v)) for v in variables]
        if loss is not None and not any(it.rec.kind == "loss" for it in self._items):
            self._tap("loss", "loss", _tensors(loss))
        none_names = [n for n, g in zip(names, grads) if g is None]
        if none_names:
            self._warn_none(none_names, len(none_names) == len(names))
        have = [(n, g) for n, g in zip(names, grads) if g is not None]
        self._tap("grad", [n for n, _ in have], [_dense(g) for _, g in have], named=True)
        pre = _Apply(None, variables, names, none_names, lr, False)
        if self.policy.sentinel and have:
            pre.gnorm = _total_norm([_dense(g) for _, g in have])
        self._end_step(pre, [_read(v) for v in variables], [], [], lr, pre.gnorm)
        return True

    # -- fit -------------------------------------------------------------------------------------

    def before_fit(self, model: Any, args: tuple, kwargs: dict) -> None:
        """Note the mode, wrap ``train_step`` on the instance, index a NumPy ``x`` by row."""
        self.model_ref = weakref.ref(model)
        if os.environ.get("REPROBISECT_TF_EAGER") == "1" and not model.run_eagerly:
            model.run_eagerly = True
            self.info["forced_eager"] = "REPROBISECT_TF_EAGER=1: fit ran eagerly (run_eagerly=True) for full detail"
        self.info["run_eagerly"] = bool(model.run_eagerly)
        jit = bool(getattr(model, "jit_compile", False)) and not model.run_eagerly
        self.info["jit_compile"] = jit
        if not model.run_eagerly:
            self.info["layer_outputs"] = _GRAPH_LAYERS + " recorded"
        x = args[0] if args else kwargs.get("x")
        self._ids = _RowIndex.of(x)
        self._fit_position = _fit_position(x, args, kwargs)
        prev, why = self.info.get("batch_ids"), self._ids.why
        self.info["batch_ids"] = why if prev is None or why in prev else f"{prev}; a later fit: {why}"
        if jit:
            self._xla_fit(model, args, kwargs)
        ts = model.__dict__.get("train_step")
        if ts is None or not getattr(ts, "_reprobisect", False):
            inner = model.train_step
            rec = self

            def train_step(data: Any) -> Any:
                if rec.active:
                    rec.guarded("batch", rec._batch, data)
                return inner(data)

            train_step._reprobisect = True  # type: ignore[attr-defined]
            object.__setattr__(model, "train_step", train_step)

    _fit_position: dict[str, Any] | None = None

    def _xla_fit(self, model: Any, args: tuple, kwargs: dict) -> None:
        """``fit`` under XLA: no tap can run inside the compiled step; a callback records the
        variables after each step, the optimizer variables and the learning rate instead."""
        self.info["layer_outputs"] = _XLA_LAYERS
        self.info["batch_ids"] = "not recorded: XLA (jit_compile=True)"
        self.info["xla"] = ("jit_compile=True: batch, input, output, loss and gradients are not recorded (no tap runs "
                            "inside an XLA-compiled step); the variables before the first step and after each step, "
                            "optimizer variables and the learning rate (as after the step) are, from a callback")
        if len(args) > 5:  # callbacks given by position: leave the call alone
            self.info["xla"] = "jit_compile=True and callbacks given by position: steps are not recorded"
            return
        callbacks = list(kwargs.get("callbacks") or [])
        callbacks.append(_XLA_CALLBACK(self, model))
        kwargs["callbacks"] = callbacks

    def xla_batch_end(self, model: Any) -> None:
        """A training batch of an XLA ``fit`` ended (``_XLA_CALLBACK``): record it as a step."""
        if not self.active:
            return
        opt = model.optimizer
        variables = list(model.trainable_variables)
        occ: dict[tuple[str, str], int] = {}
        names = [self._unique(occ, "param", _var_name(v)) for v in variables]
        opt_vars = list(getattr(opt, "variables", []))
        occ = {}
        opt_names = [self._unique(occ, "optim_state", _var_name(v)) for v in opt_vars]
        self._modes.add("xla")
        self.info["mode"] = "+".join(sorted(self._modes))
        pre = _Apply(opt, variables, names, [], tf.convert_to_tensor(opt.learning_rate), False)
        self._end_step(pre, [_read(v) for v in variables], opt_names, [_read(v) for v in opt_vars], pre.lr)

    def _batch(self, data: Any) -> None:
        ts = _tensors(data)
        if ts and tf.executing_eagerly():
            self._fit_ids(ts[0], None)
        elif ts and not _in_xla():  # the index is looked up when the step runs: a later fit reuses this graph
            gs = self._gstate()
            seq = gs["seq"]
            gs["seq"] += 1
            gs["taps"] += self._py(lambda v: self.guarded("ids", self._fit_ids, v, seq), [ts[0]])
        self._tap("batch", "data", ts)

    def _fit_ids(self, x: Any, seq: int | None) -> None:
        index = getattr(self, "_ids", None)  # of the fit running now
        if index is not None and index.index is not None:
            self._add_ids(fptf.host_array(x), seq, index)

    def _add_ids(self, x: np.ndarray, seq: int | None, index: "_RowIndex") -> None:
        if not self.active:
            return
        ids = index.lookup(x)
        if ids is None:
            self._scalars["batch_ids"] = "not derivable: a batch row is not among the source's rows"
            return
        self._batch_ids = ids.tolist()
        self._add_now("batch", self._unique(self._occ, "batch", "ids"), ids, seq=seq)

    # -- batches of a custom loop (tf.data iterators) ------------------------------------------------

    def loop_batch(self, it: Any, out: Any) -> None:
        """An eager ``next()`` on a ``tf.data`` iterator outside ``fit``: the batch waits for the
        training forward that uses it (an evaluation forward drops it)."""
        if self._in_fit or not self.active:
            return
        ds = getattr(it, "_dataset", None)
        hit = self._loop_index.get(id(it))
        if hit is None or hit[0]() is not it:
            hit = (weakref.ref(it), _RowIndex.of(ds))
            self._loop_index[id(it)] = hit
        self._pending.append((out, hit[1]))
        del self._pending[:-16]

    def claim_batches(self, last_only: bool = False) -> None:
        """Record the waiting batches as this step's ``batch`` records (``last_only``: the one
        drawn last, for a step whose forward ran in a graph, unseen in Python)."""
        pending, self._pending = (self._pending[-1:] if last_only else self._pending), []
        for out, index in pending:
            ts = _tensors(out)
            self.info["batch_ids"] = index.why
            if index.index is not None and ts:
                self._add_ids(fptf.host_array(ts[0]), None, index)
            self._tap("batch", "data", ts)

    # -- evaluation: validation, evaluate, predict, forwards with no tape ---------------------------

    def _eval_run(self) -> dict[str, Any]:
        """The evaluation run under way (consecutive evaluation of one phase)."""
        phase = self._phase or "no_tape"
        cur = self._eval_cur
        if cur is None or cur["phase"] != phase:
            cur = {"phase": phase, "after_step": self.step - 1 if self.step else None, "forwards": 0, "batches": 0,
                   "ids": [], "ids_known": True, "outputs": []}
            self._eval_runs.append(cur)
            self._eval_cur = cur
        return cur

    def _eval_forward(self, outs: list[Any]) -> None:
        """A forward of a root layer with no tape recording: counted, its outputs fingerprinted
        (the first ``_EVAL_OUTPUTS`` of the run), now (eager) or when the graph runs."""
        if not outs or not self.active:
            return
        if tf.executing_eagerly():
            self._eval_values(tuple(outs))
        elif not _in_xla():
            self._py(lambda *v: self.guarded("eval", self._eval_values, v), outs)
        else:
            self.info["evaluation"] = "not summarised under XLA (jit_compile=True)"

    def _eval_values(self, values: tuple) -> None:
        if not self.active:
            return
        run = self._eval_run()
        run["forwards"] += 1
        for v in values:
            if len(run["outputs"]) < _EVAL_OUTPUTS:
                run["outputs"].append(fptf.fingerprint_array(fptf.host_array(v), False)[0])

    def before_eval(self, model: Any, phase: str, x: Any) -> None:
        """Keras ``evaluate`` (``validation`` inside ``fit``) or ``predict`` begins: note the
        phase, index ``x`` by row (sample IDs), wrap the model's test/predict step once."""
        if self._eval_index[0] is not x:
            index = _RowIndex.of(x)
            self._eval_index = (x, index if index.index is not None else None)
        for attr in ("test_step", "predict_step"):
            st = model.__dict__.get(attr)
            if st is not None and getattr(st, "_reprobisect", False):
                continue
            inner = getattr(model, attr)
            rec = self

            def step(data: Any, _inner: Callable = inner) -> Any:
                if rec.active and rec._phase is not None:
                    rec.guarded("eval batch", rec._eval_batch, data)
                return _inner(data)

            step._reprobisect = True  # type: ignore[attr-defined]
            object.__setattr__(model, attr, step)

    def _eval_batch(self, data: Any) -> None:
        ts = _tensors(data)
        if not ts:
            return
        if tf.executing_eagerly():
            self._eval_ids(ts[0])
        elif not _in_xla():
            self._py(lambda v: self.guarded("eval batch", self._eval_ids, v), [ts[0]])

    def _eval_ids(self, x: Any) -> None:
        if not self.active:
            return
        run = self._eval_run()
        run["batches"] += 1
        index = self._eval_index[1]
        ids = index.lookup(fptf.host_array(x)) if index is not None else None
        if ids is None:
            run["ids_known"] = False
        else:
            run["ids"].append(ids)

    def _take_eval(self) -> list[dict[str, Any]]:
        """The evaluation since the last step, as JSON (``scalars["eval"]``), and forget it."""
        runs, self._eval_runs, self._eval_cur = self._eval_runs, [], None
        out = []
        for r in runs:
            ids = np.concatenate(r["ids"]) if r["ids"] and r["ids_known"] else None
            outs = r["outputs"]
            out.append({
                "phase": r["phase"],
                "after_step": r["after_step"],
                "forwards": r["forwards"],
                "batches": r["batches"],
                "samples": int(ids.size) if ids is not None else None,
                "ids_fingerprint": record_array("ids", "batch", ids).fingerprint if ids is not None else None,
                "outputs_fingerprint": hashlib.sha256("\n".join(outs).encode()).hexdigest()[:32] if outs else None,
                "outputs_fingerprinted": len(outs),
            })
        return out

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
        return self._take_eval() if self.step > self.record_from else []

    def no_steps_detail(self) -> str:
        if "xla" in self.info and "mode" in self.info and "xla" in self.info["mode"]:
            return ("the training step ran inside an XLA-compiled function (jit_compile=True), which the recorder "
                    "cannot tap; run it without jit_compile to record it")
        if self.backwards:
            return (f"GradientTape.gradient ran {self.backwards} time(s) but no Keras optimizer applied an update; "
                    "record a loop that updates variables by hand with reprobisect.tensorflow.record(...).step(...)")
        return "no GradientTape.gradient and no optimizer update ran (does the script train, e.g. call model.fit?)"


class _RowIndex:
    """The rows of the NumPy ``x`` given to ``fit``, by content: batch rows -> sample IDs."""

    def __init__(self, x: np.ndarray | None, why: str) -> None:
        self.x = x
        self.why = why
        self.index: dict[bytes, int] | None = None
        if x is not None:
            index: dict[bytes, int] = {}
            flat = np.ascontiguousarray(x).reshape(len(x), -1)
            for i in range(len(flat)):
                index.setdefault(flat[i].tobytes(), i)
            if len(index) < len(flat):
                self.why = "not derivable: the rows of x are not unique"
            else:
                self.index = index

    @classmethod
    def of(cls, x: Any) -> "_RowIndex":
        if isinstance(x, np.ndarray) and x.ndim >= 1 and len(x):
            if x.nbytes > _MAX_ID_BYTES:
                return cls(None, f"not derived: x is larger than {_MAX_ID_BYTES >> 20} MiB")
            return cls(x, "derived: each batch row matched to the row of the NumPy x given to fit (Keras' own order)")
        if x is not None and hasattr(x, "_variant_tensor"):  # a tf.data.Dataset
            return cls._of_dataset(x)
        kind = type(x).__name__
        return cls(None, f"not derivable: fit was given a {kind}, not one NumPy array (batch content is recorded)")

    @classmethod
    def _of_dataset(cls, ds: Any) -> "_RowIndex":
        """Trace ``from_tensor_slices(...)`` through shuffle/batch/repeat/prefetch/take/skip/cache
        back to its first component: the rows a batch is matched against."""
        d = ds
        for _ in range(64):
            name = type(d).__name__.lstrip("_")
            if name == "TensorSliceDataset":
                try:
                    x = fptf.host_array(d._tensors[0])
                except Exception:
                    break
                if x.ndim < 1 or x.nbytes > _MAX_ID_BYTES:
                    break
                return cls(x, "derived: each batch row matched to the row of the tf.data.Dataset.from_tensor_slices "
                              "source (the pipeline's own order)")
            if name not in _ROW_KEEPING or getattr(d, "_input_dataset", None) is None:
                return cls(None, f"not derivable: the tf.data pipeline has a {name} (IDs are traced through "
                                 "from_tensor_slices + shuffle/batch/repeat/prefetch/take/skip/cache only; "
                                 "batch content is recorded)")
            d = d._input_dataset
        return cls(None, "not derivable: the tf.data pipeline could not be traced back to its rows "
                         "(batch content is recorded)")

    def lookup(self, batch: np.ndarray) -> np.ndarray | None:
        assert self.index is not None and self.x is not None
        if batch.dtype != self.x.dtype:
            batch = batch.astype(self.x.dtype)
        flat = np.ascontiguousarray(batch).reshape(len(batch), -1)
        out = np.empty(len(flat), dtype=np.int64)
        for i in range(len(flat)):
            j = self.index.get(flat[i].tobytes())
            if j is None:
                return None
            out[i] = j
        return out


def _read(v: Any) -> Any:
    value = getattr(v, "value", None)
    if value is not None and not callable(value) and hasattr(value, "read_value"):
        return value.read_value()
    if hasattr(v, "read_value"):
        return v.read_value()
    return tf.convert_to_tensor(v)


def _total_norm(grads: list[Any]) -> Any:
    """The gradients' total 2-norm, accumulated in float64."""
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64))) for g in grads]))


def _dense(g: Any) -> Any:
    if isinstance(g, tf.IndexedSlices):
        return tf.convert_to_tensor(g)
    return g


def install_keras(rec: TFRecorder) -> None:
    """Wrap Keras (``Layer.__call__``, the optimizers' ``apply``, ``fit``) for ``rec``; once."""
    if rec._keras:
        return
    from keras.src import backend as kbackend

    if kbackend.backend() != "tensorflow":
        rec.info["keras"] = (f"Keras backend '{kbackend.backend()}': Keras layers and optimizers are not recorded "
                             "(only the TensorFlow backend is)")
        rec._keras = True
        return
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.layers.layer import Layer
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    rec._keras = True
    global _XLA_CALLBACK
    from keras.src.callbacks.callback import Callback

    class _XlaSteps(Callback):
        def __init__(self, recorder: TFRecorder, model: Any) -> None:
            super().__init__()
            self.recorder, self.fit_model = recorder, model

        def on_train_begin(self, logs: Any = None) -> None:
            rec, model = self.recorder, self.fit_model
            if rec.active and rec.step == 0:
                vs = list(model.trainable_variables)
                rec.guarded("xla init", rec._tap, "init", [_var_name(v) for v in vs], [_read(v) for v in vs],
                            named=True)

        def on_train_batch_end(self, batch: Any, logs: Any = None) -> None:
            self.recorder.guarded("xla step", self.recorder.xla_batch_end, self.fit_model)
            self.recorder.raise_if_stopped()

    _XLA_CALLBACK = _XlaSteps

    def layer_call(orig: Callable) -> Callable:
        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:
            return rec.layer_call(orig, layer, args, kwargs)
        return __call__

    def apply(orig: Callable) -> Callable:
        def wrapped(opt: Any, grads: Any, trainable_variables: Any = None) -> Any:
            return rec.optimizer_apply(orig, opt, grads, trainable_variables)
        return wrapped

    def fit(orig: Callable) -> Callable:
        def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
            if rec.active:
                rec.guarded("fit", rec.before_fit, model, args, kwargs)
            rec._in_fit += 1
            try:
                return orig(model, *args, **kwargs)
            finally:
                rec._in_fit -= 1
        return wrapped

    rec._patch(Layer, "__call__", layer_call)
    rec._patch(BaseOptimizer, "apply", apply)
    rec._patch(LossScaleOptimizer, "apply", apply)
    rec._patch(TensorFlowTrainer, "fit", fit)
    rec._patch(TensorFlowTrainer, "evaluate", _evaluation(rec, "evaluate"))
    rec._patch(TensorFlowTrainer, "predict", _evaluation(rec, "predict"))


def _evaluation(rec: TFRecorder, phase: str) -> Callable[[Callable], Callable]:
    """The wrap of Keras ``evaluate`` (``validation`` when ``fit`` calls it) or ``predict``."""
    def make(orig: Callable) -> Callable:
        def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
            prev = rec._phase
            now = "validation" if phase == "evaluate" and rec._in_fit else phase
            if rec.active:
                rec.guarded("eval", rec.before_eval, model, now, args[0] if args else kwargs.get("x"))
            rec._phase = now
            try:
                return orig(model, *args, **kwargs)
            finally:
                rec._phase = prev
        return wrapped
    return make
