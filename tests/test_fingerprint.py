"""Exact-bit fingerprints: one value for the same bits on NumPy and torch, any change of bits changes it."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reprobisect.trace.fingerprint import ROW, fingerprint, fingerprint_and_stats, stats

torch = pytest.importorskip("torch")
from reprobisect import native  # noqa: E402
from reprobisect.runners import fingerprint_torch as ft  # noqa: E402


def pytest_generate_tests(metafunc):
    """Every test runs on both CPU paths, the native kernel and the torch-op fallback,
    except those about the kernel itself (marked ``native_only``)."""
    if not metafunc.definition.get_closest_marker("native_only"):
        metafunc.parametrize("fp_path", ["native", "ops"], indirect=True)


@pytest.fixture(autouse=True)
def fp_path(request, monkeypatch):
    path = getattr(request, "param", "native")
    if path == "ops":
        monkeypatch.setattr(native, "kernel", lambda: None)
    elif native.kernel() is None and native._compiler() is not None:
        pytest.fail(f"a C++ compiler is here but the native kernel is not: {native.status()}")
    return path


def _kernel_or_skip() -> native.Kernel:
    k = native.kernel()
    if k is None:
        pytest.skip(f"no native kernel: {native.status()}")
    return k

# torch dtype, the NumPy dtype with the same bits
PAIRS = [
    (torch.float32, np.float32),
    (torch.float16, np.float16),
    (torch.bfloat16, ml_dtypes.bfloat16),
    (torch.float64, np.float64),
    (torch.int64, np.int64),
    (torch.int32, np.int32),
    (torch.int8, np.int8),
    (torch.uint8, np.uint8),
    (torch.bool, np.bool_),
    (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
    (torch.float8_e5m2, ml_dtypes.float8_e5m2),
]
def _id(x) -> str:
    return getattr(x, "__name__", str(x).replace("torch.", ""))


SHAPES = [(), (0,), (1,), (3,), (7, 5), (ROW + 3,), (2, ROW), (3, ROW + 1), (5, 3, 2 * ROW + 7)]


def _torch_tensor(tdtype, shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if tdtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not tdtype.is_floating_point:
        info = torch.iinfo(tdtype)
        return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(tdtype)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * 3).to(tdtype)


def _to_numpy(t: torch.Tensor, ndtype) -> np.ndarray:
    """The same bits as a NumPy array (torch cannot .numpy() bfloat16 or float8)."""
    t = t.contiguous()
    raw = t.view(torch.uint8).numpy() if t.dim() else t.reshape(1).view(torch.uint8).numpy()
    return raw.view(ndtype).reshape(tuple(t.shape))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("tdtype, ndtype", PAIRS, ids=_id)
def test_torch_equals_numpy(tdtype, ndtype, shape):
    t = _torch_tensor(tdtype, shape)
    a = _to_numpy(t, ndtype)
    assert a.shape == tuple(t.shape) and a.dtype == np.dtype(ndtype)
    assert ft.fingerprint(t) == fingerprint(a)


@pytest.mark.parametrize("tdtype, ndtype", PAIRS[:5] + [PAIRS[8]], ids=_id)
def test_non_contiguous_views(tdtype, ndtype):
    base = _torch_tensor(tdtype, (64, 96), seed=1)
    for view in (base.t(), base[::3, 1::2], base[5:, 7], base.unsqueeze(0).expand(2, 64, 96)):
        assert not view.is_contiguous()
        want = fingerprint(_to_numpy(view.contiguous(), ndtype))
        assert ft.fingerprint(view) == want
    a = _to_numpy(base, ndtype)
    assert fingerprint(a.T) == ft.fingerprint(base.t())  # a non-contiguous NumPy view too


def test_unaligned_storage_offset():
    base = torch.arange(40, dtype=torch.float16)
    view = base[1:]  # contiguous, but starts 2 bytes into the storage: no int32 view possible
    assert view.is_contiguous() and view.storage_offset() == 1
    assert ft.fingerprint(view) == fingerprint(base.numpy()[1:])
    odd = torch.arange(7, dtype=torch.uint8)[3:]  # 4 bytes, padded path and offset path together
    assert ft.fingerprint(odd) == fingerprint(np.arange(7, dtype=np.uint8)[3:])


@pytest.mark.parametrize("tdtype, ndtype", [(torch.uint16, np.uint16), (torch.uint32, np.uint32), (torch.uint64, np.uint64)],
                         ids=_id)
def test_wide_unsigned_integers_have_fingerprints_and_stats(tdtype, ndtype):
    """uint16 token ids and the like: torch has no min/max for them, the recorder must not fail."""
    a = (np.arange(3 * ROW + 7, dtype=np.int64) * 7919 % 60000).astype(ndtype)
    a[5] = np.iinfo(ndtype).max
    t = torch.from_numpy(a.astype(np.int64)).to(tdtype)
    fp, s = ft.fingerprint_and_stats(t)
    assert fp == fingerprint(a)
    want = stats(a)
    for k in ("norm", "min", "max", "mean"):
        assert s[k] == pytest.approx(want[k], rel=1e-12), k


def test_lazily_negated_and_conjugated_views_are_fingerprinted_by_value():
    x = torch.randn(3 * ROW + 5)
    assert ft.fingerprint_and_stats(torch._neg_view(x)) == ft.fingerprint_and_stats(-x)
    z = torch.randn(100, dtype=torch.complex64)
    assert ft.fingerprint(z.conj()) == ft.fingerprint(z.conj().resolve_conj()) != ft.fingerprint(z)


def test_zero_d_and_empty():
    assert ft.fingerprint(torch.tensor(1.5)) == fingerprint(np.float32(1.5))
    assert ft.fingerprint(torch.tensor(1.5)) != ft.fingerprint(torch.tensor([1.5]))  # shape-aware
    empties = {fingerprint(np.zeros(s, np.float32)) for s in [(0,), (0, 3), (3, 0)]}
    assert len(empties) == 3
    assert ft.fingerprint(torch.zeros(0, 3)) == fingerprint(np.zeros((0, 3), np.float32))


def test_dtype_aware():
    """Same bytes, different dtype (or shape) → different fingerprint."""
    a = np.arange(16, dtype=np.float32)
    assert fingerprint(a) != fingerprint(a.view(np.int32))
    assert fingerprint(a) != fingerprint(a.view(np.uint8))
    assert fingerprint(a) != fingerprint(a.reshape(4, 4))
    assert fingerprint(np.zeros(4, np.float16)) != fingerprint(np.zeros(4, ml_dtypes.bfloat16))


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int64, np.uint8, ml_dtypes.float8_e4m3fn]),
    n=st.integers(1, 3 * ROW + 5),
    data=st.data(),
)
def test_any_single_flipped_bit_changes_it(dtype, n, data):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(dtype) if np.dtype(dtype).kind == "f" or dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn) \
        else rng.integers(0, 100, n).astype(dtype)
    bit = data.draw(st.integers(0, a.nbytes * 8 - 1), label="bit")
    b = a.copy()
    b.view(np.uint8)[bit // 8] ^= np.uint8(1 << (bit % 8))
    assert fingerprint(a) != fingerprint(b)


@pytest.mark.parametrize("bit", [0, 7, 15, 31, 32, 62, 63])
def test_flipped_bit_changes_the_torch_fingerprint_too(bit):
    t = torch.randn(3 * ROW + 1, dtype=torch.float64)
    u = t.clone()
    i = 2 * ROW + 5
    u.view(torch.int64)[i] ^= (1 << bit) if bit < 63 else -(1 << 63)
    assert ft.fingerprint(t) != ft.fingerprint(u)
    assert ft.fingerprint(u) == fingerprint(u.numpy())


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 2 * ROW + 3), data=st.data())
def test_swapping_two_elements_changes_it(n, data):
    a = np.arange(n, dtype=np.float32)
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i))
    b = a.copy()
    b[[i, j]] = b[[j, i]]
    assert fingerprint(a) != fingerprint(b)


def test_permutations_and_row_swaps_change_it():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, ROW)).astype(np.float32)
    assert fingerprint(a) != fingerprint(a[::-1].copy())  # whole rows swapped: the row sums' order counts
    assert fingerprint(a) != fingerprint(rng.permutation(a.reshape(-1)).reshape(a.shape))
    t = torch.from_numpy(a)
    assert ft.fingerprint(t) != ft.fingerprint(t.flip(0))


def test_signed_zero_and_nan_payloads_differ():
    assert fingerprint(np.array([0.0], np.float32)) != fingerprint(np.array([-0.0], np.float32))
    q = np.array([0x7FC00000], np.uint32).view(np.float32)
    p = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert np.isnan(q[0]) and np.isnan(p[0])
    assert fingerprint(q) != fingerprint(p)
    tq, tp = torch.from_numpy(q), torch.from_numpy(p)
    assert ft.fingerprint(tq) != ft.fingerprint(tp)
    assert ft.fingerprint(tq) == fingerprint(q)


@pytest.mark.parametrize("n", [2, 4, 64, ROW, ROW + 2, 2 * ROW])
def test_negation_of_float64_even_length_changes_it(n):
    """Flipping every sign bit moves every high lane by ±2**31: it must not cancel."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n)
    assert fingerprint(a) != fingerprint(-a)
    assert ft.fingerprint(torch.from_numpy(-a)) == fingerprint(-a)
    ones = np.ones(n)
    assert fingerprint(ones) != fingerprint(-ones)


