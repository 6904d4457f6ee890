"""Module inputs and outputs on an accelerator: one copy each, fingerprinted in batches.

Once parameters, gradients and optimizer state were fingerprinted in batches
(``batched_torch``), the activations were what an accelerator's step paid for: each went
through the per-tensor torch-op path, about ten small ops, each a launch and a dispatch
from Python. Here an activation costs one op when its hook sees it: a copy into a staging
buffer (one per device and dtype). The copy keeps the values the hook saw, whatever the
program does to the tensor afterwards (``ReLU(inplace=True)`` changes the output of the
layer before it; the copy is ordered before that on the device's stream), and nothing holds
the activation itself. The staged copies are fingerprinted together by
``batched_torch.begin_many`` when the buffer is full or the recorder asks (at the step's
end): a constant number of ops per batch, and the number of batches grows with the bytes
(``LIMIT_BYTES`` a buffer), never with the number of tensors.

A pending handed out by ``Stage.begin`` is complete only after the next ``flush``: the
recorder flushes before it finishes a step's pendings. Fingerprints are bit-identical to
the per-tensor path's (the copy holds the tensor's values in its logical order, which is
what a fingerprint reads); statistics equal them up to float64 rounding, as on the batched
path. Nothing synchronises with the host, and every op is deterministic.

Copies and flushes go on the current stream, so a buffer is reused only after the work that
reads it (stream order). A forward run on a side stream must hand its outputs back to the
step's stream, as torch asks of any consumer (``wait_stream``); the per-tensor path assumed
the same.
"""

from __future__ import annotations

import torch

from reprobisect.runners import batched_torch
from reprobisect.runners import fingerprint_torch as fpt

__all__ = ["LIMIT_BYTES", "Stage", "takes"]

LIMIT_BYTES = 64 << 20  # one staging buffer per device and dtype; larger tensors take the per-tensor path


def takes(t: torch.Tensor) -> bool:
    """Whether ``t`` is staged rather than fingerprinted at once: a plain floating tensor on a
    device that is fingerprinted in batches (an accelerator, or CPU when forced), of at most
    ``LIMIT_BYTES`` (a larger one's few ops are nothing next to its size)."""
    return batched_torch.takes(t) and t.numel() * t.element_size() <= LIMIT_BYTES


class _Buffer:
    """One device and dtype's staging buffer and what waits in it."""

    __slots__ = ("data", "used", "waiting")

    def __init__(self) -> None:
        self.data: torch.Tensor | None = None
        self.used = 0  # elements
        self.waiting: list[tuple[fpt.Pending, torch.Tensor]] = []  # (the pending handed out, the staged copy)


class Stage:
    """Staged copies of tensors, fingerprinted together at ``flush``."""

    def __init__(self, with_stats: bool = True) -> None:
        self.with_stats = with_stats
        self._buffers: dict[tuple[torch.device, torch.dtype], _Buffer] = {}

    def begin(self, t: torch.Tensor) -> fpt.Pending:
        """Copy ``t`` (for which ``takes`` is true) into its staging buffer; its pending is
        filled in by the next ``flush``."""
        n = t.numel()
        key = (t.device, t.dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = _Buffer()
        if buf.data is None or buf.used + n > buf.data.numel():
            self._make_room(buf, t, n)
        assert buf.data is not None
        view = buf.data[buf.used : buf.used + n].view(t.shape)
        view.copy_(t.detach())  # (detached: the buffer joins no graph, whatever the grad mode)
        buf.used += n
        p = fpt.Pending(dtype=fpt._name(t.dtype), shape=tuple(t.shape), nbytes=n * t.element_size(),
                        row_sums=None, stats=None, numel=n)  # type: ignore[arg-type]
        buf.waiting.append((p, view))
        return p

    def _make_room(self, buf: _Buffer, t: torch.Tensor, n: int) -> None:
        """Flush what waits, and grow the buffer when ``n`` elements would not fit an empty
        one (up to ``LIMIT_BYTES``; the first steps find the size a step needs)."""
        if buf.waiting:
            self._flush(buf)
        cap = 0 if buf.data is None else buf.data.numel()
        if n > cap:
            limit = max(n, LIMIT_BYTES // t.element_size())
            cap = min(limit, max(n, 2 * cap, 1 << 16))
            buf.data = None  # (the allocator reuses it after the work already queued on it)
            buf.data = torch.empty(cap, dtype=t.dtype, device=t.device)

    def _flush(self, buf: _Buffer) -> None:
        waiting, buf.waiting = buf.waiting, []
        begun = batched_torch.begin_many([v for _, v in waiting], with_stats=self.with_stats)
        for (p, _), q in zip(waiting, begun):
            p.row_sums, p.stats, p.counts, p.batch, p.index = q.row_sums, q.stats, q.counts, q.batch, q.index
        buf.used = 0

    def flush(self) -> None:
        """Fingerprint everything staged: every pending handed out is complete after this."""
        for buf in self._buffers.values():
            if buf.waiting:
                self._flush(buf)

    def pending(self) -> int:
        """The number of tensors staged and not yet flushed."""
        return sum(len(b.waiting) for b in self._buffers.values())

    def release(self) -> None:
        """Drop the buffers (the recorder is removed): what waits is never finished."""
        self._buffers.clear()
