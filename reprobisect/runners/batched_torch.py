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

On CUDA with Triton, steps 2 and 3's row sums and slot statistics come from one kernel
(``triton_rows``) that reads each packed byte once, one launch per slot class, after a
self-check against these torch ops for each device and dtype (``fused_ok``); the kernel
also reads a tensor too large for a batch in place (``begin``), without the packing copy.

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
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners import triton_rows
from reprobisect.trace.fingerprint import ROW

__all__ = ["Batch", "begin", "begin_many", "enabled_for", "force", "fused_ok", "fused_status", "on_batched_device", "takes"]

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
    return on_batched_device(t) and _eligible(t) and t.numel() * t.element_size() <= MAX_TENSOR_BYTES


def on_batched_device(t: torch.Tensor) -> bool:
    """``enabled_for(t.device)``, without building the device object (called per tensor)."""
    return not t.is_cpu or _cpu_forced()


_fused: dict[tuple[torch.device, torch.dtype], bool] = {}
_fused_why: dict[str, str] = {}


def fused_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the Triton kernel (``triton_rows``) computes the rows of ``dtype`` groups on
    ``device``: decided once per device and dtype, by a self-check against the torch ops."""
    key = (device, dtype)
    ok = _fused.get(key)
    if ok is None:
        why = _fused_unusable(device, dtype)
        ok = _fused[key] = why is None
        _fused_why[f"{device} {fpt._name(dtype)}"] = why or "on"
    return ok


def fused_status() -> dict[str, str]:
    """For each device and dtype the batched path has met: "on", or why the torch ops
    compute its rows instead."""
    return dict(_fused_why)


def _fused_unusable(device: torch.device, dtype: torch.dtype) -> str | None:
    m = triton_rows.mode()
    if m == "off":
        return "off (REPROBISECT_FP_TRITON=0)"
    if m == "auto" and device.type != "cuda":
        return f"off on {device.type} (the kernel is for CUDA; REPROBISECT_FP_TRITON=1 forces it)"
    err = triton_rows.import_error()
    if err is not None:
        return err
    try:
        bad = _fused_mismatch(device, dtype)
    except Exception as e:  # a Triton that cannot compile for this device: the torch ops stand
        bad = f"the kernel failed ({type(e).__name__}: {e})"
    if bad is not None:
        print(f"reprobisect: the Triton fingerprint kernel is not used on {device}: {bad}", file=sys.stderr)
    return bad


def _fused_mismatch(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the kernel's results differ from the torch ops' on tensors of every slot class,
    padding, NaN and Inf (None: they agree: the same fingerprints, the same statistics up to
    float64 rounding)."""
    g = torch.Generator().manual_seed(12)
    shapes = [(), (5,), (16,), (33,), (300,), (ROW + 7,), (3, ROW), (64, 65)]
    ts = [(torch.randn(s, generator=g, dtype=torch.float64) * 100).to(dtype).to(device) for s in shapes]
    ts[1], ts[5] = ts[1].abs() + 1, -ts[5].abs() - 1  # padding (zeros) must become neither min nor max
    ts[3][1] = float("nan")
    ts[4][2], ts[4][5] = float("inf"), float("-inf")
    for with_stats in (True, False):
        want = fpt.finish_many(_begin_group(ts, with_stats, fused=False))
        got = fpt.finish_many(_begin_group(ts, with_stats, fused=True))
        for shape, (f_want, s_want), (f_got, s_got) in zip(shapes, want, got):
            if f_want != f_got:
                return f"the fingerprint of a {fpt._name(dtype)} tensor of shape {shape} differs"
            if not _same_stats(s_want, s_got):
                return f"the statistics of a {fpt._name(dtype)} tensor of shape {shape} differ: {s_got} != {s_want}"
    return None


