"""The TensorFlow recorder's evaluation summaries (``scalars["eval"]``), as the torch recorder's.

``fit``'s validation, ``evaluate``, ``predict`` (their ``Trainer`` methods are wrapped by
``tf_keras``, and the model's ``test_step``/``predict_step`` on the instance for the
batches) and any root layer call with no tape recording: one run per phase
(``validation``, ``evaluate``, ``predict``, ``no_tape``) with its forwards, batches, sample
IDs (rows of the ``x`` evaluated, when unique) and the first 16 root outputs'
fingerprints. In graph mode a tap counts them at run time; under XLA nothing is summarised.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from reprobisect.runners import fingerprint_tf as fptf
from reprobisect.runners.chain import EvalRuns, Observer, register_observer
from reprobisect.runners.observers.tf_batches import _RowIndex
from reprobisect.runners.observers.tf_common import _in_xla, _tensors

__all__ = ["TFEvaluationObserver"]

_EVAL_OUTPUTS = 16  # outputs fingerprinted per evaluation run (as the torch recorder)


class TFEvaluationObserver(Observer):
    """Evaluation runs since the last step, summarised into the next step's scalars."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.runs = EvalRuns(ids_known=True)
        self.index: tuple[Any, "_RowIndex | None"] = (None, None)  # (x of evaluate/predict, its row index)

    def run(self) -> dict[str, Any]:
        """The evaluation run under way (consecutive evaluation of one phase)."""
        return self.runs.run(self.rec._phase or "no_tape", self.rec.step)

    def forward(self, outs: list[Any]) -> None:
        """A forward of a root layer with no tape recording: counted, its outputs fingerprinted
        (the first ``_EVAL_OUTPUTS`` of the run), now (eager) or when the graph runs."""
        rec = self.rec
        if not outs or not rec.active:
            return
        if tf.executing_eagerly():
            self._values(tuple(outs))
        elif not _in_xla():
            rec._py(lambda *v: rec.guarded("eval", self._values, v), outs)
        else:
            rec.info["evaluation"] = "not summarised under XLA (jit_compile=True)"

    def _values(self, values: tuple) -> None:
        if not self.rec.active:
            return
        run = self.run()
        run["forwards"] += 1
        for v in values:
            if len(run["outputs"]) < _EVAL_OUTPUTS:
                run["outputs"].append(fptf.fingerprint_array(fptf.host_array(v), False)[0])

    def before_eval(self, model: Any, phase: str, x: Any) -> None:
        """Keras ``evaluate`` (``validation`` inside ``fit``) or ``predict`` begins: note the
        phase, index ``x`` by row (sample IDs), wrap the model's test/predict step once."""
        if self.index[0] is not x:
            index = _RowIndex.of(x)
            self.index = (x, index if index.index is not None else None)
        rec = self.rec
        for attr in ("test_step", "predict_step"):
            st = model.__dict__.get(attr)
            if st is not None and getattr(st, "_reprobisect", False):
                continue
            inner = getattr(model, attr)

            def step(data: Any, _inner: Callable = inner) -> Any:
                if rec.active and rec._phase is not None:
                    rec.guarded("eval batch", self._batch, data)
                return _inner(data)

            step._reprobisect = True  # type: ignore[attr-defined]
            object.__setattr__(model, attr, step)

    def _batch(self, data: Any) -> None:
        ts = _tensors(data)
        if not ts:
            return
        if tf.executing_eagerly():
            self._ids(ts[0])
        elif not _in_xla():
            self.rec._py(lambda v: self.rec.guarded("eval batch", self._ids, v), [ts[0]])

    def _ids(self, x: Any) -> None:
        if not self.rec.active:
            return
        run = self.run()
        run["batches"] += 1
        index = self.index[1]
        ids = index.lookup(fptf.host_array(x)) if index is not None else None
        if ids is None:
            run["ids_known"] = False
        else:
            run["ids"].append(ids)

    def take(self) -> list[dict[str, Any]]:
        """The evaluation since the last step, as JSON (``scalars["eval"]``), and forget it."""
        return self.runs.take(list)

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        ev = self.take()
        if ev:
            scalars["eval"] = ev


register_observer("tensorflow", "evaluation", TFEvaluationObserver, rank=20)
