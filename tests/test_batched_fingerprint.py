"""The batched fingerprint path (``runners.batched_torch``), forced on CPU.

Fingerprints must be bit-identical to the host reference for every size around the slot
boundaries (16, 256 and ROW lanes), every float dtype and strided views; statistics equal
the per-tensor path's to float64 rounding; NaN/Inf are counted; nothing raises under
deterministic algorithms; and a recorder step with the batched path writes the same
fingerprints as the default (native) path.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from reprobisect.runners import batched_torch as bt
from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.trace.fingerprint import _row_sums, dtype_name, finish_fingerprint
from reprobisect.trace import read_trace

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# element counts around every slot boundary, for 2-, 4- and 8-byte elements
SIZES = [1, 2, 3, 15, 16, 17, 31, 32, 33, 255, 256, 257, 511, 513, 4095, 4096, 4097, 8191, 8193, 3 * 4096 + 5]


def _host_bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(raw).numpy()


def _reference(t: torch.Tensor) -> str:
    bits = _host_bits(t)
    h = np.frombuffer(bits.tobytes(), dtype=np.uint8)
    pad = (-h.size) % 4
    lanes = np.concatenate([h, np.zeros(pad, np.uint8)]).view("<i4")
    with np.errstate(over="ignore"):
        sums = _row_sums(lanes)
    return finish_fingerprint(dtype_name(t.dtype), tuple(t.shape), bits.nbytes, sums)


@pytest.fixture(autouse=True)
def batched():
    bt.force(True)
    yield
    bt.force(None)


@pytest.fixture(scope="module")
def tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for dt in DTYPES:
        for n in SIZES:
            out.append((torch.randn(n, generator=g, dtype=torch.float64) * 3 + 0.5).to(dt))
        base = torch.randn(24, 40, generator=g).to(dt)
        out += [base.t(), base[::3, 1:], torch.randn((), generator=g).to(dt), base.view(2, 3, 4, 40)]
    return out


def _assert_stats_close(got: dict, want: dict, n: int) -> None:
    assert got["nan"] == want["nan"] and got["inf"] == want["inf"]
    assert got["min"] == want["min"] and got["max"] == want["max"]
    assert got["norm"] == pytest.approx(want["norm"], rel=1e-10)
    # a sum's rounding is relative to the magnitudes summed (its value may cancel to ~0)
    assert got["mean"] == pytest.approx(want["mean"], rel=1e-12, abs=1e-14 * want["norm"] / math.sqrt(n))


def test_batched_fingerprints_equal_the_reference_and_stats_the_per_tensor_path(tensors) -> None:
    pend = bt.begin_many(tensors)
    assert all(p.batch is not None for p in pend)  # every one took the batched path
    assert len({id(p.batch) for p in pend}) == len(DTYPES)  # one batch per dtype
    got = fpt.finish_many(pend)
    bt.force(False)
    for t, (fp, st) in zip(tensors, got):
        assert fp == _reference(t), (t.dtype, tuple(t.shape))
        assert fp == fpt.fingerprint(t)
        _assert_stats_close(st, fpt.fingerprint_and_stats(t)[1], t.numel())


def test_without_stats_and_the_layout_is_reused(tensors) -> None:
    first = bt.begin_many(tensors[:5], with_stats=False)
    again = bt.begin_many([t + 0 for t in tensors[:5]], with_stats=False)
    assert len(bt._layouts) >= 1 and first[0].batch is not again[0].batch
    got = fpt.finish_many(first + again)
    for t, (fp, st) in zip(tensors[:5] * 2, got):
        assert fp == _reference(t) and st is None


def test_layouts_sharing_the_scratch_buffer_see_zero_padding() -> None:
    big, small = torch.full((300,), 7.0), torch.tensor([1.0, -2.0, 3.0])  # big writes where small pads
    for ts in ([big], [small], [big, small], [small]):
        got = fpt.finish_many(bt.begin_many(ts))
        assert [fp for fp, _ in got] == [_reference(t) for t in ts]
        assert [st["max"] for _, st in got] == [float(t.max()) for t in ts]


def test_mixed_eligible_and_other_tensors_keep_their_order() -> None:
    ts = [torch.arange(10), torch.randn(7), torch.zeros(0), torch.randn(3, dtype=torch.complex64), torch.randn(5)]
    pend = bt.begin_many(ts)
    assert [p.batch is not None for p in pend] == [False, True, False, False, True]
    for t, (fp, _st) in zip(ts, fpt.finish_many(pend)):
        assert fp == fpt.fingerprint(t)


def test_nan_and_inf_are_counted_and_min_max_ignore_padding() -> None:
    a = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    b = torch.full((300,), 5.0)  # padding zeros must not become its min
    c = torch.full((4097,), -3.0)  # nor the max of a tensor that spans two rows
    (_, sa), (_, sb), (_, sc) = fpt.finish_many(bt.begin_many([a, b, c]))
    assert sa["nan"] == 1 and sa["inf"] == 1
    assert sb["min"] == sb["max"] == 5.0 and sc["min"] == sc["max"] == -3.0
    assert sc["mean"] == -3.0 and sc["norm"] == pytest.approx(3.0 * math.sqrt(4097))


def test_nothing_raises_under_deterministic_algorithms(tensors) -> None:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = fpt.finish_many(bt.begin_many(tensors))
    finally:
        torch.use_deterministic_algorithms(was)
    assert [fp for fp, _ in got] == [_reference(t) for t in tensors]


def test_parameters_take_the_batched_path_and_other_subclasses_do_not() -> None:
    class Tagged(torch.Tensor):
        pass

    p = torch.nn.Parameter(torch.randn(5))
    tagged = torch.randn(5).as_subclass(Tagged)
    pend = bt.begin_many([p, tagged])
    assert pend[0].batch is not None and pend[1].batch is None
    assert [fp for fp, _ in fpt.finish_many(pend)] == [_reference(p.detach()), _reference(torch.Tensor(tagged))]


def test_not_forced_cpu_tensors_keep_the_native_path() -> None:
    bt.force(False)
    assert not bt.enabled_for(torch.device("cpu"))
    assert bt.begin_many([torch.randn(4)])[0].batch is None
    assert bt.enabled_for(torch.device("meta"))  # any accelerator


def _train(trace: Path, n_steps: int = 3, detail: str = "full") -> None:
    import reprobisect.torch as rt

    torch.manual_seed(0)
    # ReLU(inplace=True) changes the first Linear's output after its hook: a staged copy keeps what the hook saw
    model = torch.nn.Sequential(torch.nn.Linear(6, 33), torch.nn.ReLU(inplace=True), torch.nn.LayerNorm(33),
                                torch.nn.Linear(33, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with rt.record(model, opt, trace=trace, steps=n_steps, detail=detail):
        for _ in range(n_steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(torch.randn(8, 6, generator=g)), torch.randn(8, 2, generator=g)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # the pre-clip norm is taken before this
            opt.step()


def test_a_recorded_step_is_the_same_on_the_batched_path(tmp_path: Path) -> None:
    bt.force(False)
    _train(tmp_path / "native")
    bt.force(True)
    _train(tmp_path / "batched")
    a, b = read_trace(tmp_path / "native"), read_trace(tmp_path / "batched")
    for sa, sb in zip(a.steps, b.steps, strict=True):
        assert [(r.kind, r.name, r.fingerprint) for r in sa.records] == [(r.kind, r.name, r.fingerprint) for r in sb.records]
        for ra, rb in zip(sa.records, sb.records):
            if ra.stats:
                n = max(1, int(np.prod(ra.shape)))
                _assert_stats_close(rb.stats, ra.stats, n)
        assert sb.scalars["grad_norm"] == pytest.approx(sa.scalars["grad_norm"], rel=1e-12)
        assert sb.scalars["grad_norm"] > 0.05  # before clipping


def test_a_sentinel_holds_the_gradient_norm_a_full_recording_does(tmp_path: Path) -> None:
    """On the batched path a sentinel's gradient norm comes from the batch's statistics, as
    a full recording's does: the same float64 bits, before clipping."""
    _train(tmp_path / "full")
    _train(tmp_path / "sentinel", detail="sentinel")
    full, sentinel = read_trace(tmp_path / "full"), read_trace(tmp_path / "sentinel")
    assert [s.scalars["grad_norm"] for s in sentinel.steps] == [s.scalars["grad_norm"] for s in full.steps]
    assert all(s.scalars["grad_norm"] > 0.05 for s in sentinel.steps)
    assert not any(r.kind == "grad" for s in sentinel.steps for r in s.records)


