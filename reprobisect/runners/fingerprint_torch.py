"""Exact-bit fingerprints and stats for torch tensors, computed on the tensor's device.

Same algorithm and same values as ``reprobisect.trace.fingerprint`` (see its docstring);
only the per-row sums, four statistics and the NaN/Inf counts leave the device. ``begin``
queues the device work without synchronising, ``finish_many`` brings the small results of
a whole step to the host in one transfer per device (``finish`` does one), so a recorder
synchronises once per step. Everything is taken at ``begin``, so nobody need hold the
tensor until ``finish``. On the host NaN/Inf are counted only for a tensor whose sum is not
finite; an accelerator counts them with the statistics (looking at the sum first would
synchronise).

Many tensors ready at one moment (the parameters after a step, their gradients, the
optimizer's state) on an accelerator go through ``reprobisect.runners.batched_torch``
instead: a constant number of device ops per device and dtype, whatever the number of
tensors; its pendings carry a ``batch`` that ``finish_many`` copies with the rest.

CPU tensors: the native kernel (``reprobisect.native``) reads each tensor once for its
row sums and statistics, near memory speed; the torch-op paths below are the fallback
when no kernel could be built, and the path for accelerators.

Torch-op path, CPU: each block of rows is widened once into an int64 scratch that stays in
cache (``copy_``) and reduced against the weights with one int64 ``mv`` (an exact
multiply-add modulo 2**64, like the reference): two passes instead of the three of
``mul(out=)`` + ``sum``, about 2x faster here. Accelerators keep ``mul`` + ``sum`` on
large blocks (integer ``mv`` is a CPU kernel). ``enable_compile`` (or
``REPROBISECT_FP_COMPILE=1``) opts in to a ``torch.compile``d row reduction for large
tensors: one fused read of the 32-bit lanes, near memory bandwidth, after a one-off
compile that costs tens of seconds on a small CPU (``scripts/bench/bench_fingerprint.py``
measures both); it falls back to the eager path if compiling fails. Every path gives
bit-identical row sums: the reduction is exact integer arithmetic modulo 2**64, so its
order does not matter.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reprobisect import native
from reprobisect.trace.fingerprint import ROW, column_weights, dtype_name, finish_fingerprint

__all__ = ["Pending", "begin", "begin_many", "enable_compile", "finish", "finish_many", "fingerprint", "fingerprint_and_stats",
           "norm"]

_weights: dict[torch.device, torch.Tensor] = {}
_CPU_BLOCK_ROWS = 8  # 256 KiB of int64 scratch: stays in L2 between copy_ and mv; 32768
# elements, at ATen's grain size, so copy_ does not fork threads per block (a loaded machine
# makes every fork-join wait for the slowest thread)
_ACCEL_BLOCK_ROWS = 4096  # accelerators: ~128 MiB of int64 scratch per block
_compile_min_bytes: int | None = None
_compiled: Any = None
_compile_failed = False


def enable_compile(min_bytes: int | None = 64 << 20) -> None:
    """Opt in to the ``torch.compile``d row reduction for tensors of at least ``min_bytes``.

    ``None`` turns it off. The first large tensor pays the compile (tens of seconds on a
    small CPU); values are identical either way.
    """
    global _compile_min_bytes
    _compile_min_bytes = min_bytes


if os.environ.get("REPROBISECT_FP_COMPILE", "").strip() not in ("", "0"):
    enable_compile()


def _rowsum_fused(grid: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (grid.to(torch.int64) * w).sum(1)


def _compiled_row_sums(grid: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    global _compiled, _compile_failed
    if _compile_failed:
        return None
    try:
        if _compiled is None:
            _compiled = torch.compile(_rowsum_fused, dynamic=True)
        return _compiled(grid, w)
    except Exception:  # no compiler, unsupported backend: the eager path gives the same value
        _compile_failed = True
        return None


def _device_weights(device: torch.device) -> torch.Tensor:
    w = _weights.get(device)
    if w is None:
        w = torch.from_numpy(column_weights().copy()).to(device)
        _weights[device] = w
    return w


def _lanes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous().reshape(-1)
    raw = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    if raw.numel() % 4:
        raw = torch.cat([raw, raw.new_zeros((-raw.numel()) % 4)])
    try:
        return raw.view(torch.int32)
    except RuntimeError:  # storage offset not 4-byte aligned
        return raw.clone().view(torch.int32)


def _row_sums(lanes: torch.Tensor) -> torch.Tensor:
    w = _device_weights(lanes.device)
    if lanes.device.type != "cpu":
        return _accel_row_sums(lanes, w)
    n = lanes.numel()
    full, rem = divmod(n, ROW)
    parts = []
    if full:
        grid = lanes[: full * ROW].view(full, ROW)
        out = None
        if _compile_min_bytes is not None and n * 4 >= _compile_min_bytes:
            out = _compiled_row_sums(grid, w)
        if out is None:
            out = _cpu_row_sums(grid, w)
        parts.append(out)
    if rem:
        parts.append((lanes[full * ROW :].to(torch.int64) * w[:rem]).sum().reshape(1))
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=lanes.device)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _cpu_row_sums(grid: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    full = grid.shape[0]
    block = _CPU_BLOCK_ROWS
    out = torch.empty(full, dtype=torch.int64)
    buf = torch.empty(min(block, full), ROW, dtype=torch.int64)
    for i in range(0, full, block):
        blk = grid[i : i + block]
        b = buf[: blk.shape[0]]
        b.copy_(blk)
        torch.mv(b, w, out=out[i : i + blk.shape[0]])
    return out


def _accel_row_sums(lanes: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Row sums in few kernel launches (each costs more than the arithmetic on a GPU):
    the partial last row zero-padded (zeros add nothing to a row sum), then one widening
    multiply and one sum per block of ``_ACCEL_BLOCK_ROWS`` rows (which bounds the int64
    scratch). Device-agnostic: tests run it on CPU too."""
    pad = (-lanes.numel()) % ROW
    if pad:
        lanes = torch.nn.functional.pad(lanes, (0, pad))
    grid = lanes.view(-1, ROW)
    rows = grid.shape[0]
    if rows <= _ACCEL_BLOCK_ROWS:
        return (grid * w).sum(1)
    return torch.cat([(grid[i : i + _ACCEL_BLOCK_ROWS] * w).sum(1) for i in range(0, rows, _ACCEL_BLOCK_ROWS)])


