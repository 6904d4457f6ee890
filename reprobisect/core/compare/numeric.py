"""Numeric comparison of one pair of records: bits, tolerance, ULP distance.

Equal fingerprints mean equal bits, so a pair of identical records is judged without
reading a tensor. When fingerprints differ, the tolerance decides: full tensors (when both
sides stored them) give max abs / max rel error, mismatch count, first mismatching index
and ULP distance, measured chunk by chunk in bounded memory (NaN by position, -0.0 equal
to 0.0 under a value tolerance); otherwise the recorded stats are used, and only when
they prove the difference exceeds the tolerance (NaN/Inf counts apart, or min, max, mean or
norm apart by more than any within-tolerance pairing allows); a difference the stats cannot
size is ``inconclusive`` ("bits differ, size not measured"), never silently close and never
an unmeasured "diverged". Under the bitwise tolerance a bit difference is the measure. Shape and dtype mismatches are structural and answered first.

Pure NumPy (bfloat16/float8 via ml_dtypes): no ML framework is imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reprobisect.core.compare.results import UNMEASURED, TensorDiff
from reprobisect.core.compare.tolerance import Tolerance, _is_float
from reprobisect.trace.format import Record
from reprobisect.trace.reader import Trace

__all__ = ["compare_records"]

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        x = x.view(np.float32 if x.dtype.itemsize == 8 else np.float64)
    return x.view(_UINT[x.dtype.itemsize])


def _ulp_distance(a: np.ndarray, b: np.ndarray, valid: np.ndarray) -> int | None:
    """Largest distance in units in the last place over ``valid`` positions (IEEE floats only)."""
    if a.dtype.kind == "c" or a.dtype.itemsize not in (2, 4, 8) or not _is_float(str(a.dtype)):
        return None
    if not valid.any():
        return 0
    width = a.dtype.itemsize * 8
    ut = _UINT[a.dtype.itemsize]
    sign = ut(1 << (width - 1))
    ua, ub = a.view(ut)[valid].astype(np.uint64), b.view(ut)[valid].astype(np.uint64)
    bias = np.uint64(1 << 63)

    def ordered(u: np.ndarray) -> np.ndarray:
        mag = u & np.uint64(int(sign) - 1)
        neg = (u & np.uint64(int(sign))) != 0
        return np.where(neg, bias - mag, bias + mag)  # -0.0 and +0.0 both map to bias

    oa, ob = ordered(ua), ordered(ub)
    d = np.where(oa >= ob, oa - ob, ob - oa)
    return int(d.max())


_CHUNK = 1 << 20  # elements per chunk: metrics in bounded memory, chunks with equal bits skipped


@dataclass
class _Metrics:
    """Running figures of one tensor pair, chunk by chunk (``_measure``)."""

    is_float: bool
    ulp: int | None  # None: not an IEEE float of 2, 4 or 8 bytes (no ULP distance)
    count: int = 0  # mismatching elements
    nonfinite: int = 0  # of those, involving NaN/Inf
    first: int | None = None  # flat index of the first mismatch
    max_abs: float = 0.0
    max_rel: float = 0.0
    nan: list[int] = field(default_factory=lambda: [0, 0])
    inf: list[int] = field(default_factory=lambda: [0, 0])
    any_bits: bool = False  # some bits differ


def _measure(x: np.ndarray, y: np.ndarray, rule: tuple[float, float] | None, dtype: str) -> TensorDiff:
    """Metrics from two full tensors of the same dtype and shape, chunk by chunk."""
    total = int(x.size)
    if total == 0:
        return TensorDiff("identical", "tensors", total=0, mismatched=0, bitwise=rule is None)
    is_float = _is_float(dtype)
    fx, fy = x.reshape(-1), y.reshape(-1)
    bx, by = _bits(fx), _bits(fy)
    lanes = bx.size // fx.size  # 2 for complex (real, imaginary)
    m = _Metrics(is_float, 0 if is_float and x.dtype.kind != "c" and x.dtype.itemsize in (2, 4, 8) else None)
    with np.errstate(all="ignore"):
        for lo in range(0, total, _CHUNK):
            hi = min(total, lo + _CHUNK)
            bit_diff = bx[lo * lanes : hi * lanes] != by[lo * lanes : hi * lanes]
            if lanes > 1:
                bit_diff = bit_diff.reshape(-1, lanes).any(-1)
            _measure_chunk(m, fx[lo:hi], fy[lo:hi], bit_diff, lo, rule)
    return _measured(m, x.shape, total, rule)


def _measure_chunk(m: _Metrics, xa: np.ndarray, ya: np.ndarray, bit_diff: np.ndarray, lo: int,
                   rule: tuple[float, float] | None) -> None:
    """Fold one chunk (flat elements from ``lo``) into ``m``; a chunk with equal bits adds only NaN/Inf counts."""
    if m.is_float:
        wide = np.complex128 if xa.dtype.kind == "c" else np.float64
        fa, fb = xa.astype(wide), ya.astype(wide)
        nan_a, nan_b = np.isnan(fa), np.isnan(fb)
        m.nan[0] += int(nan_a.sum())
        m.nan[1] += int(nan_b.sum())
        m.inf[0] += int(np.isinf(fa).sum())
        m.inf[1] += int(np.isinf(fb).sum())
    if not bit_diff.any():
        return
    m.any_bits = True
    if not m.is_float:
        fa, fb = xa.astype(np.float64), ya.astype(np.float64)
        nan_a = nan_b = np.zeros(fa.shape, bool)
    both_finite = np.isfinite(fa) & np.isfinite(fb)
    absdiff = np.where(both_finite, np.abs(fa - fb), 0.0)
    absb = np.abs(fb)
    if rule is None:
        mismatch = bit_diff
    else:
        atol, rtol = rule
        same = (fa == fb) | (nan_a & nan_b)  # -0.0 == 0.0, inf == inf, NaN by position
        mismatch = ~same & ~(both_finite & (absdiff <= atol + rtol * np.where(both_finite, absb, 0.0)))
    c = int(np.count_nonzero(mismatch))
    if c and m.first is None:
        m.first = lo + int(np.argmax(mismatch))
    m.count += c
    m.nonfinite += int(np.count_nonzero(mismatch & ~both_finite))
    m.max_abs = max(m.max_abs, float(absdiff.max()))
    rel = np.where(absdiff > 0, absdiff / np.where(absb > 0, absb, 1.0), 0.0)
    rel = np.where((absdiff > 0) & (absb == 0), np.inf, rel)
    m.max_rel = max(m.max_rel, float(rel.max()))
    if m.ulp is not None:
        m.ulp = max(m.ulp, _ulp_distance(xa, ya, ~(nan_a | nan_b)) or 0)


def _measured(m: _Metrics, shape: tuple[int, ...], total: int, rule: tuple[float, float] | None) -> TensorDiff:
    """The verdict and figures of a measured pair."""
    first_index = tuple(int(i) for i in np.unravel_index(m.first, shape)) if m.first is not None else None
    notes = []
    if m.nonfinite:
        notes.append(f"{m.nonfinite} mismatch(es) involve NaN/Inf (max abs/rel cover finite pairs only)")
    if m.count:
        verdict = "diverged"
    elif not m.any_bits:
        verdict = "diverged"
        notes.append("fingerprints differ but the stored tensors are bit-identical (inconsistent trace)")
    else:
        verdict = "close" if rule is not None else "diverged"
    return TensorDiff(
        verdict,
        "tensors",
        detail="; ".join(notes),
        max_abs=m.max_abs,
        max_rel=m.max_rel,
        mismatched=m.count,
        total=total,
        first_index=first_index,
        max_ulp=m.ulp,
        nan=(m.nan[0], m.nan[1]) if m.is_float else (0, 0),
        inf=(m.inf[0], m.inf[1]) if m.is_float else (0, 0),
        atol=None if rule is None else rule[0],
        rtol=None if rule is None else rule[1],
        bitwise=rule is None,
    )


def _from_stats(ra: Record, rb: Record, rule: tuple[float, float] | None) -> TensorDiff:
    """Judge a bit difference from the recorded stats alone (no full tensors on both sides)."""
    total = int(np.prod(ra.shape, dtype=np.int64)) if ra.shape else 1
    kw: dict[str, Any] = {"total": total, "bitwise": rule is None}
    if rule is not None:
        kw.update(atol=rule[0], rtol=rule[1])
    if not ra.stats or not rb.stats:
        if rule is None:
            return TensorDiff("diverged", "fingerprint", detail="bits differ (bitwise); no tensors or stats stored", **kw)
        return TensorDiff("inconclusive", "fingerprint", detail=f"{UNMEASURED}; no stats either", **kw)
    deltas: dict[str, float] = {}
    for k in ("norm", "min", "max", "mean"):
        va, vb = ra.stat(k), rb.stat(k)
        if va is not None and vb is not None:
            deltas[k] = abs(va - vb) if not (math.isnan(va) and math.isnan(vb)) else 0.0
    nan = (int(ra.stat("nan") or 0), int(rb.stat("nan") or 0))
    inf = (int(ra.stat("inf") or 0), int(rb.stat("inf") or 0))
    kw.update(stat_deltas=deltas, nan=nan, inf=inf)
    if rule is None:
        return TensorDiff("diverged", "stats", detail="bits differ (bitwise); sized from stats, no tensors stored", **kw)
    atol, rtol = rule
    if nan[0] != nan[1] or inf[0] != inf[1]:
        return TensorDiff("diverged", "stats", detail=f"NaN/Inf counts differ (NaN {nan[0]} vs {nan[1]}, Inf {inf[0]} vs {inf[1]})", **kw)
    # If every element were within tolerance, |a_i - b_i| <= atol + rtol*max|b| =: bound, so
    # min, max and mean move by at most bound and the norm by at most sqrt(n)*bound.
    mn, mx = rb.stat("min"), rb.stat("max")
    if mn is not None and mx is not None and math.isfinite(mn) and math.isfinite(mx):
        big = max(abs(mn), abs(mx))
        bound = atol + rtol * big
        # sums and norms are rounded (float32 rows on the torch CPU path: ~1e-6 relative),
        # so allow that much on top; min and max are exact
        eps = 1e-6 * big
        norm_eps = 1e-6 * max(abs(ra.stat("norm") or 0.0), abs(rb.stat("norm") or 0.0))
        limits = {"min": bound, "max": bound, "mean": bound + eps, "norm": math.sqrt(total) * bound + norm_eps}
        for k, lim in limits.items():
            d = deltas.get(k)
            if d is not None and math.isfinite(d) and d > lim * (1 + 1e-9) + 1e-300:
                return TensorDiff(
                    "diverged", "stats",
                    detail=f"{k} moved by {d:.3g}, more than any within-tolerance change allows ({lim:.3g})",
                    **kw,
                )
    # nothing proves the size: within the tolerance or beyond it, the stats cannot tell
    return TensorDiff("inconclusive", "fingerprint", detail=UNMEASURED, **kw)


def compare_records(
    a: Trace | None, b: Trace | None, step: int, ra: Record, rb: Record, tolerance: Tolerance
) -> TensorDiff:
    """Compare one pair of records (the same key at the same step) under ``tolerance``.

    Reads full tensors only when the fingerprints differ and both traces stored them.
    """
    if ra.dtype != rb.dtype:
        return TensorDiff("dtype", "structure", detail=f"dtype {ra.dtype} vs {rb.dtype}")
    if tuple(ra.shape) != tuple(rb.shape):
        return TensorDiff("shape", "structure", detail=f"shape {tuple(ra.shape)} vs {tuple(rb.shape)}")
    rule = tolerance.rule(ra.kind, ra.name, ra.dtype)
    if ra.fingerprint == rb.fingerprint:
        return TensorDiff("identical", "fingerprint", bitwise=rule is None,
                          atol=None if rule is None else rule[0], rtol=None if rule is None else rule[1])
    if a is not None and b is not None and ra.stored and rb.stored:
        x, y = a.tensor(step, ra), b.tensor(step, rb)
        if x is not None and y is not None and x.dtype == y.dtype and x.shape == y.shape:
            return _measure(x, y, rule, ra.dtype)
    return _from_stats(ra, rb, rule)
