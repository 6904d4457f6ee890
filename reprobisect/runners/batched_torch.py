"""Fingerprints and stats of many tensors in a constant number of device ops.

The recorder fingerprints the tensors that are ready at one moment together: the
parameters after an optimizer step, their gradients, the optimizer's state. Done tensor by
tensor on an accelerator that is ~10 kernel launches per tensor, and the launches, not the
arithmetic, are what a step pays (8-10x a plain step on an H200). Here every group of
tensors with the same device and dtype costs a fixed number of ops, whatever the number of
tensors:

1. one ``torch._foreach_copy_`` packs the tensors into a scratch buffer (one per device and
   dtype, shared by every set of shapes, its padding zero; a set's layout and views are
   built once and reused every step). A batch packs at most ``MAX_BATCH_BYTES`` (more bytes
   make more batches: their number grows with the bytes, never with the tensors), so the
   path holds that much scratch at most; a tensor over ``MAX_TENSOR_BYTES`` takes the
   per-tensor path, whose few launches are nothing next to its size;
2. the buffer is cut into *slots*: a tensor of at most 16 or 256 lanes takes one slot of
   that many 32-bit lanes, a larger one takes one slot of ``ROW`` lanes per row. Each
   tensor starts at a slot boundary and its padding stays zero, so one widening multiply by
   the column weights and one row sum per slot class (three classes) give exactly the
   per-row sums of ``reprobisect.trace.fingerprint`` (exact integer arithmetic modulo
   2**64: bit-identical to the host reference, in any order);
3. statistics per slot (float64 sum, sum of squares, min and max, the padding masked by
   repeating the slot's first element, and the NaN and Inf counts), combined per tensor by
   one ``index_select`` into a padded table per class of slot counts (powers of 4) and one
   reduction each;
4. the results of the group are one int64 tensor on the device; ``fingerprint_torch.
   finish_many`` brings every group of a step to the host in one copy per device.

No host synchronisation happens before that copy, and every op used is deterministic
(nothing raises under ``torch.use_deterministic_algorithms(True)``). Statistics equal the
per-tensor torch path's up to float64 rounding (the summation order differs).

Used for tensors on an accelerator. On CPU the native kernel (one pass per tensor, near
memory speed) stays the default; ``REPROBISECT_FP_BATCHED=1`` or ``force(True)`` sends
CPU tensors through this path too (tests and benchmarks do). Tensors it does not take
(integer, complex, float8, empty, subclasses, sparse) go through ``fingerprint_torch.begin``.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.trace.fingerprint import ROW

__all__ = ["Batch", "begin_many", "enabled_for", "force", "takes"]

SLOTS = (16, 256, ROW)  # lanes per slot, per class: at most 16x padding on tiny tensors
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_BLOCK_ROWS = 4096  # rows of ROW lanes per block of int64 scratch (64 MiB of float32 read)
_MAX_LAYOUTS = 64
MAX_BATCH_BYTES = 256 << 20  # packed bytes per batch: bounds the scratch memory the path holds
MAX_TENSOR_BYTES = 64 << 20  # larger tensors take the per-tensor path (their launches are amortised)
_STATS = 6  # per slot and per tensor: sum, sum of squares, min, max, NaN count, Inf count
_forced: bool | None = None
_layouts: "OrderedDict[tuple, _Layout]" = OrderedDict()
_scratch: dict[tuple[torch.device, torch.dtype], list[Any]] = {}  # -> [buffer, layout that last filled it]


_from_env: bool | None = None  # REPROBISECT_FP_BATCHED, read once (a lookup per tensor added up)


def force(on: bool | None) -> None:
    """Send CPU tensors through the batched path too (``None``: back to the environment's say,
    read again)."""
    global _forced, _from_env
    _forced, _from_env = on, None


def _cpu_forced() -> bool:
    global _from_env
    if _forced is not None:
        return _forced
    if _from_env is None:
        _from_env = os.environ.get("REPROBISECT_FP_BATCHED", "").strip() not in ("", "0")
    return _from_env


def enabled_for(device: torch.device) -> bool:
    """Whether tensors on ``device`` are fingerprinted in batches."""
    return device.type != "cpu" or _cpu_forced()


def takes(t: torch.Tensor) -> bool:
    """Whether ``begin_many`` fingerprints ``t`` in a batch (else on the per-tensor path)."""
    return enabled_for(t.device) and _eligible(t) and t.numel() * t.element_size() <= MAX_TENSOR_BYTES


def _eligible(t: torch.Tensor) -> bool:
    # a plain tensor or parameter (a subclass of either may hold anything: the per-tensor path)
    return (
        t.dtype in _FLOATS
        and (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.layout == torch.strided
        and t.numel() > 0
        and not (t.is_neg() or t.is_conj())
    )


@dataclass
class _Class:
    """One slot class of a layout: ``n`` slots of ``lanes`` lanes from lane ``start``.

    ``mask`` marks the real elements of the slots that have padding: of every slot in the
    small classes (``padded`` is None), or, in the ROW class, of the slots listed in
    ``padded`` (each tensor's last, partial row: the others are full), so the mask stays
    small next to the tensors."""

    lanes: int
    start: int
    n: int
    slot0: int  # index of its first slot among all the layout's slots
    mask: torch.Tensor | None = None  # bool, (n or len(padded), elements per slot); None: no padding
    padded: torch.Tensor | None = None  # local indices of the masked slots (ROW class only)
    padded_slots: tuple[int, ...] = ()  # their global slot indices


@dataclass
class _Combine:
    """Slot statistics -> tensor statistics for the tensors with up to ``width`` slots."""

    index: torch.Tensor  # (len(tensors) * width,) slot indices; the neutral column pads
    width: int
    tensors: list[int]


class _Layout:
    """Where each tensor of one (device, dtype, shapes) group lives in the packed buffer."""

    def __init__(self, device: torch.device, dtype: torch.dtype, shapes: tuple[tuple[int, ...], ...]) -> None:
        es = torch.empty((), dtype=dtype).element_size()
        numels = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        lanes = [-(-n * es // 4) for n in numels]
        cls_of = [next(c for c, s in enumerate(SLOTS) if ln <= s or s == ROW) for ln in lanes]
        starts = [0] * len(shapes)
        self.rows: list[tuple[int, int]] = [(0, 0)] * len(shapes)  # (first slot, slots) per tensor
        self.classes: list[_Class] = []
        lane = slot = 0
        for c, size in enumerate(SLOTS):
            c0, s0 = lane, slot
            for k in (k for k in range(len(shapes)) if cls_of[k] == c):
                n_slots = -(-lanes[k] // size)
                starts[k] = lane
                self.rows[k] = (slot, n_slots)
                lane += n_slots * size
                slot += n_slots
            if slot > s0:
                self.classes.append(_Class(size, c0, slot - s0, s0))
        self.total_slots = slot
        self.elems = lane * 4 // es  # every class starts at a multiple of 16 lanes: whole elements
        self.dtype, self.device = dtype, device
        self._spans = [(starts[k] * 4 // es, numels[k], shapes[k]) for k in range(len(shapes))]
        self._bound: torch.Tensor | None = None
        self.buf = torch.empty(0, dtype=dtype, device=device)
        self.views: list[torch.Tensor] = []
        for cl in self.classes:
            self._mask(cl, starts, numels, es)
        self.combines = self._combines(device)
        self.neutral = torch.tensor([[0.0], [0.0], [float("inf")], [float("-inf")], [0.0], [0.0]], dtype=torch.float64,
                                    device=device)

    def fill(self, ts: list[torch.Tensor]) -> None:
        """Copy ``ts`` into this layout's place in the shared scratch buffer (one op), its
        padding zero (cleared when another layout wrote the buffer last)."""
        key = (self.device, self.dtype)
        held = _scratch.get(key)
        if held is None or held[0].numel() < self.elems:
            for lay in _layouts.values():  # views of the old buffer: let it go
                if lay.device == self.device and lay.dtype == self.dtype:
                    lay.unbind()
            held = _scratch[key] = [torch.zeros(self.elems, dtype=self.dtype, device=self.device), self]
        elif held[1] is not self:
            held[0][: self.elems].zero_()
            held[1] = self
        if self._bound is not held[0]:
            self._bound, self.buf = held[0], held[0][: self.elems]
            self.views = [self.buf[at : at + n].view(shape) for at, n, shape in self._spans]
        torch._foreach_copy_(self.views, ts)

    def unbind(self) -> None:
        self._bound, self.buf, self.views = None, torch.empty(0, dtype=self.dtype, device=self.device), []

    def lanes(self, cl: _Class) -> torch.Tensor:
        """The class's slots as (n, lanes) int32."""
        es = self.buf.element_size()
        a, b = cl.start * 4 // es, (cl.start + cl.n * cl.lanes) * 4 // es
        return self.buf[a:b].view(torch.int32).view(cl.n, cl.lanes)

    def values(self, cl: _Class) -> torch.Tensor:
        """The class's slots as (n, elements per slot) of the group's dtype."""
        return self.lanes(cl).view(self.buf.dtype)

    def _mask(self, cl: _Class, starts: list[int], numels: list[int], es: int) -> None:
        per_slot = cl.lanes * 4 // es
        mine = [k for k, (s0, _n) in enumerate(self.rows) if cl.slot0 <= s0 < cl.slot0 + cl.n]
        if all(numels[k] == self.rows[k][1] * per_slot for k in mine):
            return  # no padding anywhere in this class
        dev = self.device
        if cl.lanes != ROW:
            valid = np.zeros(cl.n * per_slot, dtype=bool)
            for k in mine:
                at = (starts[k] - cl.start) * 4 // es
                valid[at : at + numels[k]] = True
            cl.mask = torch.from_numpy(valid.reshape(cl.n, per_slot)).to(dev)
            return
        last = [(k, self.rows[k][0] + self.rows[k][1] - 1) for k in mine if numels[k] % per_slot]
        valid = np.zeros((len(last), per_slot), dtype=bool)
        for j, (k, _slot) in enumerate(last):
            valid[j, : numels[k] % per_slot] = True
        cl.mask = torch.from_numpy(valid).to(dev)
        cl.padded_slots = tuple(slot for _k, slot in last)
        cl.padded = torch.tensor([slot - cl.slot0 for slot in cl.padded_slots], dtype=torch.int64, device=dev)

    def _combines(self, device: torch.device) -> list[_Combine]:
        # columns of the slot statistics: every slot, the neutral column, then the ROW
        # class's padded slots again, masked (the combine reads those instead)
        neutral = self.total_slots
        remap = {slot: neutral + 1 + j for cl in self.classes for j, slot in enumerate(cl.padded_slots)}
        by_width: dict[int, list[int]] = {}
        for k, (_s0, n) in enumerate(self.rows):
            width = 1
            while width < n:
                width *= 4
            by_width.setdefault(width, []).append(k)
        out = []
        for width, ks in sorted(by_width.items()):
            idx = np.full((len(ks), width), neutral, dtype=np.int64)
            for j, k in enumerate(ks):
                s0, n = self.rows[k]
                idx[j, :n] = [remap.get(slot, slot) for slot in range(s0, s0 + n)]
            out.append(_Combine(torch.from_numpy(idx.reshape(-1)).to(device), width, ks))
        return out


def _layout(device: torch.device, dtype: torch.dtype, shapes: tuple[tuple[int, ...], ...]) -> _Layout:
    key = (device, dtype, shapes)
    lay = _layouts.get(key)
    if lay is None:
        lay = _layouts[key] = _Layout(device, dtype, shapes)
        while len(_layouts) > _MAX_LAYOUTS:
            _layouts.popitem(last=False)
    else:
        _layouts.move_to_end(key)
    return lay


class Batch:
    """The device results of one group: row sums of every slot, then per tensor its 4
    statistics and its NaN and Inf counts (float64 bits); read on the host once, by
    ``fingerprint_torch.finish_many``."""

    def __init__(self, result: torch.Tensor, rows: list[tuple[int, int]], stat_at: list[int] | None,
                 total_slots: int) -> None:
        self.result = result
        self.rows = rows
        self.stat_at = stat_at  # tensor -> its column in the statistics, None without stats
        self.total_slots = total_slots
        self.host: np.ndarray | None = None
        self._stats: list[list[float]] | None = None

    def item(self, k: int) -> tuple[np.ndarray, list[float] | None, tuple[int, int] | None]:
        """Tensor ``k``'s row sums, ``[sum, norm, min, max]`` and ``(nan, inf)`` (the host
        copy is made)."""
        assert self.host is not None
        s0, n = self.rows[k]
        sums = self.host[s0 : s0 + n]
        if self.stat_at is None:
            return sums, None, None
        if self._stats is None:
            self._stats = self.host[self.total_slots :].view(np.float64).reshape(_STATS, -1).T.tolist()
        s, sq, mn, mx, nan, inf = self._stats[self.stat_at[k]]
        return sums, [s, math.sqrt(sq) if sq >= 0 else sq, mn, mx], (int(nan), int(inf))


def _row_sums(lay: _Layout) -> torch.Tensor:
    w = fpt._device_weights(lay.buf.device)
    parts = []
    for cl in lay.classes:
        grid = lay.lanes(cl)
        ws = w[: cl.lanes]
        step = max(1, _BLOCK_ROWS * ROW // cl.lanes)  # bounds the int64 scratch
        for i in range(0, cl.n, step):
            parts.append((grid[i : i + step] * ws).sum(1))  # int32 * int64: widened, wraps mod 2**64
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _stats_of(xb: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(6, rows) float64: sum, sum of squares, min, max, NaN and Inf counts of each row of
    ``xb``; ``mask`` marks the real elements (padding is zero: it changes no sum or count;
    for min/max it takes the row's first value, always a real one). Counted here, when the
    tensors are begun, their counts are of the values their statistics are of (a gradient
    clipped in place before the step's end would otherwise be counted after clipping)."""
    f64 = torch.float64
    s = torch.sum(xb, 1, dtype=f64)
    q = torch.linalg.vector_norm(xb, dim=1, dtype=f64)
    nan = torch.isnan(xb).sum(1, dtype=f64)
    inf = torch.isinf(xb).sum(1, dtype=f64)
    if mask is not None:
        xb = torch.where(mask, xb, xb[:, :1])
    mn, mx = torch.aminmax(xb, dim=1)
    return torch.stack([s, q * q, mn.to(f64), mx.to(f64), nan, inf])


def _slot_stats(lay: _Layout) -> torch.Tensor:
    """(6, columns) float64 statistics per slot, the neutral column, then the ROW class's
    padded slots masked (``_Layout._combines`` reads them in place of the unmasked ones)."""
    parts, late = [], []
    for cl in lay.classes:
        x = lay.values(cl)
        step = max(1, _BLOCK_ROWS * ROW // cl.lanes)
        small = cl.padded is None
        for i in range(0, cl.n, step):
            parts.append(_stats_of(x[i : i + step], cl.mask[i : i + step] if small and cl.mask is not None else None))
        if cl.padded is not None:
            late.append(_stats_of(x.index_select(0, cl.padded), cl.mask))
    return torch.cat([*parts, lay.neutral, *late], 1)


def _tensor_stats(lay: _Layout, slot: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """(6, tensors) float64 statistics and counts, and each tensor's column in it."""
    cols = [0] * len(lay.rows)
    parts = []
    at = 0
    for cb in lay.combines:
        g = slot.index_select(1, cb.index)
        if cb.width == 1:
            parts.append(g)
        else:
            g = g.view(_STATS, len(cb.tensors), cb.width)
            s = g[:2].sum(2)
            mn = g[2:3].amin(2)
            mx = g[3:4].amax(2)
            counts = g[4:].sum(2)
            parts.append(torch.cat([s, mn, mx, counts]))
        for j, k in enumerate(cb.tensors):
            cols[k] = at + j
        at += len(cb.tensors)
    return (parts[0] if len(parts) == 1 else torch.cat(parts, 1)), cols


def _begin_group(ts: list[torch.Tensor], with_stats: bool) -> list[fpt.Pending]:
    t0 = ts[0]
    lay = _layout(t0.device, t0.dtype, tuple(tuple(t.shape) for t in ts))
    lay.fill(ts)
    sums = _row_sums(lay)
    cols = None
    if with_stats:
        st, cols = _tensor_stats(lay, _slot_stats(lay))
        result = torch.cat([sums, st.reshape(-1).view(torch.int64)])
    else:
        result = sums
    batch = Batch(result, lay.rows, cols, lay.total_slots)
    name = fpt._name(t0.dtype)
    es = t0.element_size()
    return [
        fpt.Pending(dtype=name, shape=tuple(t.shape), nbytes=t.numel() * es, row_sums=None, stats=None,  # type: ignore[arg-type]
                    numel=t.numel(), batch=batch, index=k)
        for k, t in enumerate(ts)
    ]


def begin_many(tensors: list[torch.Tensor], with_stats: bool = True) -> list[fpt.Pending]:
    """``fingerprint_torch.begin`` for each tensor, in order; the tensors of one device and
    dtype that ``enabled_for`` their device take the batched path together (no host sync)."""
    out: list[Any] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    alone: list[int] = []  # one by one on their device (CPU: the native kernel, in one call)
    for k, t in enumerate(tensors):
        if takes(t):
            groups.setdefault((t.device, t.dtype), []).append(k)
        else:
            alone.append(k)
    for k, p in zip(alone, fpt.begin_many([tensors[k] for k in alone], with_stats=with_stats)):
        out[k] = p
    with torch.no_grad():
        for ks in groups.values():
            for chunk in _chunks(ks, tensors):
                for k, p in zip(chunk, _begin_group([tensors[k] for k in chunk], with_stats)):
                    out[k] = p
    return out


def _chunks(ks: list[int], tensors: list[torch.Tensor]) -> list[list[int]]:
    """``ks`` in runs of at most ``MAX_BATCH_BYTES`` (a number of batches that grows with
    the bytes, never with the number of tensors)."""
    out: list[list[int]] = [[]]
    size = 0
    for k in ks:
        n = tensors[k].numel() * tensors[k].element_size() + 4 * ROW  # with its worst padding
        if out[-1] and size + n > MAX_BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(k)
        size += n
    return out
