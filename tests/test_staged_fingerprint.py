"""Staged activations (``runners.staged_torch``), forced onto CPU's batched path.

A staged tensor costs one copy when its hook sees it and is fingerprinted with the others
at the step's end. Its fingerprint must be the per-tensor path's bit for bit, of the values
it had when it was staged (the program may change it in place afterwards); a full buffer
flushes and keeps every result right; and a tensor the stage does not take (integers, a
CPU tensor when not forced, one over the limit) is not staged.
"""

from __future__ import annotations

import math

import pytest
import torch

from reprobisect.runners import batched_torch as bt
from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners import staged_torch as st
from test_batched_fingerprint import _assert_stats_close


@pytest.fixture(autouse=True)
def batched():
    bt.force(True)
    yield
    bt.force(None)


def _want(t: torch.Tensor) -> tuple[str, dict]:
    """The native per-tensor path's fingerprint and statistics of ``t`` as it is now."""
    bt.force(False)
    try:
        return fpt.fingerprint_and_stats(t.clone())
    finally:
        bt.force(True)


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    out = []
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for n in (1, 17, 257, 4097):
            out.append((torch.randn(n, generator=g, dtype=torch.float64) * 2 - 0.3).to(dt))
        base = torch.randn(12, 40, generator=g).to(dt)
        out += [base.t(), base[::3, 1:], torch.randn((), generator=g).to(dt)]
    return out


def _check(stage_pendings: list[fpt.Pending], wants: list[tuple[str, dict]]) -> None:
    got = fpt.finish_many(stage_pendings)
    for (fp, stats), (want_fp, want_stats), p in zip(got, wants, stage_pendings, strict=True):
        assert fp == want_fp
        _assert_stats_close(stats, want_stats, p.numel)


def test_staged_fingerprints_equal_the_per_tensor_path() -> None:
    ts = _tensors()
    wants = [_want(t) for t in ts]
    stage = st.Stage()
    assert all(st.takes(t) for t in ts)
    pend = [stage.begin(t) for t in ts]
    assert stage.pending() == len(ts)
    assert all(p.row_sums is None for p in pend)  # nothing computed before the flush
    stage.flush()
    assert stage.pending() == 0
    _check(pend, wants)


def test_a_change_in_place_after_staging_does_not_change_the_fingerprint() -> None:
    ts = _tensors()
    wants = [_want(t) for t in ts]
    stage = st.Stage()
    pend = [stage.begin(t) for t in ts]
    for t in ts:
        t.mul_(-3).add_(1)  # what ReLU(inplace=True) or an optimizer does to a tensor after its hook
    stage.flush()
    _check(pend, wants)


def test_a_full_buffer_flushes_and_keeps_every_result(monkeypatch) -> None:
    monkeypatch.setattr(st, "LIMIT_BYTES", 4096 * 4)  # room for one 4097-element float32 tensor at most
    ts = [t for t in _tensors() if t.numel() * t.element_size() <= 4096 * 4] * 6
    wants = [_want(t) for t in ts]
    stage = st.Stage()
    pend = [stage.begin(t) for t in ts]
    assert any(p.batch is not None for p in pend), "nothing flushed before the end: the limit was not reached"
    stage.flush()
    _check(pend, wants)
    for buf in stage._buffers.values():
        assert buf.data is not None and buf.data.numel() * buf.data.element_size() <= 4096 * 4


def test_without_stats() -> None:
    ts = _tensors()[:4]
    stage = st.Stage(with_stats=False)
    pend = [stage.begin(t) for t in ts]
    stage.flush()
    got = fpt.finish_many(pend)
    assert [fp for fp, _ in got] == [w[0] for w in map(_want, ts)]
    assert all(s is None for _, s in got)


def test_what_the_stage_does_not_take(monkeypatch) -> None:
    assert not st.takes(torch.arange(5))  # integers: the per-tensor path
    assert not st.takes(torch.zeros(0))
    assert not st.takes(torch.randn(3, dtype=torch.complex64))
    monkeypatch.setattr(st, "LIMIT_BYTES", 64)
    assert st.takes(torch.randn(16)) and not st.takes(torch.randn(17))
    bt.force(False)
    assert not st.takes(torch.randn(4))  # CPU, not forced: the native kernel at once


def test_staging_keeps_no_graph_and_release_drops_the_buffers() -> None:
    w = torch.randn(8, requires_grad=True)
    y = w * 2
    stage = st.Stage()
    p = stage.begin(y)
    (buf,) = stage._buffers.values()
    assert buf.data is not None and not buf.data.requires_grad
    stage.flush()
    assert fpt.finish_many([p])[0][0] == _want(y)[0]
    stage.release()
    assert stage._buffers == {} and stage.pending() == 0
    assert math.isclose(float(y.detach().sum()), float(w.detach().sum()) * 2, rel_tol=1e-6)  # y untouched