def _same_stats(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    for key, x in a.items():
        y = b.get(key)
        if key in ("norm", "mean") and isinstance(x, float) and isinstance(y, float):
            if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif x != y:
            return False
    return a.keys() == b.keys()


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
    valid: torch.Tensor | None = None  # fused: int32 real elements per slot; None: no padding


@dataclass
class _Combine:
    """Slot statistics -> tensor statistics for the tensors with up to ``width`` slots."""

    index: torch.Tensor  # (len(tensors) * width,) slot indices; the neutral column pads
    width: int
    tensors: list[int]


class _Layout:
    """Where each tensor of one (device, dtype, shapes) group lives in the packed buffer."""

    def __init__(self, device: torch.device, dtype: torch.dtype, shapes: tuple[tuple[int, ...], ...],
                 fused: bool = False) -> None:
        es = torch.empty((), dtype=dtype).element_size()
        self.fused = fused  # row sums and slot statistics by the Triton kernel (``triton_rows``)
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
        if self.fused:  # the kernel masks each slot past its count of real elements
            valid = np.full(cl.n, per_slot, dtype=np.int32)
            for k in mine:
                s0, n = self.rows[k]
                valid[s0 + n - 1 - cl.slot0] = numels[k] - (n - 1) * per_slot
            cl.valid = torch.from_numpy(valid).to(dev)
            return
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
        # (fused: no masked copies; every slot's own column is already masked)
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


def _layout(device: torch.device, dtype: torch.dtype, shapes: tuple[tuple[int, ...], ...], fused: bool) -> _Layout:
    key = (device, dtype, shapes, fused)
    lay = _layouts.get(key)
    if lay is None:
        lay = _layouts[key] = _Layout(device, dtype, shapes, fused)
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


def _fused_rows(lay: _Layout, with_stats: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``_row_sums`` and ``_slot_stats`` by the Triton kernel: one launch per slot class
    (and one copy for the neutral column), each packed byte read once."""
    dev, n = lay.device, lay.total_slots
    w = fpt._device_weights(dev)
    sums = torch.empty(n, dtype=torch.int64, device=dev)
    slot = None
    if with_stats:
        slot = torch.empty(_STATS, n + 1, dtype=torch.float64, device=dev)
        slot[:, n:].copy_(lay.neutral)
    for cl in lay.classes:
        a, b = cl.slot0, cl.slot0 + cl.n
        triton_rows.rows(lay.lanes(cl).view(-1), lay.values(cl).view(-1) if with_stats else None, cl.lanes, w,
                         sums[a:b], slot[:, a:b] if slot is not None else None, cl.valid)
    return sums, slot


def _begin_group(ts: list[torch.Tensor], with_stats: bool, fused: bool | None = None) -> list[fpt.Pending]:
    t0 = ts[0]
    if fused is None:
        fused = fused_ok(t0.device, t0.dtype)
    lay = _layout(t0.device, t0.dtype, tuple(tuple(t.shape) for t in ts), fused)
    lay.fill(ts)
    if fused:
        sums, slot = _fused_rows(lay, with_stats)
    else:
        sums, slot = _row_sums(lay), (_slot_stats(lay) if with_stats else None)
    cols = None
    if with_stats:
        assert slot is not None
        st, cols = _tensor_stats(lay, slot)
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


def _solo_ok(t: torch.Tensor) -> bool:
    """Whether the kernel reads ``t`` in place, on its own (a tensor too large for a batch)."""
    return (
        on_batched_device(t)
        and _eligible(t)
        and t.is_contiguous()
        and (t.numel() * t.element_size()) % 4 == 0
        and t.data_ptr() % 4 == 0
        and fused_ok(t.device, t.dtype)
    )


def _begin_solo(t: torch.Tensor, with_stats: bool) -> fpt.Pending:
    """``t``'s fingerprint by the kernel over its own bytes (no packing copy): one launch for
    its rows, and a few ops that combine their statistics."""
    x = t.detach().reshape(-1)
    lanes = x.view(torch.int32)
    n = -(-lanes.numel() // ROW)
    dev = t.device
    sums = torch.empty(n, dtype=torch.int64, device=dev)
    st = torch.empty(_STATS, n, dtype=torch.float64, device=dev) if with_stats else None
    triton_rows.rows(lanes, x if with_stats else None, ROW, fpt._device_weights(dev), sums, st)
    result = sums
    if st is not None:
        tot = torch.cat([st[:2].sum(1), st[2:3].amin(1), st[3:4].amax(1), st[4:].sum(1)])
        result = torch.cat([sums, tot.view(torch.int64)])
    batch = Batch(result, [(0, n)], [0] if with_stats else None, n)
    return fpt.Pending(dtype=fpt._name(t.dtype), shape=tuple(t.shape), nbytes=t.numel() * t.element_size(),
                       row_sums=None, stats=None, numel=t.numel(), batch=batch, index=0)  # type: ignore[arg-type]


def begin(t: torch.Tensor, with_stats: bool = True) -> fpt.Pending:
    """``fingerprint_torch.begin``, or the kernel over ``t``'s own bytes where it runs (a
    large tensor on a GPU: one pass instead of a dozen)."""
    if _solo_ok(t):
        with torch.no_grad():
            return _begin_solo(t, with_stats)
    return fpt.begin(t, with_stats=with_stats)


def begin_many(tensors: list[torch.Tensor], with_stats: bool = True) -> list[fpt.Pending]:
    """``fingerprint_torch.begin`` for each tensor, in order; the tensors of one device and
    dtype that ``enabled_for`` their device take the batched path together (no host sync)."""
    out: list[Any] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    alone: list[int] = []  # one by one on their device (CPU: the native kernel, in one call)
    for k, t in enumerate(tensors):
        if not on_batched_device(t):  # a CPU tensor, not forced: the native kernel
            alone.append(k)
        elif takes(t):
            groups.setdefault((t.device, t.dtype), []).append(k)
        elif _solo_ok(t):
            out[k] = begin(t, with_stats)
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
