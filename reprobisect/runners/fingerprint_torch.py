"""Exact-bit fingerprints and stats for torch tensors, computed on the tensor's device.

Same algorithm and same values as ``reprobisect.trace.fingerprint`` (see its docstring);
only the per-row sums and four statistics leave the device. ``begin`` queues the device
work without synchronising, ``finish_many`` brings the small results of a whole step to
the host in one transfer per device (``finish`` does one), so a recorder synchronises once
per step. NaN/Inf are counted only for a tensor whose sum is not finite.

Opt-in (``REPROBISECT_FP_FUSED_ROWS=8``): large float32/bfloat16/float16 CPU tensors with
stats take one walk (``_fused_cpu``), fingerprint and stats of each cache-sized block while
it is in cache, no op forking threads: much cheaper on a machine loaded by other work,
~10-20% dearer on an idle one, hence off by default.

Speed (CPU): each block of rows is widened once into an int64 scratch that stays in
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

from reprobisect.trace.fingerprint import ROW, column_weights, dtype_name, finish_fingerprint

__all__ = ["Pending", "begin", "enable_compile", "finish", "finish_many", "fingerprint", "fingerprint_and_stats"]

_weights: dict[torch.device, torch.Tensor] = {}
_BLOCK_ROWS = {"cpu": 8}  # 256 KiB of int64 scratch: stays in L2 between copy_ and mv; 32768
# elements, at ATen's grain size, so copy_ does not fork threads per block (a loaded machine
# makes every fork-join wait for the slowest thread)
_DEFAULT_BLOCK_ROWS = 4096  # accelerators: ~128 MiB of int64 scratch per block
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
    n = lanes.numel()
    full, rem = divmod(n, ROW)
    parts = []
    if full:
        grid = lanes[: full * ROW].view(full, ROW)
        out = None
        if _compile_min_bytes is not None and n * 4 >= _compile_min_bytes:
            out = _compiled_row_sums(grid, w)
        if out is None:
            out = _eager_row_sums(grid, w)
        parts.append(out)
    if rem:
        parts.append((lanes[full * ROW :].to(torch.int64) * w[:rem]).sum().reshape(1))
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=lanes.device)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _eager_row_sums(grid: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    full = grid.shape[0]
    cpu = grid.device.type == "cpu"
    block = _BLOCK_ROWS.get(grid.device.type, _DEFAULT_BLOCK_ROWS)
    out = torch.empty(full, dtype=torch.int64, device=grid.device)
    buf = torch.empty(min(block, full), ROW, dtype=torch.int64, device=grid.device)
    for i in range(0, full, block):
        blk = grid[i : i + block]
        b = buf[: blk.shape[0]]
        if cpu:
            b.copy_(blk)
            torch.mv(b, w, out=out[i : i + blk.shape[0]])
        else:
            torch.mul(blk, w, out=b)
            torch.sum(b, 1, out=out[i : i + blk.shape[0]])
    return out


@dataclass
class Pending:
    """Device-side results of one fingerprint, not yet brought to the host."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    row_sums: torch.Tensor
    stats: torch.Tensor | None  # [sum, norm, min, max] in float64, on device
    numel: int


_STATS_BLOCK = 1 << 15  # elements: a 256 KiB float64 scratch, at ATen's grain size (no fork per block)


def _stats_tensor(t: torch.Tensor) -> torch.Tensor | None:
    t = t.detach()
    if t.numel() == 0:
        return None
    if t.is_complex():
        t = t.abs()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
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
    return torch.stack([s, sq, mn.to(torch.float64), mx.to(torch.float64)])


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


# rows of lanes per block of the one-walk CPU path (see _fused_cpu); 0 (the default) turns
# it off: on an idle machine it is slower than the separate passes, see _fused_cpu
_FUSED_BLOCK_ROWS = int(os.environ.get("REPROBISECT_FP_FUSED_ROWS", "0") or 0)
_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float8 cannot be promoted by sum/norm