def test_stats_values():
    a = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    s = stats(a)
    assert s == {"norm": pytest.approx(math.sqrt(30)), "min": -2.0, "max": 4.0, "mean": 1.5, "nan": 0, "inf": 0}
    b = np.array([np.nan, np.inf, -np.inf, 1.0, np.nan], np.float32)
    sb = stats(b)
    assert sb["nan"] == 2 and sb["inf"] == 2
    assert stats(np.zeros(0)) == {"norm": 0.0, "min": "nan", "max": "nan", "mean": "nan", "nan": 0, "inf": 0}
    assert stats(np.array([True, False, True]))["mean"] == pytest.approx(2 / 3)
    fp, st_ = fingerprint_and_stats(a)
    assert fp == fingerprint(a) and st_ == s


@pytest.mark.parametrize("tdtype, ndtype", [PAIRS[0], PAIRS[1], PAIRS[2], PAIRS[3], PAIRS[4], PAIRS[8]],
                         ids=_id)
def test_torch_stats_match_numpy(tdtype, ndtype):
    t = _torch_tensor(tdtype, (33, 17), seed=3)
    fp, s = ft.fingerprint_and_stats(t)
    want = stats(_to_numpy(t, ndtype))
    assert fp == fingerprint(_to_numpy(t, ndtype))
    for k in ("norm", "min", "max", "mean"):
        assert s[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k
    assert (s["nan"], s["inf"]) == (0, 0)


def test_torch_stats_count_nan_and_inf():
    t = torch.tensor([1.0, float("nan"), float("inf"), float("nan"), -float("inf"), 2.0])
    fp, s = ft.fingerprint_and_stats(t)
    assert s["nan"] == 2 and s["inf"] == 2 and s["mean"] == "nan"
    assert s == {**stats(t.numpy()), "norm": s["norm"]}
    _, e = ft.fingerprint_and_stats(torch.zeros(0))
    assert e == stats(np.zeros(0, np.float32))


def test_begin_finish_defers_the_host_copy():
    ts = [torch.randn(100), torch.randn(ROW * 2 + 1)]
    pend = [ft.begin(t) for t in ts]
    got = [ft.finish(p) for p in pend]
    assert [g[0] for g in got] == [fingerprint(t.numpy()) for t in ts]


def test_fingerprint_does_not_change_the_tensor():
    t = torch.randn(2 * ROW + 3)
    before = t.clone()
    ft.fingerprint_and_stats(t)
    assert torch.equal(t.view(torch.int32), before.view(torch.int32))


def test_eager_cpu_path_equals_the_reference_over_block_edges():
    """The CPU path reduces rows in blocks with int64 mv: rows across block edges, any count."""
    block = ft._CPU_BLOCK_ROWS
    for rows in (1, block - 1, block, block + 1, 3 * block + 5):
        t = torch.randint(-(2**31), 2**31 - 1, (rows * ROW + 7,), dtype=torch.int64).to(torch.int32)
        assert ft.fingerprint(t) == fingerprint(t.numpy()), rows


def test_accelerator_row_sums_equal_the_reference_over_block_edges(monkeypatch):
    """The accelerator path (zero-padded last row, one multiply + sum per block) is plain
    torch: run here on CPU, with small blocks, against NumPy."""
    monkeypatch.setattr(ft, "_ACCEL_BLOCK_ROWS", 3)
    w = ft._device_weights(torch.device("cpu"))
    for n in (1, 5, ROW - 1, ROW, ROW + 1, 3 * ROW, 3 * ROW + 2, 7 * ROW + 9):
        t = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int64).to(torch.int32)
        got = ft._accel_row_sums(t, w).numpy()
        want = ft._row_sums(t).numpy() if ft.native.kernel() is None else ft.native.kernel().run(t.data_ptr(), 4 * n, None)[0]
        assert np.array_equal(got, want), n
        assert ft.finish_fingerprint("int32", (n,), 4 * n, got) == fingerprint(t.numpy())


