"""The Triton fingerprint kernel (``runners.triton_rows``), run by Triton's interpreter on CPU.

Not collected by itself: ``tests/test_triton_rows.py`` runs this file in a process of its
own whose environment turns the interpreter on before anything imports Triton (Triton
decides at import; another test's ``torch.compile`` may import it first).

On a GPU the batched path's rows (and a large tensor's, read in place) come from this one
kernel. Here it runs interpreted (``TRITON_INTERPRET=1``, forced with
``REPROBISECT_FP_TRITON=1``): its fingerprints must equal the host reference bit for bit
and its statistics the per-tensor path's, for every dtype and slot boundary, with NaN,
Inf and padding; a kernel that disagrees with the torch ops is refused at its self-check
(and the torch ops answer); and a recorded trace is the same with it. ``tests/test_cuda.py``
runs it compiled when a GPU is lent.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from reprobisect.runners import batched_torch as bt  # noqa: E402
from reprobisect.runners import fingerprint_torch as fpt  # noqa: E402
from reprobisect.runners import triton_rows  # noqa: E402
from reprobisect.trace import read_trace  # noqa: E402
from test_batched_fingerprint import DTYPES, SIZES, _assert_stats_close, _reference, _train  # noqa: E402

CPU = torch.device("cpu")


def _reset() -> None:
    triton_rows._kernel = None
    triton_rows._import_error = None
    bt._fused.clear()
    bt._fused_why.clear()


@pytest.fixture(scope="module", autouse=True)
def interpreted():
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("REPROBISECT_FP_TRITON") != "1":
        pytest.skip("run by tests/test_triton_rows.py, with Triton's interpreter on from the start")
    _reset()
    bt.force(True)
    yield
    bt.force(None)
    _reset()


@pytest.fixture(scope="module")
def tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    out = []
    for dt in DTYPES:
        for n in SIZES:
            out.append((torch.randn(n, generator=g, dtype=torch.float64) * 3 - 0.5).to(dt))
        base = torch.randn(24, 40, generator=g).to(dt)
        out += [base.t(), base[::3, 1:], torch.randn((), generator=g).to(dt)]
        special = torch.tensor([0.0, -0.0, 1e-40, -3.5, float("nan"), float("inf"), float("-inf"), 2.0]).to(dt)
        out += [special, torch.full((4097,), -7.0, dtype=dt)]  # min/max must not see a row's padding
    return out


def _per_tensor(t: torch.Tensor) -> tuple[str, dict]:
    bt.force(False)
    try:
        return fpt.fingerprint_and_stats(t)
    finally:
        bt.force(True)


def _check_stats(got: dict, want: dict, n: int) -> None:
    """The per-tensor path's statistics, up to float64 rounding; exactly where not finite."""
    if not (want["nan"] or want["inf"]):
        _assert_stats_close(got, want, n)
        return
    assert (got["nan"], got["inf"], got["min"], got["max"]) == (want["nan"], want["inf"], want["min"], want["max"])
    for key in ("norm", "mean"):
        assert got[key] == (want[key] if isinstance(want[key], str) else pytest.approx(want[key], rel=1e-10))


def test_the_kernel_passes_its_self_check_for_every_float_dtype() -> None:
    assert all(bt.fused_ok(CPU, dt) for dt in DTYPES)
    assert set(bt.fused_status().values()) == {"on"}


def test_kernel_fingerprints_equal_the_reference_and_stats_the_per_tensor_path(tensors) -> None:
    pend = bt.begin_many(tensors)
    assert all(p.batch is not None for p in pend)
    assert bt.fused_status() == {f"cpu {fpt._name(dt)}": "on" for dt in DTYPES}  # the kernel computed them
    for t, (fp, st) in zip(tensors, fpt.finish_many(pend), strict=True):
        assert fp == _reference(t), (t.dtype, tuple(t.shape))
        want = _per_tensor(t)[1]
        _check_stats(st, want, t.numel())
        if want["nan"]:
            assert st["min"] == st["max"] == "nan"  # as torch.aminmax gives
    without = fpt.finish_many(bt.begin_many(tensors[:8], with_stats=False))
    assert [fp for fp, _ in without] == [_reference(t) for t in tensors[:8]]
    assert all(st is None for _, st in without)