@dataclass(slots=True)
class Pending:
    """Device-side results of one fingerprint, not yet brought to the host."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    row_sums: torch.Tensor | np.ndarray  # ndarray: already on the host (native kernel)
    stats: torch.Tensor | list[float] | None  # [sum, norm, min, max] (float64 on device, or host floats)
    numel: int
    counts: tuple[int, int] | torch.Tensor | None = None  # (nan, inf), when already counted (on its device: int64)
    batch: Any = None  # a ``batched_torch.Batch`` holding this tensor's results (row_sums, stats unused)
    index: int = 0  # this tensor's place in ``batch``


_WIDE_UNSIGNED = {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
_STATS_BLOCK = 1 << 15  # elements: a 256 KiB float64 scratch, at ATen's grain size (no fork per block)


def _stats_tensor(t: torch.Tensor) -> torch.Tensor | None:
    t = t.detach()
    if t.numel() == 0:
        return None
    if t.is_complex():
        t = t.abs()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if t.dtype.is_floating_point and t.element_size() == 1:
        t = t.to(torch.float32)  # float8: torch cannot promote it in sum/norm
    elif t.dtype in _WIDE_UNSIGNED:
        t = t.to(torch.float64)  # uint16/32/64: torch has no min/max/sum kernels for them
    x = t.reshape(-1)
    if x.device.type == "cpu" and x.dtype != torch.float64 and x.numel() > _STATS_BLOCK:
        # sum(dtype=float64) widens the whole tensor out of cache: ~30x slower than the
        # float32 kernels here. Floats <= 32 bits: float32 sums and norms per row of ROW
        # elements (torch's cascade summation), combined in float64; relative error below ~1e-6
        # against NumPy's float64 stats, and the same bits give the same stats. Integers, or
        # a row that overflows float32: widen one cache-sized block at a time instead.
        if x.dtype.is_floating_point:
            st = _stats_rows(x)
            if st is not None:
                return st
        return _stats_blocked(x)
    if x.dtype.is_floating_point and x.dtype != torch.float64:
        s = torch.sum(x, dtype=torch.float64)
        sq = torch.linalg.vector_norm(x, dtype=torch.float64)
    else:
        x = x.to(torch.float64)
        s = x.sum()
        sq = torch.linalg.vector_norm(x)
    mn, mx = torch.aminmax(x)
    return torch.stack([s, sq, mn, mx])  # promoted to float64 in the one stack kernel


def _stats_rows(x: torch.Tensor) -> torch.Tensor | None:
    full = x.numel() // ROW
    grid = x[: full * ROW].view(full, ROW)
    s = torch.sum(grid, 1, dtype=torch.float32).to(torch.float64).sum()
    sq = torch.linalg.vector_norm(grid, dim=1, dtype=torch.float32).to(torch.float64).square().sum()
    tail = x[full * ROW :]
    if tail.numel():
        s = s + torch.sum(tail, dtype=torch.float64)
        sq = sq + torch.linalg.vector_norm(tail, dtype=torch.float64).square()
    mn, mx = torch.aminmax(x)
    out = torch.stack([s, sq.sqrt(), mn.to(torch.float64), mx.to(torch.float64)])
    if not bool(torch.isfinite(out[:2]).all()) and bool(torch.isfinite(out[2:]).all()):
        return None  # finite values whose float32 row sums overflowed: redo in float64
    return out


def _stats_blocked(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    nblocks = -(-n // _STATS_BLOCK)
    buf = torch.empty(_STATS_BLOCK, dtype=torch.float64)
    parts = torch.empty(2, nblocks, dtype=torch.float64)
    for j, i in enumerate(range(0, n, _STATS_BLOCK)):
        blk = x[i : i + _STATS_BLOCK]
        b = buf[: blk.numel()]
        b.copy_(blk)
        torch.sum(b, 0, out=parts[0, j])
        torch.dot(b, b, out=parts[1, j])
    if x.dtype.is_floating_point:
        mn, mx = torch.aminmax(x)
    else:
        mn, mx = x.min(), x.max()
    return torch.stack([parts[0].sum(), parts[1].sum().sqrt(), mn.to(torch.float64), mx.to(torch.float64)])


_NAMES: dict[torch.dtype, str] = {}
# dtypes whose bytes the native kernel reads as they are (complex takes the torch path: its
# stats are of abs; quantized and sub-byte dtypes too)
_PLAIN = {getattr(torch, n) for n in (
    "float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool") if hasattr(torch, n)}


def _name(dtype: torch.dtype) -> str:
    n = _NAMES.get(dtype)
    if n is None:
        n = _NAMES[dtype] = dtype_name(dtype)
    return n


def _native_ok(t: torch.Tensor) -> bool:
    return (
        t.is_cpu
        and type(t) is torch.Tensor  # not a subclass (fake, functional, distributed)
        and t.dtype in _PLAIN
        and t.layout == torch.strided
    )


def norm(t: torch.Tensor) -> float | torch.Tensor:
    """The L2 norm of ``t`` (a gradient: a sentinel step's total norm is made of these).

    A plain CPU float tensor: the square root of the native kernel's sum of squares, a float
    with the same bits as the ``norm`` statistic a full recording gives the same tensor,
    whatever the CPU's vector width (torch's own reduction order depends on it); a view (a
    channels-last gradient) through the kernel's strided pass, which computes them all.
    Otherwise a 0-dim tensor from torch ops, with no host synchronization on an accelerator
    (accumulated in float32 for floats up to 32 bits: float64 widening is many times slower).
    """
    if _native_ok(t) and (name := _name(t.dtype)) in native.SUMSQ_DTYPES and (k := native.kernel()) is not None:
        if t.is_contiguous():
            sq = k.sumsq(t.data_ptr(), t.numel() * t.element_size(), name)
            return math.sqrt(sq) if sq >= 0 else sq
        if 0 < t.dim() <= 16:
            st = k.run_strided(t.data_ptr(), t.element_size(), tuple(t.shape), t.stride(), name)[1]
            return math.sqrt(st[1]) if st and st[1] >= 0 else (st[1] if st else 0.0)
    small = t.is_floating_point() and t.element_size() <= 4
    return torch.linalg.vector_norm(t, dtype=torch.float32 if small else torch.float64)


def _begin_native(t: torch.Tensor, kernel: native.Kernel, with_stats: bool, name: str) -> Pending:
    numel = t.numel()
    es = t.element_size()
    nbytes = numel * es
    code = name if with_stats and name in native.DTYPE_CODES else None
    if t.is_contiguous() or t.dim() > 16:
        if not t.is_contiguous():
            t = t.detach().contiguous()
        sums, st, counts = kernel.run(t.data_ptr(), nbytes, code)
    else:  # a transposed or sliced view: gathered block by block, no full copy
        sums, st, counts = kernel.run_strided(t.data_ptr(), es, tuple(t.shape), t.stride(), code)
    return _native_pending(t, name, nbytes, sums, st, counts, with_stats, code is not None)


def _native_pending(t: torch.Tensor, name: str, nbytes: int, sums: np.ndarray, st: list[float] | None,
                    counts: tuple[int, int], with_stats: bool, coded: bool) -> Pending:
    """The Pending of the kernel's results for ``t`` (``coded``: the kernel computed its
    statistics; a dtype it has none for gets them from torch ops)."""
    numel = t.numel()
    stats: Any = None
    done: tuple[int, int] | torch.Tensor | None = None
    if coded and numel:
        stats = [st[0], math.sqrt(st[1]) if st[1] >= 0 else st[1], st[2], st[3]]
        done = (counts[0], counts[1])
    elif with_stats and not coded:
        stats = _stats_tensor(t)  # a dtype the kernel has no statistics for (float8, uint32...)
        done = _counts(t, stats)
    return Pending(name, tuple(t.shape), nbytes, sums, stats, numel, done)


def begin_many(ts: list[torch.Tensor], with_stats: bool = True) -> list[Pending]:
    """``begin`` for tensors ready at one moment (a step's parameters and optimizer state on
    CPU): the plain contiguous ones go through the native kernel in one call, whose cost
    from Python is most of what a small tensor costs one by one; the rest one by one."""
    k = native.kernel()
    out: list[Any] = [None] * len(ts)
    todo: list[tuple[int, torch.Tensor, str]] = []
    items: list[tuple[int, int, str | None]] = []
    for i, t in enumerate(ts):
        if type(t) is not torch.Tensor:  # a Parameter (detached: a plain tensor); nothing here is differentiated
            t = t.detach()
        if k is None or t.is_neg() or t.is_conj() or not _native_ok(t) or not t.is_contiguous():
            out[i] = begin(t, with_stats)
            continue
        name = _name(t.dtype)
        todo.append((i, t, name))
        items.append((t.data_ptr(), t.numel() * t.element_size(),
                      name if with_stats and name in native.DTYPE_CODES else None))
    if todo:
        rows, starts, stats, counts = k.run_many(items)
        bounds = starts.tolist()  # Python ints: slicing with NumPy scalars costs several times more
        for j, (i, t, name) in enumerate(todo):
            out[i] = _native_pending(t, name, items[j][1], rows[bounds[j]:bounds[j + 1]], stats[j], counts[j],
                                     with_stats, items[j][2] is not None)
    return out


def begin(t: torch.Tensor, with_stats: bool = True) -> Pending:
    """Queue the fingerprint (and stats) of ``t`` on its own device; no host sync.

    A plain CPU tensor goes through the native kernel (one pass, ``reprobisect.native``)
    when it could be built; anything else, or no kernel, through torch ops on the
    tensor's device. Both give the same fingerprint.
    """
    if _native_ok(t) and not (t.is_neg() or t.is_conj()):  # the common case first: the kernel reads its bytes
        k = native.kernel()
        if k is not None:
            return _begin_native(t, k, with_stats, _name(t.dtype))
    t = t.detach()
    if t.is_neg() or t.is_conj():  # lazily negated/conjugated views: their bytes are not their values
        t = t.resolve_neg().resolve_conj()
    name = _name(t.dtype)
    if _native_ok(t):
        k = native.kernel()
        if k is not None:
            return _begin_native(t, k, with_stats, name)
    nbytes = t.numel() * t.element_size()
    sums = _row_sums(_lanes(t))
    st = _stats_tensor(t) if with_stats else None
    return Pending(
        dtype=name,
        shape=tuple(t.shape),
        nbytes=nbytes,
        row_sums=sums,
        stats=st,
        numel=t.numel(),
        counts=_counts(t, st),
    )


def _counts(t: torch.Tensor, st: torch.Tensor | None) -> tuple[int, int] | torch.Tensor | None:
    """``t``'s NaN and Inf counts (None without statistics ``st``), taken now so that nobody
    need hold ``t`` to the step's end (an activation held that long outlives its backward).
    On the host they cost a pass only when the sum is not finite (a finite sum means
    neither); an accelerator counts on the device, two reductions, rather than
    synchronising to look at the sum first."""
    if st is None:
        return None
    t = t.detach()
    if not (t.is_floating_point() or t.is_complex()):
        return (0, 0)
    on_host = st.device.type == "cpu"
    if on_host and math.isfinite(st[0].item()):
        return (0, 0)
    if t.is_floating_point() and t.element_size() == 1:
        t = t.float()  # float8: no isnan/isinf kernels
    counts = torch.stack([torch.isnan(t).sum(), torch.isinf(t).sum()])
    return (int(counts[0]), int(counts[1])) if on_host else counts


def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def finish(p: Pending) -> tuple[str, dict[str, Any] | None]:
    """Bring a pending fingerprint to the host: ``(fingerprint, stats)``.

    Everything was computed when it was begun, NaN and Inf counts included (on the host
    only when the sum is not finite: a clean tensor costs no extra pass), so nothing need
    hold the tensor until now: an activation held to the step's end would outlive its
    backward.
    """
    return finish_many([p])[0]


def finish_many(items: list[Pending]) -> list[tuple[str, dict[str, Any] | None]]:
    """``finish`` for many pendings, with one host transfer per accelerator device.

    The row sums and stats of every pending on one device are concatenated there and
    copied once (one synchronisation), instead of two copies per tensor. CPU pendings
    are read in place. Same values as ``finish`` one by one.
    """
    host: list[tuple[np.ndarray, list[float] | None, Any]] = [None] * len(items)  # type: ignore[list-item]
    by_device: dict[torch.device, list[int]] = {}
    batches: dict[torch.device, dict[int, Any]] = {}  # batched results not yet on the host
    for k, p in enumerate(items):
        if p.batch is not None:
            if p.batch.host is None:
                batches.setdefault(p.batch.result.device, {})[id(p.batch)] = p.batch
        elif isinstance(p.row_sums, np.ndarray):
            host[k] = (p.row_sums, p.stats if not isinstance(p.stats, torch.Tensor) else p.stats.tolist(), p.counts)
        elif p.row_sums.device.type == "cpu":
            host[k] = (p.row_sums.numpy(), p.stats.tolist() if p.stats is not None else None, p.counts)
        else:
            by_device.setdefault(p.row_sums.device, []).append(k)
    for device in set(by_device) | set(batches):
        ks = by_device.get(device, [])
        parts = []
        for k in ks:
            p = items[k]
            parts.append(p.row_sums)
            if p.stats is not None:
                parts.append(p.stats.view(torch.int64))
            if isinstance(p.counts, torch.Tensor):
                parts.append(p.counts.to(torch.int64))
        group = list(batches.get(device, {}).values())
        parts += [b.result for b in group]
        flat = (parts[0] if len(parts) == 1 else torch.cat(parts)).cpu().numpy()
        end = len(flat)
        for b in reversed(group):  # the batches' results come last, in order
            b.host, end = flat[end - b.result.numel() : end], end - b.result.numel()
        at = 0
        for k in ks:
            p = items[k]
            n = p.row_sums.numel()
            sums = flat[at : at + n]
            at += n
            st, counts = None, p.counts
            if p.stats is not None:
                st = flat[at : at + 4].view(np.float64).tolist()
                at += 4
            if isinstance(counts, torch.Tensor):
                counts = (int(flat[at]), int(flat[at + 1]))
                at += 2
            host[k] = (sums, st, counts)
    for k, p in enumerate(items):
        if p.batch is not None:
            host[k] = p.batch.item(p.index)
    return [_finish_host(p, *host[k]) for k, p in enumerate(items)]


def _finish_host(p: Pending, row_sums: np.ndarray, st: list[float] | None,
                 counts: tuple[int, int] | None) -> tuple[str, dict[str, Any] | None]:
    fp = finish_fingerprint(p.dtype, p.shape, p.nbytes, row_sums)
    if st is None:
        if p.numel == 0:
            return fp, {"norm": 0.0, "min": "nan", "max": "nan", "mean": "nan", "nan": 0, "inf": 0}
        return fp, None
    s, norm, mn, mx = st
    nan, inf = counts if counts is not None else (0, 0)
    mean = s / p.numel
    if math.isfinite(norm + mn + mx + mean):  # all four finite (NaN/Inf, or an overflow: one by one)
        return fp, {"norm": norm, "min": mn, "max": mx, "mean": mean, "nan": nan, "inf": inf}
    return fp, {
        "norm": _json_float(norm),
        "min": _json_float(mn),
        "max": _json_float(mx),
        "mean": _json_float(mean),
        "nan": nan,
        "inf": inf,
    }


def fingerprint(t: torch.Tensor) -> str:
    """Exact-bit fingerprint of a torch tensor; equal to the NumPy one for the same bits."""
    return finish(begin(t, with_stats=False))[0]


def fingerprint_and_stats(t: torch.Tensor) -> tuple[str, dict[str, Any] | None]:
    return finish(begin(t))