@pytest.mark.slow
def test_compiled_path_gives_the_same_values():
    """The opt-in torch.compile row reduction is bit-identical to NumPy (pays one compile)."""
    ft.enable_compile(min_bytes=0)
    try:
        for t in (torch.randn(5 * ROW + 3), torch.randn(3, ROW).to(torch.bfloat16), torch.arange(2 * ROW, dtype=torch.int64)):
            assert ft.fingerprint(t) == fingerprint(_to_numpy(t, {torch.float32: np.float32, torch.bfloat16: ml_dtypes.bfloat16,
                                                                  torch.int64: np.int64}[t.dtype]))
        if ft._compile_failed:
            pytest.skip("torch.compile is not usable here (no C++ compiler?); the eager path was used")
    finally:
        ft.enable_compile(None)


@pytest.mark.parametrize("tdtype, ndtype", [PAIRS[0], PAIRS[2], PAIRS[4], PAIRS[8]], ids=_id)
def test_blocked_torch_stats_match_numpy(tdtype, ndtype):
    """Large CPU tensors take the blocked float64 path; same figures as NumPy's float64 stats."""
    n = 3 * ft._STATS_BLOCK + 11
    t = _torch_tensor(tdtype, (n,), seed=4)
    _, s = ft.fingerprint_and_stats(t)
    want = stats(_to_numpy(t, ndtype))
    for k in ("norm", "min", "max", "mean"):
        assert s[k] == pytest.approx(want[k], rel=1e-6, abs=1e-9), k
    if tdtype.is_floating_point:  # finite values whose float32 row sums overflow: float64 fallback
        big = torch.full((n,), 3e38, dtype=torch.float32)
        _, sb = ft.fingerprint_and_stats(big)
        assert sb["mean"] == pytest.approx(3e38, rel=1e-6) and sb["norm"] == pytest.approx(3e38 * math.sqrt(n), rel=1e-6)
    if tdtype.is_floating_point:
        u = t.clone()
        u[5], u[-1], u[ft._STATS_BLOCK] = float("nan"), float("inf"), float("-inf")
        _, su = ft.fingerprint_and_stats(u)
        assert (su["nan"], su["inf"], su["mean"]) == (1, 2, "nan")


