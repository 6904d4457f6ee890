"""The TensorFlow recorder's batches: ``batch`` records and sample IDs.

In ``fit``: the model's ``train_step`` is wrapped (``tf_keras``) and its ``data`` gives
``data[i]`` records; ``ids`` when ``x`` is one NumPy array with unique rows, or a
``tf.data`` pipeline traced back to ``from_tensor_slices`` (each batch row found in the
source by content: ``_RowIndex``). In a custom loop: ``next()`` on a ``tf.data`` iterator
is wrapped; a drawn batch waits for the training forward that uses it (eager), or for the
step's end (the last one drawn, when the step ran in a graph).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from reprobisect.runners import fingerprint_tf as fptf
from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.tf_common import _in_xla, _tensors

__all__ = ["TFBatchesObserver"]

_MAX_ID_BYTES = 256 << 20  # the rows of a batch source indexed by content up to this size
_ROW_KEEPING = {f"{n}Dataset" for n in ("Batch", "Shuffle", "Prefetch", "Repeat", "Take", "Skip", "Cache", "Options",
                                        "ParallelBatch")}  # tf.data steps that keep rows as they are


class TFBatchesObserver(Observer):
    """Batches of ``fit`` and of custom loops, with their sample IDs when derivable."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.pending: list[tuple[Any, Any]] = []  # batches drawn by a custom loop, not yet used
        self.loop_index: dict[int, tuple[Any, Any]] = {}
        self.ids: "_RowIndex | None" = None  # the row index of the fit running now

    def fit_batch(self, data: Any) -> None:
        """A batch ``fit``'s ``train_step`` was given: its records, now (eager) or at run time."""
        rec = self.rec
        ts = _tensors(data)
        if ts and tf.executing_eagerly():
            self._fit_ids(ts[0], None)
        elif ts and not _in_xla():  # the index is looked up when the step runs: a later fit reuses this graph
            gs = rec._gstate()
            seq = gs["seq"]
            gs["seq"] += 1
            gs["taps"] += rec._py(lambda v: rec.guarded("ids", self._fit_ids, v, seq), [ts[0]])
        rec._tap("batch", "data", ts)

    def _fit_ids(self, x: Any, seq: int | None) -> None:
        index = self.ids  # of the fit running now
        if index is not None and index.index is not None:
            self._add_ids(fptf.host_array(x), seq, index)

    def _add_ids(self, x: np.ndarray, seq: int | None, index: "_RowIndex") -> None:
        rec = self.rec
        if not rec.active:
            return
        ids = index.lookup(x)
        if ids is None:
            rec._scalars["batch_ids"] = "not derivable: a batch row is not among the source's rows"
            return
        rec._batch_ids = ids.tolist()
        rec._add_now("batch", rec._unique(rec._occ, "batch", "ids"), ids, seq=seq)

    def loop_batch(self, it: Any, out: Any) -> None:
        """An eager ``next()`` on a ``tf.data`` iterator outside ``fit``: the batch waits for the
        training forward that uses it (an evaluation forward drops it)."""
        rec = self.rec
        if rec._in_fit or not rec.active:
            return
        ds = getattr(it, "_dataset", None)
        hit = self.loop_index.get(id(it))
        if hit is None or hit[0]() is not it:
            hit = (weakref.ref(it), _RowIndex.of(ds))
            self.loop_index[id(it)] = hit
        self.pending.append((out, hit[1]))
        del self.pending[:-16]

    def claim(self, last_only: bool = False) -> None:
        """Record the waiting batches as this step's ``batch`` records (``last_only``: the one
        drawn last, for a step whose forward ran in a graph, unseen in Python)."""
        rec = self.rec
        pending, self.pending = (self.pending[-1:] if last_only else self.pending), []
        for out, index in pending:
            ts = _tensors(out)
            rec.info["batch_ids"] = index.why
            if index.index is not None and ts:
                self._add_ids(fptf.host_array(ts[0]), None, index)
            rec._tap("batch", "data", ts)


register_observer("tensorflow", "batches", TFBatchesObserver, rank=10)


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
