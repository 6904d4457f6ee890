"""The PyTorch recorder's batches: DataLoader attribution (``batch`` records, batch IDs).

``_BaseDataLoaderIter._next_index`` is wrapped to queue the indices each batch was built
from (FIFO per iterator: prefetching workers, custom samplers and batch samplers all work);
``__next__`` pops them when the batch is handed to the loop. A batch is drawn before anyone
knows whether it trains, so it is attributed lazily (``runners.torch``'s docstring: drawn
for evaluation, claimed by the next training forward, settled at the step's end). Installs
``runners.torch_state.track_data_order`` first (data order for state capture).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.torch_common import _Entry, _fingerprintable, _tensors, _training
from reprobisect.trace import record_array

__all__ = ["BatchesObserver"]


@dataclass
class _Batch:
    """A batch drawn with gradients enabled, not yet known to train (see ``claim``)."""

    it: int  # id of its DataLoader iterator
    ids: np.ndarray | None
    tensors: list[tuple[int, fpt.Pending, torch.Tensor]]  # (index in the batch, fingerprint, tensor)
    seen_by: set[int]  # roots that ran an evaluation forward while it was pending
    run: dict[str, Any] | None = None  # the evaluation run that first used it


class BatchesObserver(Observer):
    """DataLoader batches: drawn, attributed to training or evaluation, recorded."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.pending: list[_Batch] = []  # drawn, not yet known to train
        self.iters: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def install(self) -> Callable[[], None] | None:
        try:  # data order for state capture (reads RNG states only; wraps DataLoader.__iter__)
            from reprobisect.runners.torch_state import track_data_order

            track_data_order()
        except (ImportError, NotImplementedError):
            pass
        self._wrap_dataloader()
        return None

    def _wrap_dataloader(self) -> None:
        from torch.utils.data import dataloader as dl

        cls = dl._BaseDataLoaderIter
        orig_next_index = cls.__dict__["_next_index"]
        orig_next = cls.__dict__["__next__"]
        orig_iter = dl.DataLoader.__dict__["__iter__"]
        rec = self.rec
        iters = self.iters

        def _next_index(it):
            idx = orig_next_index(it)
            q = it.__dict__.get("_reprobisect_ids")
            if q is None:
                q = it.__dict__["_reprobisect_ids"] = deque()
            q.append(idx)
            return idx

        def __next__(it):
            t0 = time.perf_counter()
            data = orig_next(it)
            t1 = time.perf_counter()
            q = it.__dict__.get("_reprobisect_ids")
            idx = q.popleft() if q else None
            if not rec.done:
                iters.add(it)
                rec._on_batch(it, idx, data, t0, t1)
            return data

        def __iter__(loader):
            it = orig_iter(loader)
            if isinstance(it, cls):
                it.__dict__["_reprobisect_loader"] = weakref.ref(loader)
            return it

        rec._patch(cls, "_next_index", _next_index)
        rec._patch(cls, "__next__", __next__)
        rec._patch(dl.DataLoader, "__iter__", __iter__)

    def on_batch(self, it: Any, idx: Any, data: Any, t0: float, t1: float) -> None:
        """A batch handed to the loop: evaluation at once, or pending until a forward claims it."""
        rec = self.rec
        ids = None
        if idx is not None:
            try:
                ids = np.asarray(idx, dtype=np.int64).reshape(-1)
            except (TypeError, ValueError):
                ids = None
        if not _training() or rec.phase is not None:  # drawn for evaluation: never a training batch
            rec.observers["evaluation"].batch(ids)
            return
        if rec._t0 is None:
            rec._t0 = t0
        rec._data_wait += t1 - t0
        ref = it.__dict__.get("_reprobisect_loader")
        if ref is not None:
            rec._loader = ref
        # a batch of this loader that only an evaluation used, before this one was drawn
        for b in [b for b in self.pending if b.it == id(it) and b.seen_by]:
            self.pending.remove(b)
            rec.observers["evaluation"].batch(b.ids, "no_grad", b.run)
        with torch.no_grad():
            tensors = [(i, rec._begin(t), t.detach()) for i, t in enumerate(_tensors(data)) if _fingerprintable(t)]
        # whether it trains is known at the next forward (see claim, settle)
        self.pending.append(_Batch(it=id(it), ids=ids, tensors=tensors, seen_by=set()))
        rec._record_s += time.perf_counter() - t1

    def seen_by(self, root: int, run: dict[str, Any]) -> None:
        """An evaluation forward of ``root`` (run ``run``) while batches are pending."""
        for b in self.pending:
            b.seen_by.add(root)
            b.run = b.run or run

    def training_root(self, module: torch.nn.Module, args: tuple) -> None:
        if not self.rec.prefetch:
            self.claim(id(module))

    def claim(self, root: int) -> None:
        """A training forward of ``root``: every pending batch it did not evaluate trains."""
        keep = []
        for b in self.pending:
            if root in b.seen_by:
                keep.append(b)
            else:
                self._commit(b)
        self.pending = keep

    def claim_next(self) -> None:
        """A runner says a training batch starts (Lightning's ``on_train_batch_start``): the
        oldest pending batch of each loader is it (a prefetched one waits for its step)."""
        keep, taken = [], set()
        for b in self.pending:
            if b.it in taken:
                keep.append(b)
            else:
                taken.add(b.it)
                self._commit(b)
        self.pending = keep

    def _commit(self, b: _Batch) -> None:
        rec = self.rec
        if b.ids is not None:
            rec._batch_ids = (rec._batch_ids or []) + b.ids.tolist()
            name = rec._unique("batch", "ids")
            e = _Entry(kind="batch", name=name, record=record_array(name, "batch", b.ids),
                       array=b.ids.copy() if rec._full else None)
            e.seq = len(rec._entries)
            rec._entries.append(e)
        for i, pending, t in b.tensors:
            e = _Entry(kind="batch", name=rec._unique("batch", f"data[{i}]"), pending=pending)
            if rec._full:
                rec._keep_array(e, t)
            e.seq = len(rec._entries)
            rec._entries.append(e)

    def settle(self) -> None:
        """At a step's end: batches an evaluation used are evaluation; a batch the loop drew
        ahead (``prefetch``) waits for its step; any other pending batch trained here."""
        rec = self.rec
        newest = {b.it: b for b in self.pending} if rec.prefetch and rec._trained else {}
        keep = []
        for b in self.pending:
            if b.seen_by:
                rec.observers["evaluation"].batch(b.ids, "no_grad", b.run)
            elif newest.get(b.it) is b:
                keep.append(b)
            else:
                self._commit(b)
        self.pending = keep

    def shutdown_loaders(self) -> None:
        """Stop the worker processes of every DataLoader iterator seen (multi-process loading)."""
        for it in list(self.iters):
            shut = getattr(it, "_shutdown_workers", None)
            if shut is not None:
                try:
                    shut()
                except Exception:
                    pass


register_observer("torch", "batches", BatchesObserver, rank=50)