GOLDEN = {
    # computed with the first implementation (commit 0364d86): faster code must keep these values,
    # or old traces stop comparing equal to new ones
    "arange_f32": (lambda: np.arange(3 * ROW + 5, dtype=np.float32), "e19f79553c4b9f9acd6c6e8a73b03d8d"),
    "arange_bf16": (lambda: np.arange(1000, dtype=np.float32).astype(ml_dtypes.bfloat16), "502c9a902af830fb837abd46ba2a088e"),
    "int64": (lambda: np.arange(10000, dtype=np.int64) * 7919 - 40000000000, "43f310b1b1b9e8a5b4eb61231a7a3245"),
    "bool": (lambda: np.arange(33) % 3 == 0, "813c11910032538afb9c541db31cbef7"),
    "scalar": (lambda: np.float64(-0.0), "6feb208651012405be5c68cb72a3a1cd"),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_fingerprint_values_are_stable(name):
    make, want = GOLDEN[name]
    a = make()
    assert fingerprint(a) == want
    t = torch.from_numpy(np.asarray(a).view(np.int16)).view(torch.bfloat16) if name == "arange_bf16" else torch.from_numpy(np.asarray(a))
    assert ft.fingerprint(t) == want


NATIVE_PAIRS = PAIRS[:9]  # the dtypes the kernel has statistics for (float8: fingerprint only)


@pytest.mark.native_only
@pytest.mark.parametrize("tdtype, ndtype", NATIVE_PAIRS + PAIRS[9:10], ids=_id)
def test_native_kernel_over_chunk_edges(tdtype, ndtype):
    """One pass for fingerprint and stats: NumPy's fingerprint, NumPy's float64 stats, at
    chunk edges and with a partial last row; the same bits on a second call."""
    k = _kernel_or_skip()
    per_chunk = native.CHUNK_BYTES // torch.tensor([], dtype=tdtype).element_size()
    for n in (1, 15, 17, per_chunk - 1, per_chunk, 4 * per_chunk + ROW + 3, 5 * per_chunk + 1):
        t = _torch_tensor(tdtype, (n,), seed=n)
        a = _to_numpy(t, ndtype)
        fp, s = ft.fingerprint_and_stats(t)
        assert fp == fingerprint(a), n
        want = stats(a)
        code = ft.dtype_name(tdtype)
        rel = 1e-12 if code in native.DTYPE_CODES else 1e-6  # float8: torch's float32 row sums
        for key in ("norm", "min", "max", "mean"):
            assert s[key] == pytest.approx(want[key], rel=rel, abs=1e-300), (n, key)
        again = k.run(t.data_ptr(), t.numel() * t.element_size(), code)
        assert ft.finish_fingerprint(code, tuple(t.shape), t.numel() * t.element_size(), again[0]) == fp
        if code in native.DTYPE_CODES:
            assert again[1] == k.run(t.data_ptr(), t.numel() * t.element_size(), code)[1]


@pytest.mark.native_only
@pytest.mark.parametrize("tdtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=_id)
def test_native_kernel_counts_nan_and_inf_across_chunks(tdtype):
    _kernel_or_skip()
    per_chunk = native.CHUNK_BYTES // torch.tensor([], dtype=tdtype).element_size()
    t = _torch_tensor(tdtype, (6 * per_chunk + 9,), seed=2)
    t[per_chunk - 1], t[3 * per_chunk], t[-1] = float("inf"), float("-inf"), float("inf")
    _, s = ft.fingerprint_and_stats(t)
    assert (s["nan"], s["inf"], s["min"], s["max"]) == (0, 3, "-inf", "inf")
    t[per_chunk + 2] = float("nan")
    _, s = ft.fingerprint_and_stats(t)
    assert (s["nan"], s["inf"], s["mean"], s["min"]) == (1, 3, "nan", "nan")
    big = torch.full((3 * per_chunk,), 3e38 if tdtype != torch.float16 else 6e4, dtype=tdtype)
    _, sb = ft.fingerprint_and_stats(big)  # float64 accumulation: finite values never overflow
    assert sb["mean"] == pytest.approx(float(big[0]), rel=1e-12) and sb["nan"] == sb["inf"] == 0


@pytest.mark.native_only
@pytest.mark.parametrize("tdtype, ndtype", [PAIRS[0], PAIRS[2], PAIRS[3], PAIRS[7], PAIRS[9]], ids=_id)
def test_native_strided_views_equal_a_contiguous_copy(tdtype, ndtype):
    """Views are gathered block by block: the same row sums and the same statistics bits
    as the contiguous copy, for transposes, slices, steps, expanded dims and inner strides."""
    k = _kernel_or_skip()
    base = _torch_tensor(tdtype, (40, 37, 300), seed=11)
    views = [base.transpose(0, 1), base[:, 3:30:2], base[..., ::3], base[5:7].permute(2, 0, 1),
             base[0, :, :1].expand(37, 200), base.transpose(1, 2)[:, 1:]]
    for v in views:
        assert not v.is_contiguous()
        c = v.contiguous()
        name = ft.dtype_name(tdtype)
        code = name if name in native.DTYPE_CODES else None
        got = k.run_strided(v.data_ptr(), v.element_size(), tuple(v.shape), v.stride(), code)
        want = k.run(c.data_ptr(), c.numel() * c.element_size(), code)
        assert np.array_equal(got[0], want[0]) and got[2] == want[2], v.stride()
        assert np.array(got[1]).tobytes() == np.array(want[1]).tobytes(), v.stride()
        assert ft.fingerprint_and_stats(v) == ft.fingerprint_and_stats(c)
        assert ft.fingerprint(v) == fingerprint(_to_numpy(c, ndtype))
    u = base.transpose(0, 2).clone().transpose(0, 2)  # same values, other layout
    if tdtype.is_floating_point:
        u[3, 4, 5] = float("nan")
        w = u.transpose(0, 1)
        assert ft.fingerprint_and_stats(w)[1] == ft.fingerprint_and_stats(w.contiguous())[1]


@pytest.mark.native_only
def test_native_kernel_is_safe_from_several_threads():
    """Each thread has its own output buffer: concurrent calls (a user's threads, a data
    pipeline's) never see each other's row sums or statistics."""
    import threading

    k = _kernel_or_skip()
    arrays = [np.random.default_rng(i).standard_normal(3 * ROW + i).astype(np.float32) for i in range(4)]
    want = [(fingerprint(a), stats(a)) for a in arrays]
    bad: list[int] = []

    def work(i: int) -> None:
        a = arrays[i]
        for _ in range(200):
            sums, st_, _ = k.run(a.ctypes.data, a.nbytes, "float32")
            if ft.finish_fingerprint("float32", a.shape, a.nbytes, sums) != want[i][0] or st_[2] != want[i][1]["min"]:
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@pytest.mark.native_only
def test_native_statistics_do_not_depend_on_the_build(tmp_path, monkeypatch):
    """The vectorised build for this CPU (AVX-512, AVX2 or the compiler's own vectors) and a
    portable -O2 build give the same bits: row sums (integers) and statistics (the source
    fixes every float operation and its order), with signed zeros, subnormals, the largest
    values, infinities and NaN."""
    k = _kernel_or_skip()
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path))
    portable = native.load(native.build(flag_sets=(["-O2"],)))
    rng = np.random.default_rng(7)
    per_chunk = native.CHUNK_BYTES // 4
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.uint8):
        for n in (5, 4096 * 3 + 17, 2 * per_chunk + 4096 + 3):
            a = (rng.standard_normal(n) * 50).astype(dtype)
            if np.dtype(dtype).kind == "f" or dtype is ml_dtypes.bfloat16:
                a[::97] = -0.0
                info = ml_dtypes.finfo(dtype)
                a[5::389] = info.smallest_subnormal
                a[7::401] = info.max
                if n > 4096:  # non-finite values only in some tensors (the others keep finite stats)
                    a[9::4099] = -np.inf
                    if n > per_chunk:
                        a[11::8191] = np.nan
            else:
                a[3::89] = np.iinfo(dtype).min  # the most negative lanes
                a[4::89] = np.iinfo(dtype).max
            name = ft.dtype_name(a.dtype)
            fast, slow = k.run(a.ctypes.data, a.nbytes, name), portable.run(a.ctypes.data, a.nbytes, name)
            assert np.array_equal(fast[0], slow[0]) and fast[2] == slow[2], (name, n)
            assert np.array(fast[1]).tobytes() == np.array(slow[1]).tobytes(), (name, n, fast[1], slow[1])


