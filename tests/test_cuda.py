"""The CUDA paths: fingerprints and stats computed on the device, one host transfer per step,
recording a model that trains on the GPU, and state capture with CUDA RNG.

Skipped where no CUDA device is visible (CI has none); run on a GPU machine with
``./scripts/test.sh tests/test_cuda.py`` (``scripts/device_check.sh`` does, with the
benchmark). Deterministic CUDA runs need ``CUBLAS_WORKSPACE_CONFIG``, set here for the
recorded subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprobisect.core.compare import compare_traces  # noqa: E402
from reprobisect.runners import fingerprint_torch as ft  # noqa: E402
from reprobisect.trace import read_trace  # noqa: E402
from reprobisect.trace.fingerprint import ROW, fingerprint, stats  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PY = sys.executable
ENV = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

PAIRS = [
    (torch.float32, np.float32),
    (torch.float16, np.float16),
    (torch.bfloat16, ml_dtypes.bfloat16),
    (torch.float64, np.float64),
    (torch.int64, np.int64),
    (torch.uint8, np.uint8),
    (torch.bool, np.bool_),
    (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
]


def _host_bits(t: torch.Tensor, ndtype) -> np.ndarray:
    c = t.detach().cpu().contiguous()
    raw = c.reshape(-1).view(torch.uint8).numpy()
    return raw.view(ndtype).reshape(tuple(c.shape))


def _tensor(tdtype, shape, device="cuda") -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    if tdtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, device=device).bool()
    if not tdtype.is_floating_point:
        return torch.randint(-1000, 1000, shape, generator=g, device=device).to(tdtype)
    return (torch.randn(shape, generator=g, device=device) * 3).to(tdtype)


@pytest.mark.parametrize("tdtype, ndtype", PAIRS, ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, ROW + 1), (ft._ACCEL_BLOCK_ROWS * ROW // 2 + 5,)], ids=str)
def test_device_fingerprint_and_stats_equal_the_host_reference(tdtype, ndtype, shape):
    t = _tensor(tdtype, shape)
    a = _host_bits(t, ndtype)
    fp, s = ft.fingerprint_and_stats(t)
    assert fp == fingerprint(a) == ft.fingerprint(t.cpu())
    want = stats(a)
    for k in ("norm", "min", "max", "mean"):
        if isinstance(want[k], str):
            assert s[k] == want[k], k
        else:
            assert s[k] == pytest.approx(want[k], rel=1e-6, abs=1e-9), k


def test_block_edges_on_the_device():
    """Accelerators reduce rows in blocks of _DEFAULT_BLOCK_ROWS: across an edge, same value."""
    rows = ft._ACCEL_BLOCK_ROWS + 3
    t = torch.randint(-(2**31), 2**31 - 1, (rows * ROW + 7,), dtype=torch.int64, device="cuda").to(torch.int32)
    assert ft.fingerprint(t) == fingerprint(t.cpu().numpy())


def test_nan_and_inf_counted_on_the_device():
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0], device="cuda")
    _, s = ft.fingerprint_and_stats(t)
    assert (s["nan"], s["inf"], s["mean"]) == (1, 2, "nan")


def test_an_activation_on_the_device_is_not_held_and_its_nan_are_counted(tmp_path):
    """Its NaN/Inf are counted on the device when it is fingerprinted, so the recorder need
    not hold it past its backward (holding every activation to the step's end raised the
    peak memory by about the gradients' size)."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    import reprobisect.torch as rt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = []
    model[0].register_forward_hook(lambda m, a, out: first.append(StorageWeakRef(out.untyped_storage())))
    x = torch.ones(4, 8, device="cuda")
    x[0, :2], x[1, 0] = float("nan"), float("-inf")
    with rt.record(model, opt, trace=tmp_path / "t", steps=1):
        opt.zero_grad()
        loss = model(x).square().mean()
        gc.collect()
        assert first[-1].expired()
        loss.backward()
        opt.step()
    recs = {(r.kind, r.name): r for r in read_trace(tmp_path / "t").steps[0].records}
    assert (recs[("input", "input")].stats["nan"], recs[("input", "input")].stats["inf"]) == (2, 1)
    assert recs[("activation", "0")].stats["nan"] >= 8


def test_finish_many_over_two_devices_equals_one_by_one():
    ts = [torch.randn(5, device="cuda"), torch.randn(3 * ROW + 1), torch.randn(2 * ROW, device="cuda").to(torch.bfloat16),
          torch.arange(7, device="cuda"), torch.zeros(0, device="cuda"), torch.randn(100)]
    pend = [ft.begin(t) for t in ts]
    assert ft.finish_many(pend) == [ft.finish(p) for p in pend]


def _record(prog: list[str], trace: Path, *opts: str, steps: int = 3) -> Path:
    cmd = [PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps), *opts, "--", *prog]
    r = subprocess.run(cmd, cwd=trace.parent, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return trace


@pytest.mark.parametrize("example, extra", [("mlp.py", []), ("transformer.py", ["--bf16"])])
def test_a_cuda_run_recorded_twice_agrees_and_names_the_device(tmp_path, example, extra):
    prog = [str(EXAMPLES / example), "--device", "cuda", "--seed", "1", *extra]
    a = _record(prog, tmp_path / "a")
    b = _record(prog, tmp_path / "b")
    ta, tb = read_trace(a), read_trace(b)
    c = compare_traces(ta, tb)
    assert c, str(c)
    env = ta.manifest.environment
    devices = json.dumps(env["torch"]["devices"])
    assert torch.cuda.get_device_name(0) in devices, devices
    s = ta.steps[0].scalars
    assert s["cuda_memory_allocated"] > 0 and s["cuda_memory_reserved"] >= s["cuda_memory_allocated"]
    assert env["recorder"]["fingerprint"]  # which CPU path; the device tensors used torch ops


def test_a_changed_seed_on_cuda_is_found_at_step_zero(tmp_path):
    a = _record([str(EXAMPLES / "mlp.py"), "--device", "cuda", "--seed", "1"], tmp_path / "a")
    b = _record([str(EXAMPLES / "mlp.py"), "--device", "cuda", "--seed", "2"], tmp_path / "b")
    c = compare_traces(read_trace(a), read_trace(b))
    assert not c and c.first.step == 0


SAVE = """
import sys, numpy as np, torch
sys.path.insert(0, {examples!r})
import mlp as ex
args = ex.parse(["--device", "cuda", "--seed", "5"])
model, opt, loader, loss_fn = ex.build(args)
for step, (x, y) in enumerate(loader):
    x, y = x.cuda(), y.cuda()
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
    if step == 3:
        break
np.save(sys.argv[1], torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy())
"""


def test_recording_on_cuda_does_not_change_numerics(tmp_path):
    p = tmp_path / "save.py"
    p.write_text(SAVE.format(examples=str(EXAMPLES)))
    subprocess.run([PY, str(p), str(tmp_path / "plain.npy")], check=True, timeout=300, capture_output=True, env=ENV)
    _record([str(p), str(tmp_path / "rec.npy")], tmp_path / "t", "--full-steps", "0", steps=10)
    assert np.load(tmp_path / "plain.npy").tobytes() == np.load(tmp_path / "rec.npy").tobytes()


def test_state_with_cuda_rng_resumes_bitwise(tmp_path):
    """Captured at step 1 by the launcher (CUDA RNG included: dropout draws on the GPU);
    restored into fresh objects, steps 2-3 replay bitwise."""
    import reprobisect.torch as rt

    argv = ["--device", "cuda", "--samples", "256", "--seed", "4", "--dropout", "0.3"]
    a = _record([str(EXAMPLES / "mlp.py"), *argv], tmp_path / "a", "--state-steps", "1", steps=4)
    sys.path.insert(0, str(EXAMPLES))
    try:
        import mlp as ex
    finally:
        sys.path.remove(str(EXAMPLES))
    args = ex.parse(argv)
    model, opt, loader, loss_fn = ex.build(args)
    torch.manual_seed(12345)  # disturb every RNG: restore must put them back
    torch.cuda.manual_seed_all(12345)
    rt.restore_state(a, 1, {"model": model, "optimizer": opt}, loader=loader)
    with rt.record(model, opt, loader, trace=tmp_path / "b", steps=2):
        done = 0
        while done < 2:
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                done += 1
                if done == 2:
                    break
    ta, tb = read_trace(a), read_trace(tmp_path / "b")
    for k in (0, 1):
        ra = [(r.kind, r.name, r.fingerprint) for r in ta.steps[2 + k].records]
        rb = [(r.kind, r.name, r.fingerprint) for r in tb.steps[k].records]
        assert ra == rb, f"resumed step {2 + k} differs"


AMP = """
import torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)  # overflows in fp16 until it has halved enough
x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
for i in range(40):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.cross_entropy(m(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


def test_fp16_amp_steps_the_scaler_skips_are_their_own_steps(tmp_path):
    """fp16 autocast with a GradScaler whose first scales overflow: each skipped iteration is
    one trace step flagged scaler_skipped (no param records), then normal steps follow."""
    p = tmp_path / "amp.py"
    p.write_text(AMP)
    t = read_trace(_record([str(p)], tmp_path / "t", "--stop-on-nonfinite", steps=30))
    skipped = [s.step for s in t.steps if s.scalars.get("scaler_skipped")]
    assert len(t.steps) == 30 and skipped and skipped == list(range(len(skipped))), skipped
    for s in t.steps:
        kinds = {r.kind for r in s.records}
        assert ("param" in kinds) != bool(s.scalars.get("scaler_skipped")), s.step
        assert [r.name for r in s.records if r.kind == "activation"] == ["0", "1", "2"], s.step
    scales = [s.scalars["scaler_scale"] for s in t.steps[: len(skipped) + 1]]
    assert scales == [2.0**40 / 2**k for k in range(len(skipped) + 1)]


# -- the batched path (runners.batched_torch): the default for tensors on the GPU ---------------


def _batched_deterministically(ts: list) -> tuple[list, list]:
    """``batched_torch.begin_many`` and ``finish_many`` of ``ts`` under deterministic algorithms."""
    from reprobisect.runners import batched_torch as bt

    torch.use_deterministic_algorithms(True)
    try:
        pend = bt.begin_many(ts)
        return pend, ft.finish_many(pend)
    finally:
        torch.use_deterministic_algorithms(False)


def _assert_equal_to_the_host(ts: list, got: list) -> None:
    """Device results equal the host's: fingerprints bit for bit, statistics up to float64 rounding."""
    for t, (fp, s) in zip(ts, got, strict=True):
        host = t.cpu()
        assert fp == ft.fingerprint(host)
        want = ft.fingerprint_and_stats(host)[1]
        assert (s["nan"], s["inf"], s["min"], s["max"]) == (want["nan"], want["inf"], want["min"], want["max"])
        for k in ("norm", "mean"):
            if not isinstance(want[k], str):
                assert s[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k


def test_batched_fingerprints_on_the_device_equal_the_host_reference():
    g = torch.Generator(device="cuda").manual_seed(1)
    ts = [(torch.randn(n, generator=g, device="cuda") * 3).to(dt)
          for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64)
          for n in (1, 17, 257, ROW - 1, ROW + 1, 3 * ROW + 5)]
    ts += [torch.randn(40, 24, device="cuda").t(), torch.tensor([1.0, float("nan"), float("inf")], device="cuda")]
    pend, got = _batched_deterministically(ts)
    assert all(p.batch is not None for p in pend)
    _assert_equal_to_the_host(ts, got)


def test_the_triton_kernel_computes_the_rows_and_reads_large_tensors_in_place(monkeypatch):
    """On a GPU with Triton the batched rows and a large tensor's come from one kernel
    (``runners.triton_rows``), which passes its self-check and gives the host reference's
    fingerprints; nothing raises under deterministic algorithms."""
    pytest.importorskip("triton")
    from reprobisect.runners import batched_torch as bt

    monkeypatch.setattr(bt, "MAX_TENSOR_BYTES", 1 << 16)
    g = torch.Generator(device="cuda").manual_seed(2)
    dts = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    ts = [(torch.randn(n, generator=g, device="cuda") * 3).to(dt) for dt in dts for n in (5, 300, ROW + 3, 9 * ROW + 2)]
    ts[1][7] = float("nan")
    pend, got = _batched_deterministically(ts)
    status = bt.fused_status()
    assert all(status[f"{ts[0].device} {ft._name(dt)}"] == "on" for dt in dts), status
    assert all(p.batch is not None for p in pend)
    _assert_equal_to_the_host(ts, got)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_the_triton_kernel_runs_on_the_tensors_device_not_the_current_one(monkeypatch):
    """A model spread over GPUs in one process: a tensor on cuda:1 while cuda:0 is current."""
    pytest.importorskip("triton")
    from reprobisect.runners import batched_torch as bt

    monkeypatch.setattr(bt, "MAX_TENSOR_BYTES", 1 << 16)
    ts = [torch.randn(n, device="cuda:1") for n in (5, 300, 9 * ROW + 2)]
    with torch.cuda.device(0):
        pend, got = _batched_deterministically(ts)
    assert bt.fused_status()["cuda:1 float32"] == "on"
    _assert_equal_to_the_host(ts, got)


def test_a_batched_step_makes_no_host_sync_before_the_steps_end(tmp_path, monkeypatch):
    """The batched fingerprints of grads, params, optimizer state and the staged activations
    never synchronise (once a set of shapes has its layout): the step's one copy to the host
    is at its end."""
    import reprobisect.torch as rt
    from reprobisect.runners import batched_torch as bt

    orig, calls, strict_on = bt.begin_many, [], [False]

    def strict(ts, with_stats=True):
        if strict_on[0]:
            torch.cuda.set_sync_debug_mode("error")  # a synchronising call raises
        try:
            calls.append(len(ts))
            return orig(ts, with_stats)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(bt, "begin_many", strict)
    bt._layouts.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(32, 64, device="cuda")
    with rt.record(model, opt, trace=tmp_path / "t", steps=4) as rec:
        for i in range(4):
            strict_on[0] = i >= 1  # the first step builds the layouts (activations, grads, params, state)
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    assert rec.failed is None and max(calls) >= 16
    assert len(read_trace(tmp_path / "t").steps) == 4


def test_staged_activations_on_the_device_keep_the_values_their_hook_saw(tmp_path):
    """An activation is copied into a staging buffer at its hook and fingerprinted at the
    step's end: ``ReLU(inplace=True)`` changing it afterwards must not reach its record."""
    import reprobisect.torch as rt
    from reprobisect.runners import staged_torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(inplace=True), torch.nn.Linear(16, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    model[0].register_forward_hook(lambda m, a, out: seen.append(out.detach().cpu().clone()))
    x = torch.randn(4, 8, device="cuda")
    assert staged_torch.takes(x)
    with rt.record(model, opt, trace=tmp_path / "t", steps=1):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    recs = {(r.kind, r.name): r for r in read_trace(tmp_path / "t").steps[0].records}
    assert (seen[0] < 0).any()  # the ReLU did change it
    assert recs[("activation", "0")].fingerprint == ft.fingerprint(seen[0])
    assert recs[("activation", "0")].stats["min"] == float(seen[0].min())


def test_a_device_tensors_state_is_copied_once_into_memory_numpy_owns():
    from reprobisect.runners import torch_state

    for dtype, ndtype in ((torch.float32, np.float32), (torch.bfloat16, ml_dtypes.bfloat16)):
        t = torch.randn(64, 33, device="cuda").to(dtype)
        a = torch_state._to_numpy(t, "w")
        assert a.flags.owndata and a.dtype == ndtype and a.shape == (64, 33)
        assert np.array_equal(a.view(np.uint8), t.cpu().contiguous().view(torch.uint8).numpy().reshape(64, -1))
