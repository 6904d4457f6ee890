"""The Triton source of ``triton_rows``'s kernel, in a module of its own: imported only
when the kernel is wanted (importing Triton takes a while), and at module level, where
Triton's interpreter (``TRITON_INTERPRET=1``, the tests' CPU stand-in for a GPU) can see
``tl``."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rows"]


@triton.jit
def rows(lanes_ptr, vals_ptr, w_ptr, valid_ptr, sums_ptr, stats_ptr, stats_stride, n_lanes, n_elems,
         LANES: tl.constexpr, EPR: tl.constexpr, BL: tl.constexpr, BE: tl.constexpr,
         STATS: tl.constexpr, VALID: tl.constexpr, HALF: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BL], dtype=tl.int64)
    for start in range(0, LANES, BL):
        lo = start + tl.arange(0, BL)
        at = row * LANES + lo
        x = tl.load(lanes_ptr + at, mask=at < n_lanes, other=0).to(tl.int64)
        acc += x * tl.load(w_ptr + lo)  # int64: wraps modulo 2**64, as the reference
    tl.store(sums_ptr + row, tl.sum(acc, axis=0))
    if STATS:
        if VALID:
            nv = tl.load(valid_ptr + row).to(tl.int64)
        else:
            nv = n_elems - row * EPR
        s = tl.zeros([BE], dtype=tl.float64)
        q = tl.zeros([BE], dtype=tl.float64)
        nan = tl.zeros([BE], dtype=tl.float64)
        inf = tl.zeros([BE], dtype=tl.float64)
        mn = tl.full([BE], float("inf"), dtype=tl.float64)
        mx = tl.full([BE], float("-inf"), dtype=tl.float64)
        for start in range(0, EPR, BE):
            eo = start + tl.arange(0, BE)
            ok = eo < nv
            v = tl.load(vals_ptr + row * EPR + eo, mask=ok, other=0)
            if HALF:  # 16-bit floats widen through float32 (exact)
                v = v.to(tl.float32)
            v = v.to(tl.float64)
            s += v
            q += v * v
            nan += (v != v).to(tl.float64)
            inf += (tl.abs(v) == float("inf")).to(tl.float64)
            mn = tl.minimum(mn, tl.where(ok, v, float("inf")))
            mx = tl.maximum(mx, tl.where(ok, v, float("-inf")))
        n_nan = tl.sum(nan, axis=0)
        lo_v = tl.where(n_nan > 0, float("nan"), tl.min(mn, axis=0))
        hi_v = tl.where(n_nan > 0, float("nan"), tl.max(mx, axis=0))
        tl.store(stats_ptr + row, tl.sum(s, axis=0))
        tl.store(stats_ptr + stats_stride + row, tl.sum(q, axis=0))
        tl.store(stats_ptr + 2 * stats_stride + row, lo_v)
        tl.store(stats_ptr + 3 * stats_stride + row, hi_v)
        tl.store(stats_ptr + 4 * stats_stride + row, n_nan)
        tl.store(stats_ptr + 5 * stats_stride + row, tl.sum(inf, axis=0))