@pytest.mark.native_only
def test_native_sum_of_squares_is_the_statistics_own(tmp_path, monkeypatch):
    """The sum-of-squares pass a sentinel's gradient norms take gives the same float64 bits as
    the full statistics' sum of squares (so both detail levels give one gradient norm), in
    the machine's vectorised build and a portable one: across chunk borders, with tails that
    are not whole vectors, with the largest values, infinities and NaN."""
    k = _kernel_or_skip()
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path))
    portable = native.load(native.build(flag_sets=(["-O2"],)))
    rng = np.random.default_rng(3)
    per_chunk = native.CHUNK_BYTES // 4
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.float64):
        for n in (0, 1, 15, 17, 4096 * 3 + 17, 2 * per_chunk + 4096 + 3):
            a = (rng.standard_normal(n) * 50).astype(dtype)
            if n > 4096:
                a[7::401] = ml_dtypes.finfo(dtype).max
                a[5::389] = ml_dtypes.finfo(dtype).smallest_subnormal
            for planted in (None, np.inf, np.nan):
                b = a.copy()
                if planted is not None and n:
                    b[n // 2] = planted
                name = ft.dtype_name(b.dtype)
                want = k.run(b.ctypes.data, b.nbytes, name)[1][1]
                got = [kk.sumsq(b.ctypes.data, b.nbytes, name) for kk in (k, portable)]
                assert np.array(got).tobytes() == np.array([want, want]).tobytes(), (name, n, planted, got, want)
    with pytest.raises(ValueError, match="int32"):
        k.sumsq(a.ctypes.data, 4, "int32")


def test_a_gradient_norm_is_the_norm_statistic_of_the_same_tensor():
    """``fingerprint_torch.norm``: on the native path, exactly the ``norm`` a full recording's
    statistics give the tensor, contiguous or a view (a channels-last gradient); on the
    torch-op path (no kernel), close."""
    conv = torch.randn(8, 5, 3, 3).to(memory_format=torch.channels_last)
    for t in (torch.randn(3 * ROW + 7), torch.randn(300, 70).to(torch.bfloat16), torch.randn(33, dtype=torch.float64),
              torch.randn(64, 32).t(), conv, torch.randn(2 * ROW, 3)[:, 1], torch.zeros(0), torch.tensor(-2.5)):
        got, want = ft.norm(t), ft.fingerprint_and_stats(t)[1]["norm"]
        if native.kernel() is not None:
            assert isinstance(got, float) and got == want, (t.dtype, t.stride())
        else:
            assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-12)