def _fused_ok(t: torch.Tensor) -> bool:
    """float32/bfloat16/float16 on CPU, large enough to block: fingerprint and stats in one walk."""
    return (
        _FUSED_BLOCK_ROWS > 0
        and t.device.type == "cpu"
        and t.dtype in _FUSED_DTYPES
        and t.numel() > _STATS_BLOCK
        and (_compile_min_bytes is None or t.numel() * t.element_size() < _compile_min_bytes)
    )


def _fused_cpu(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row sums and ``[sum, norm, min, max]`` of a CPU float tensor in one walk over its blocks.

    Each block (``_FUSED_BLOCK_ROWS`` rows of lanes: 32768 float32 values, 256 KiB of
    int64 scratch) is read once from memory: widened and reduced for the fingerprint (as
    ``_eager_row_sums``: bit-identical row sums), then, while it is still in cache, summed
    in float32 (torch's cascade summation), normed per row of ``ROW`` values in float32
    and min/maxed; the partial figures are combined in float64 (relative error below
    ~1e-6 against NumPy's float64 stats; the same bits give the same stats, whatever the
    machine's load). Per-row (``dim=1``) sums and aminmax are avoided: on CPU they cost
    several times the whole-block kernels (the per-row norm does not, and is more accurate
    than a block's). Every op stays at ATen's grain size, so nothing forks threads.
    Measured on the example models' tensors (``scripts/bench/bench_recorder.py --cost``,
    2 cores): on a loaded machine the whole-tensor stats ops (one fork-join each, waiting
    for the slowest thread) cost 3-6x the fingerprint; this walk is several times cheaper
    there, and ~10-20% dearer than them on an idle machine (single-threaded; whole-step
    recorder ratio 1.63x vs 1.54x on the transformer, 2.54x vs 2.34x on the MLP), so it
    is opt-in. Larger blocks (32 rows) tie idle but fork per op and lose badly under load.
    """
    x = t.contiguous().reshape(-1)
    lanes = _lanes(x)
    w = _device_weights(lanes.device)
    per = 4 // x.element_size()  # values per lane
    n = lanes.numel()
    full = n // ROW
    block = _FUSED_BLOCK_ROWS
    nb = -(-full // block)
    out = torch.empty(full, dtype=torch.int64)
    fs = torch.empty(nb, dtype=torch.float32)  # per block: sum
    fn = torch.empty(full * per, dtype=torch.float32)  # per row of ROW values: norm
    mm = torch.empty(2, nb, dtype=x.dtype)  # per block: min, max
    buf = torch.empty(min(block, full), ROW, dtype=torch.int64)
    grid = lanes[: full * ROW].view(full, ROW)
    vals = x[: full * ROW * per]
    vblock = block * ROW * per
    for q, i in enumerate(range(0, full, block)):
        k = min(block, full - i)
        b = buf[:k]
        b.copy_(grid[i : i + k])
        torch.mv(b, w, out=out[i : i + k])
        vb = vals[q * vblock : q * vblock + k * ROW * per]
        torch.sum(vb, 0, dtype=torch.float32, out=fs[q])
        torch.linalg.vector_norm(vb.view(-1, ROW), 2, dim=1, dtype=torch.float32, out=fn[i * per : (i + k) * per])
        torch.aminmax(vb, out=(mm[0, q], mm[1, q]))
    rem = n - full * ROW
    sums = out
    if rem:
        tail_sum = (lanes[full * ROW :].to(torch.int64) * w[:rem]).sum().reshape(1)
        sums = torch.cat([out, tail_sum])
    s = fs.to(torch.float64).sum()
    sq = fn.to(torch.float64).square().sum()
    lo, hi = mm[0].min(), mm[1].max()
    tail = x[full * ROW * per :]
    if tail.numel():
        s = s + torch.sum(tail, dtype=torch.float64)
        sq = sq + torch.linalg.vector_norm(tail, dtype=torch.float64).square()
        tmn, tmx = torch.aminmax(tail)
        lo, hi = torch.minimum(lo, tmn), torch.maximum(hi, tmx)
    st = torch.stack([s, sq.sqrt(), lo.to(torch.float64), hi.to(torch.float64)])
    # CPU only, so reading these four numbers is no device sync
    s_, n_, lo_, hi_ = st.tolist()
    if not (math.isfinite(s_) and math.isfinite(n_)) and math.isfinite(lo_) and math.isfinite(hi_):
        st = _stats_blocked(x)  # finite values whose float32 block sums overflowed: redo in float64
    return sums, st


def begin(t: torch.Tensor, with_stats: bool = True) -> Pending:
    """Queue the fingerprint (and stats) of ``t`` on its own device; no host sync."""
    t = t.detach()
    nbytes = t.numel() * t.element_size()
    if with_stats and _fused_ok(t):
        sums, st = _fused_cpu(t)
    else:
        sums = _row_sums(_lanes(t))
        st = _stats_tensor(t) if with_stats else None
    return Pending(
        dtype=dtype_name(t.dtype),
        shape=tuple(t.shape),
        nbytes=nbytes,
        row_sums=sums,
        stats=st,
        numel=t.numel(),
    )


def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def finish(p: Pending, source: torch.Tensor | None = None) -> tuple[str, dict[str, Any] | None]:
    """Bring a pending fingerprint to the host: ``(fingerprint, stats)``.

    NaN and Inf are counted only when the sum is not finite (a clean tensor costs no
    extra pass); that needs ``source``, the tensor itself, still alive.
    """
    return finish_many([(p, source)])[0]


def finish_many(items: list[tuple[Pending, torch.Tensor | None]]) -> list[tuple[str, dict[str, Any] | None]]:
    """``finish`` for many pendings, with one host transfer per accelerator device.

    The row sums and stats of every pending on one device are concatenated there and
    copied once (one synchronisation), instead of two copies per tensor. CPU pendings
    are read in place. Same values as ``finish`` one by one.
    """
    host: list[tuple[np.ndarray, list[float] | None]] = [None] * len(items)  # type: ignore[list-item]
    by_device: dict[torch.device, list[int]] = {}
    for k, (p, _) in enumerate(items):
        if p.row_sums.device.type == "cpu":
            host[k] = (p.row_sums.numpy(), p.stats.tolist() if p.stats is not None else None)
        else:
            by_device.setdefault(p.row_sums.device, []).append(k)
    for ks in by_device.values():
        parts = []
        for k in ks:
            p = items[k][0]
            parts.append(p.row_sums)
            if p.stats is not None:
                parts.append(p.stats.view(torch.int64))
        flat = torch.cat(parts).cpu().numpy()
        at = 0
        for k in ks:
            p = items[k][0]
            n = p.row_sums.numel()
            sums = flat[at : at + n]
            at += n
            st = None
            if p.stats is not None:
                st = flat[at : at + 4].view(np.float64).tolist()
                at += 4
            host[k] = (sums, st)
    return [_finish_host(p, *host[k], source) for k, (p, source) in enumerate(items)]


def _finish_host(p: Pending, row_sums: np.ndarray, st: list[float] | None, source: torch.Tensor | None) -> tuple[str, dict[str, Any] | None]:
    fp = finish_fingerprint(p.dtype, p.shape, p.nbytes, row_sums)
    if st is None:
        if p.numel == 0:
            return fp, {"norm": 0.0, "min": "nan", "max": "nan", "mean": "nan", "nan": 0, "inf": 0}
        return fp, None
    s, norm, mn, mx = st
    nan = inf = 0
    if not math.isfinite(s) and source is not None:
        d = source.detach()
        nan = int(torch.isnan(d).sum()) if d.is_floating_point() or d.is_complex() else 0
        inf = int(torch.isinf(d).sum()) if d.is_floating_point() or d.is_complex() else 0
    return fp, {
        "norm": _json_float(norm),
        "min": _json_float(mn),
        "max": _json_float(mx),
        "mean": _json_float(s / p.numel),
        "nan": nan,
        "inf": inf,
    }


def fingerprint(t: torch.Tensor) -> str:
    """Exact-bit fingerprint of a torch tensor; equal to the NumPy one for the same bits."""
    return finish(begin(t, with_stats=False))[0]


def fingerprint_and_stats(t: torch.Tensor) -> tuple[str, dict[str, Any] | None]:
    return finish(begin(t), source=t)
