"""Exact-bit tensor fingerprints and summary statistics, for NumPy arrays.

One algorithm, implemented here for NumPy and in ``reprobisect.runners.fingerprint_torch``
for torch tensors on any device; both give the same value for the same bits.

The tensor's bytes (padded with zeros to a multiple of 4) are read as signed 32-bit lanes
and cut into rows of ``ROW`` lanes. Each row is reduced on the tensor's own device to one
64-bit weighted sum: sign-extend every lane to 64 bits, multiply by a fixed odd 64-bit
weight for its column, add modulo 2**64. Only the row sums leave the device; the
fingerprint is BLAKE2b over (version, dtype, shape, byte count, row sums).

Why this shape: one flipped bit changes a lane by ``±2**k`` (k < 32), which an odd weight
keeps nonzero modulo 2**64, so a single flipped bit always changes the fingerprint.
Column weights make the sum position-sensitive inside a row, and hashing the row sums in
order makes it position-sensitive across rows (unlike an XOR reduction). Reading 32-bit
lanes into a 64-bit ring keeps every difference below 2**32, so patterned differences
(every sign bit flipped) still leave ~2**-32 odds of a collision rather than cancelling.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

__all__ = [
    "FINGERPRINT_VERSION",
    "ROW",
    "column_weights",
    "dtype_name",
    "finish_fingerprint",
    "fingerprint",
    "stats",
    "fingerprint_and_stats",
]

FINGERPRINT_VERSION = 1
ROW = 4096
_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


_WEIGHTS: np.ndarray | None = None


def column_weights() -> np.ndarray:
    """The ``ROW`` odd 64-bit column weights, as int64 (shared by every backend)."""
    global _WEIGHTS
    if _WEIGHTS is None:
        w = np.array([_splitmix64(j) | 1 for j in range(ROW)], dtype=np.uint64)
        _WEIGHTS = w.view(np.int64)
        _WEIGHTS.setflags(write=False)
    return _WEIGHTS


def dtype_name(dtype: Any) -> str:
    """Canonical dtype name shared by NumPy, ml_dtypes, torch and TensorFlow."""
    name = str(dtype)
    for prefix in ("torch.", "<dtype: '", "dtype("):
        if name.startswith(prefix):
            name = name[len(prefix):]
    name = name.strip("'>)\"")
    return {"bool_": "bool", "float": "float32", "double": "float64", "half": "float16"}.get(name, name)


_HEADS: dict[tuple[str, tuple[int, ...], int], Any] = {}
"""The hash state after a (dtype, shape, size) header, copied for each tensor of that layout
(a recorder fingerprints the same layouts every step: half the per-tensor hashing cost)."""


def finish_fingerprint(dtype: str, shape: tuple[int, ...], nbytes: int, row_sums: np.ndarray) -> str:
    """Hash the per-row sums together with dtype, shape and size into the fingerprint."""
    key = (dtype, tuple(shape), nbytes)
    head = _HEADS.get(key)
    if head is None:
        head = hashlib.blake2b(digest_size=16)
        head.update(f"rbfp{FINGERPRINT_VERSION}|{dtype}|{','.join(map(str, shape))}|{nbytes}|".encode())
        if len(_HEADS) >= 4096:
            _HEADS.clear()
        _HEADS[key] = head
    h = head.copy()
    if row_sums.dtype == _I8 and row_sums.flags.c_contiguous:  # (the kernels' own: hashed in place)
        h.update(row_sums)
    else:
        h.update(np.ascontiguousarray(row_sums, dtype=_I8).tobytes())
    return h.hexdigest()


_I8 = np.dtype("<i8")


def _lanes(a: np.ndarray) -> np.ndarray:
    raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    pad = (-raw.size) % 4
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    return raw.view("<i4")


def _row_sums(lanes: np.ndarray, block_rows: int = 8) -> np.ndarray:
    # Widen a block of rows into an int64 scratch that stays in cache, then one integer
    # dot against the weights (exact, wrapping modulo 2**64): two passes, ~2x faster than
    # multiply + sum.
    w = column_weights()
    n = lanes.size
    full = n // ROW
    rem = n - full * ROW
    out = np.empty(full + (1 if rem else 0), dtype=np.int64)
    if full:
        grid = lanes[: full * ROW].reshape(full, ROW)
        buf = np.empty((min(block_rows, full), ROW), dtype=np.int64)
        for i in range(0, full, block_rows):
            blk = grid[i : i + block_rows]
            b = buf[: blk.shape[0]]
            b[...] = blk
            np.dot(b, w, out=out[i : i + blk.shape[0]])
    if rem:
        out[-1] = np.sum(lanes[full * ROW :].astype(np.int64) * w[:rem], dtype=np.int64)
    return out


def fingerprint(a: np.ndarray) -> str:
    """Exact-bit fingerprint of a NumPy array (any dtype, including ml_dtypes)."""
    a = np.asarray(a)
    with np.errstate(over="ignore"):
        sums = _row_sums(_lanes(a))
    return finish_fingerprint(dtype_name(a.dtype), tuple(a.shape), a.nbytes, sums)


def _json_float(x: float) -> float | str:
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def stats(a: np.ndarray) -> dict[str, float | str | int]:
    """Norm, min, max, mean, NaN and Inf counts (float64 accumulation)."""
    a = np.asarray(a)
    if a.size == 0:
        return {"norm": 0.0, "min": "nan", "max": "nan", "mean": "nan", "nan": 0, "inf": 0}
    if a.dtype.kind == "c":
        a = np.abs(a)
    x = a.astype(np.float64, copy=False).reshape(-1)
    total = float(np.sum(x))
    if math.isfinite(total):
        nan = inf = 0
    else:
        nan = int(np.count_nonzero(np.isnan(x)))
        inf = int(np.count_nonzero(np.isinf(x)))
    return {
        "norm": _json_float(np.sqrt(np.dot(x, x))),
        "min": _json_float(np.min(x)),
        "max": _json_float(np.max(x)),
        "mean": _json_float(total / x.size),
        "nan": nan,
        "inf": inf,
    }


def fingerprint_and_stats(a: np.ndarray) -> tuple[str, dict[str, float | str | int]]:
    return fingerprint(a), stats(a)