@pytest.mark.native_only
def test_native_build_is_cached_per_cpu_and_refuses_cleanly(tmp_path, monkeypatch):
    """Built once per (source, compiler, CPU); a CPU of another kind gets its own build, and
    no compiler means the torch-op path, with the same fingerprints, and a status that says why."""
    _kernel_or_skip()
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path))
    first = native.build()
    assert first.parent == tmp_path / "native" and native.build() == first
    monkeypatch.setattr(native, "_cpu_identity", lambda: "some other cpu")
    assert native._target(native._compiler()) != first
    script = (
        "import numpy as np, torch\n"
        "from reprobisect import native\n"
        "from reprobisect.runners import fingerprint_torch as ft\n"
        "from reprobisect.trace.fingerprint import fingerprint\n"
        "t = torch.randn(70000)\n"
        "assert ft.fingerprint(t) == fingerprint(t.numpy())\n"
        "print(native.status())\n"
    )
    for env, want in (({"CXX": "/bin/false", "PATH": "/nonexistent"}, "framework ops (native kernel unavailable"),
                      ({"REPROBISECT_NATIVE": "0"}, "off (REPROBISECT_NATIVE=0)")):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**os.environ, "REPROBISECT_CACHE_DIR": str(tmp_path / "fresh"), **env})
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(want), r.stdout
    assert not (tmp_path / "fresh" / "native").exists() or not list((tmp_path / "fresh" / "native").glob("*.so"))