def test_batches_are_cut_by_bytes_and_huge_tensors_go_alone(tensors, monkeypatch) -> None:
    monkeypatch.setattr(bt, "MAX_BATCH_BYTES", 64 << 10)
    monkeypatch.setattr(bt, "MAX_TENSOR_BYTES", 32 << 10)
    pend = bt.begin_many(tensors)
    assert len({id(p.batch) for p in pend if p.batch is not None}) > len(DTYPES)
    assert any(p.batch is None for p in pend)  # over MAX_TENSOR_BYTES: the per-tensor path
    got = fpt.finish_many(pend)
    assert [fp for fp, _ in got] == [_reference(t) for t in tensors]


def test_small_cpu_gradients_are_fingerprinted_together_when_backward_returns(tmp_path: Path, monkeypatch) -> None:
    """On the native path, a gradient of at most 64 KiB waits for the end of backward and
    joins the others in one kernel call (a call of its own costs more than reading it
    again); a larger one is read at its hook, in cache. The norm is the one before clipping
    either way; the grad records are what the optimizer used."""
    import reprobisect.torch as rtorch

    bt.force(False)
    calls: dict[str, list] = {"alone": [], "many": []}
    one, many = fpt.begin, fpt.begin_many
    monkeypatch.setattr(fpt, "begin", lambda t, with_stats=True: calls["alone"].append(t.numel()) or one(t, with_stats))
    monkeypatch.setattr(fpt, "begin_many", lambda ts, with_stats=True: calls["many"].append(sorted(t.numel() for t in ts))
                        or many(ts, with_stats))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.Tanh(), torch.nn.Linear(128, 2))  # 128 KiB weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rtorch.record(model, opt, trace=tmp_path / "t", steps=1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.randn(8, 256)), torch.randn(8, 2))
        calls["alone"].clear()
        calls["many"].clear()
        loss.backward()
        assert sorted(calls["alone"]) == [1, 256 * 128]  # the loss, and the large gradient at its hook
        assert calls["many"] == [[2, 128, 128 * 2]]  # the small ones, together
        norm = math.sqrt(sum(float(p.grad.double().square().sum()) for p in model.parameters()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        after = {fpt.fingerprint(p.grad) for p in model.parameters()}
        opt.step()
    step = read_trace(tmp_path / "t").steps[0]
    assert {r.fingerprint for r in step.records if r.kind == "grad"} == after  # what the optimizer used
    assert step.scalars["grad_norm"] == pytest.approx(norm, rel=1e-9) and norm > 1e-3 * 10  # taken before clipping


def test_in_a_distributed_run_small_cpu_gradients_are_read_at_their_hook() -> None:
    """Backward returns after DDP averaged the gradients: a small gradient deferred to then
    would enter the norm averaged, beside large ones read at their hook as this rank made them."""
    import torch.distributed as dist

    from reprobisect.runners import torch as rt

    g = torch.zeros(16)
    assert rt._small_on_cpu(g) and not rt._small_on_cpu(torch.zeros(32 << 10))
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        assert not rt._small_on_cpu(g)
    finally:
        dist.destroy_process_group()
    assert rt._small_on_cpu(g)