def test_a_large_tensor_is_read_in_place_by_the_kernel(monkeypatch) -> None:
    monkeypatch.setattr(bt, "MAX_TENSOR_BYTES", 1 << 12)
    g = torch.Generator().manual_seed(9)
    big = [(torch.randn(n, generator=g, dtype=torch.float64) * 2).to(dt)
           for dt in DTYPES for n in (3 * 4096 + 6, 2048 * 3)]
    big[0][17] = float("inf")
    strided = torch.randn(200, 64, generator=g).t()  # not contiguous: the per-tensor torch path
    ts = [*big, strided]
    pend = bt.begin_many(ts)
    assert [p.batch is not None and p.batch.rows == [(0, p.batch.total_slots)] for p in pend] == [True] * len(big) + [False]
    one = bt.begin(big[1])  # the recorder's path for one tensor (an activation)
    assert one.batch is not None
    got = fpt.finish_many([*pend, one])
    for t, (fp, st) in zip([*ts, big[1]], got, strict=True):
        assert fp == _reference(t), (t.dtype, tuple(t.shape))
        _check_stats(st, _per_tensor(t)[1], t.numel())
    assert got[0][1]["inf"] == 1 and got[0][1]["max"] == "inf"


def _group_ops(ts: list[torch.Tensor], monkeypatch) -> tuple[int, int]:
    """Torch ops (not counting the interpreter's own, inside a launch) and kernel launches of
    one ``begin_many`` + ``finish_many`` over ``ts``, after the layout is built."""
    from test_recorder_ops import _Count

    real, inside = triton_rows.rows, [0, 0]

    def counted(*args, **kwargs):
        c = _Count()
        with c:
            real(*args, **kwargs)
        inside[0] += c.n
        inside[1] += 1

    monkeypatch.setattr(triton_rows, "rows", counted)
    fpt.finish_many(bt.begin_many(ts))
    inside[:] = [0, 0]
    c = _Count()
    with c:
        fpt.finish_many(bt.begin_many(ts))
    monkeypatch.undo()
    return c.n - inside[0], inside[1]


def test_a_group_costs_a_launch_per_slot_class_and_a_few_ops(monkeypatch) -> None:
    g = torch.Generator().manual_seed(1)
    for n in (8, 80):  # tiny (16-lane slots), 256-lane and ROW-lane slots, with padding
        ts = [torch.randn(s, generator=g) for s in [3] * (n // 2) + [200] * (n // 4) + [5000] * (n // 4)]
        ops, launches = _group_ops(ts, monkeypatch)
        assert launches == 3 and ops <= 16, (n, ops, launches)  # the torch ops alone: ~50 for the same group


def test_a_kernel_that_disagrees_with_the_torch_ops_is_not_used(monkeypatch, capsys, tensors) -> None:
    real = triton_rows.rows

    def off_by_one(lanes, values, width, weights, sums, stats, valid=None):
        real(lanes, values, width, weights, sums, stats, valid)
        sums.add_(1)

    monkeypatch.setattr(triton_rows, "rows", off_by_one)
    _reset()
    try:
        assert not bt.fused_ok(CPU, torch.float32)
        why = bt.fused_status()["cpu float32"]
        assert "fingerprint" in why and "differs" in why
        assert "not used" in capsys.readouterr().err
        f32 = [t for t in tensors if t.dtype == torch.float32]
        got = fpt.finish_many(bt.begin_many(f32))  # the torch ops answer, right
        assert [fp for fp, _ in got] == [_reference(t) for t in f32]
    finally:
        monkeypatch.undo()
        _reset()


def test_the_switch_and_the_cpu_default(monkeypatch) -> None:
    _reset()
    try:
        monkeypatch.setenv("REPROBISECT_FP_TRITON", "0")
        assert not bt.fused_ok(CPU, torch.float32)
        assert bt.fused_status()["cpu float32"] == "off (REPROBISECT_FP_TRITON=0)"
        _reset()
        monkeypatch.delenv("REPROBISECT_FP_TRITON")
        assert not bt.fused_ok(CPU, torch.float32)  # auto: CUDA only
        assert bt.fused_status()["cpu float32"].startswith("off on cpu")
    finally:
        monkeypatch.undo()
        _reset()


def test_a_recorded_trace_is_the_same_with_the_kernel(tmp_path: Path) -> None:
    _reset()
    bt.force(False)
    try:
        _train(tmp_path / "native", n_steps=2)
    finally:
        bt.force(True)
    _train(tmp_path / "kernel", n_steps=2)
    assert bt.fused_status() == {"cpu float32": "on"}
    a, b = read_trace(tmp_path / "native"), read_trace(tmp_path / "kernel")
    for sa, sb in zip(a.steps, b.steps, strict=True):
        assert [(r.kind, r.name, r.fingerprint) for r in sa.records] == [(r.kind, r.name, r.fingerprint) for r in sb.records]
        for ra, rb in zip(sa.records, sb.records):
            if ra.stats:
                _assert_stats_close(rb.stats, ra.stats, max(1, int(np.prod(ra.shape))))
        assert sb.scalars["grad_norm"] == pytest.approx(sa.scalars["grad_norm"], rel=1e-12)