def test_finish_many_equals_finish_one_by_one():
    ts = [torch.randn(5), torch.randn(3 * ROW + 1), torch.randn(2 * ft._STATS_BLOCK + 3).to(torch.bfloat16),
          torch.tensor([1.0, float("nan"), float("inf")]), torch.arange(7), torch.zeros(0)]
    pend = [ft.begin(t) for t in ts] + [ft.begin(ts[1], with_stats=False)]
    assert ft.finish_many(pend) == [ft.finish(p) for p in pend]
    assert ft.finish_many([]) == []


def test_begin_many_equals_begin_one_by_one():
    """One call for many tensors (a step's parameters and optimizer state) gives what each
    tensor's own call gives: contiguous or not, every dtype, empty, non-finite, lazily negated."""
    big = torch.randn(3 * ROW + 5)
    big[7] = float("inf")
    ts = [torch.randn(5), big, torch.randn(2 * native.CHUNK_BYTES // 4 + 3).to(torch.bfloat16),
          torch.tensor([1.0, float("nan"), float("-inf")]), torch.arange(7), torch.zeros(0),
          torch.randn(64, 32).t(), torch.randn(9).to(torch.float8_e4m3fn), torch.randn(4, dtype=torch.complex64),
          torch.randn(6).neg(), torch.randn(6)._neg_view(), torch.tensor(3.5), torch.ones(5, dtype=torch.bool),
          torch.randint(0, 9, (11,), dtype=torch.uint32)]
    for with_stats in (True, False):
        many = ft.finish_many(ft.begin_many(ts, with_stats=with_stats))
        one = [ft.finish(ft.begin(t, with_stats=with_stats)) for t in ts]
        assert many == one, with_stats
        assert all(type(v) in (int, float, str) for _, st in many if st for v in st.values())  # plain JSON values
    assert ft.begin_many([]) == []
