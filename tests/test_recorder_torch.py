"""The PyTorch recorder, through the launcher on real scripts and through ``reprobisect.torch``.

Each test records real training on CPU and checks what the trace says: the same script
twice agrees bitwise; a changed init scale, an unseeded dropout, an unseeded shuffle are
named at the first broken link; a detached loss is flagged as "no gradients"; the grad
norm is taken before clipping; recording leaves the final parameters bitwise unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from reprobisect.core.compare import compare_traces
from reprobisect.trace import fingerprint, read_trace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PY = sys.executable

# a small classifier; {init}, {seeding}, {loader} and {loss} are the knobs tests turn
SCRIPT = """
import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout({p}), nn.Linear(16, 3))
with torch.no_grad():
    {init}
{seeding}
loader = DataLoader(data, {loader})
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
if __name__ == "__main__":
    for x, y in loader:
        opt.zero_grad()
        out = model(x)
        {loss}
        loss.backward()
        opt.step()
"""

DEFAULTS = dict(
    p=0.0,
    init="pass",
    seeding="",
    loader="batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2)",
    loss="loss = nn.functional.cross_entropy(out, y)",
)


def script(tmp: Path, name: str, **knobs: str) -> Path:
    p = tmp / f"{name}.py"
    p.write_text(textwrap.dedent(SCRIPT.format(**{**DEFAULTS, **knobs})))
    return p


def record(prog: list[str], trace: Path, *opts: str, steps: int = 2) -> Path:
    cmd = [PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps), *opts, "--", *prog]
    r = subprocess.run(cmd, cwd=trace.parent, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return trace


def first(a: Path, b: Path):
    c = compare_traces(read_trace(a), read_trace(b))
    assert not c, "the two runs agree but should not"
    return c.first


def test_same_script_twice_is_bitwise_identical(tmp_path: Path) -> None:
    prog = [str(EXAMPLES / "mlp.py"), "--seed", "3"]
    a = record(prog, tmp_path / "a")
    b = record(prog, tmp_path / "b")
    c = compare_traces(read_trace(a), read_trace(b))
    assert c, str(c)
    t = read_trace(a)
    kinds = [r.kind for r in t.steps[0].records]
    assert kinds == sorted(kinds, key=["init", "batch", "input", "activation", "output", "loss", "grad", "param", "optim_state"].index)
    names = {r.name for r in t.steps[0].records}
    assert {"ids", "data[0]", "data[1]", "input", "body.0", "head", "output", "loss", "head.weight", "head.weight/exp_avg"} <= names
    assert kinds[0] == "init" and "init" not in {r.kind for r in t.steps[1].records}
    s = t.steps[0].scalars
    assert s["lr"] == [1e-3] and s["grad_norm"] > 0 and s["no_gradients"] is False and s["loss"] > 0
    assert s["data_wait_s"] >= 0 and s["compute_s"] >= 0


def test_changed_init_scale_is_named_at_that_layer_step_zero(tmp_path: Path) -> None:
    """The initial parameters come first in the chain (kind ``init``); the forward pass then
    diverges first at the layer whose weight changed."""
    a = record([str(script(tmp_path, "good"))], tmp_path / "a")
    b = record([str(script(tmp_path, "bad", init="model[3].weight.mul_(1.5)"))], tmp_path / "b")
    c = compare_traces(read_trace(a), read_trace(b))
    assert not c
    d = c.first
    assert (d.step, d.kind, d.name) == (0, "init", "3.weight")
    d = next(x for x in c.next if x.kind != "init")
    assert (d.step, d.kind, d.name, d.module) == (0, "activation", "3", "Linear")
    assert d.origin


def test_unseeded_dropout_is_named(tmp_path: Path) -> None:
    prog = [str(script(tmp_path, "drop", p="0.5", seeding="torch.seed()"))]
    d = first(record(prog, tmp_path / "a"), record(prog, tmp_path / "b"))
    assert (d.step, d.kind, d.name, d.module) == (0, "activation", "2", "Dropout")


@pytest.mark.parametrize("workers", [0, 2])
def test_unseeded_shuffle_is_named_at_batch_ids(tmp_path: Path, workers: int) -> None:
    prog = [str(script(tmp_path, "shuf", seeding="torch.seed()", loader=f"batch_size=16, shuffle=True, num_workers={workers}"))]
    a, b = record(prog, tmp_path / "a"), record(prog, tmp_path / "b")
    d = first(a, b)
    assert d.step == 0 and d.kind == "batch"
    ta = read_trace(a)
    ids = ta.steps[0].batch_ids
    assert len(ids) == 16 and len(set(ids)) == 16 and ids != list(range(16))
    assert ids != read_trace(b).steps[0].batch_ids


def test_batch_sampler_ids_are_recorded(tmp_path: Path) -> None:
    loader = "batch_sampler=[[5, 3, 200, 7]] * 4, num_workers=2"
    t = read_trace(record([str(script(tmp_path, "bs", loader=loader))], tmp_path / "t"))
    assert t.steps[0].batch_ids == [5, 3, 200, 7] == t.steps[1].batch_ids
    ids = next(r for r in t.steps[0].records if r.name == "ids")
    assert ids.kind == "batch" and ids.fingerprint == fingerprint(np.array([5, 3, 200, 7], dtype=np.int64))


def test_loss_on_detached_tensor_says_no_gradients(tmp_path: Path) -> None:
    loss = "loss = nn.functional.cross_entropy(out.detach(), y).requires_grad_()"
    t = read_trace(record([str(script(tmp_path, "det", loss=loss))], tmp_path / "t"))
    s = t.steps[0].scalars
    assert s["no_gradients"] is True and s["grad_params"] == 0
    assert sorted(s["no_grad_params"]) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    assert not [r for r in t.steps[0].records if r.kind == "grad"]
    good = read_trace(record([str(script(tmp_path, "ok"))], tmp_path / "ok"))
    assert good.steps[0].scalars["no_gradients"] is False and good.steps[0].scalars["no_grad_params"] == []


def test_grad_norm_is_taken_before_clipping(tmp_path: Path) -> None:
    t = read_trace(record([str(EXAMPLES / "cnn.py"), "--clip", "0.01"], tmp_path / "t"))
    s = t.steps[0].scalars
    assert s["grad_norm"] > 0.1, s
    assert s["grad_norm_at_step"] == pytest.approx(0.01, rel=1e-3)
    clipped = read_trace(record([str(EXAMPLES / "cnn.py"), "--clip", "0"], tmp_path / "u"))
    assert clipped.steps[0].scalars["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-12)


REPEAT = """
import torch
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.split = nn.LSTM(4, 4, batch_first=True)
    def forward(self, x):
        h = self.shared(self.shared(x))
        out, (hn, cn) = self.split(h.unsqueeze(1))
        return out.squeeze(1)
torch.manual_seed(0)
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    for micro in range(2):  # gradient accumulation: two backward passes per step
        m(torch.randn(3, 4)).pow(2).mean().backward()
    opt.step()
"""


def test_repeat_calls_structured_outputs_and_accumulation(tmp_path: Path) -> None:
    p = tmp_path / "rep.py"
    p.write_text(REPEAT)
    t = read_trace(record([str(p)], tmp_path / "t"))
    names = [r.name for r in t.steps[0].records]
    assert names.count("shared") == 1 and "shared#1" in names and "shared#2" in names and "shared#3" in names
    assert {"split[0]", "split[1]", "split[2]", "split#1[0]"} <= set(names)
    assert {"output", "output#1", "loss", "loss#1", "input", "input#1"} <= set(names)  # each micro-batch
    shared = {r.name: r for r in t.steps[0].records}
    assert shared["shared#1"].inputs == (shared["shared"].fingerprint,)


def test_full_steps_store_tensors_matching_fingerprints_bf16(tmp_path: Path) -> None:
    prog = [str(EXAMPLES / "transformer.py"), "--bf16", "--layers", "1"]
    t = read_trace(record(prog, tmp_path / "t", "--full-steps", "1"))
    assert not any(r.stored for r in t.steps[0].records)
    recs = [r for r in t.steps[1].records if r.stored]
    assert len(recs) == len(t.steps[1].records)
    dtypes = {r.dtype for r in recs}
    assert "bfloat16" in dtypes and "float32" in dtypes
    for r in recs:
        assert fingerprint(t.tensor(1, r)) == r.fingerprint, r.name
    assert [s.scalars["lr"][0] for s in t.steps] == pytest.approx([3e-4, 6e-4])  # LambdaLR warm-up


SAVE = """
import sys
import numpy as np
import torch
sys.path.insert(0, {examples!r})
import {mod} as ex
args = ex.parse({argv!r})
built = ex.build(args)
model, opt = built[0], built[1]
loader = next(b for b in built if isinstance(b, torch.utils.data.DataLoader))
sched = next((b for b in built if isinstance(b, torch.optim.lr_scheduler.LRScheduler)), None)
loss_fn = torch.nn.CrossEntropyLoss()
step = 0
for x, y in loader:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled="--bf16" in {argv!r}):
        out = model(x)
    loss = loss_fn(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    if sched is not None:
        sched.step()
    step += 1
    if step == 3:
        break
np.save(sys.argv[1], torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy())
"""


@pytest.mark.parametrize(
    "mod, argv",
    [("mlp", ["--num-workers", "2"]), ("transformer", ["--bf16", "--layers", "1"])],
    ids=["mlp-workers", "transformer-bf16"],
)
def test_recording_does_not_change_numerics(tmp_path: Path, mod: str, argv: list[str]) -> None:
    p = tmp_path / "save.py"
    p.write_text(SAVE.format(examples=str(EXAMPLES), mod=mod, argv=argv))
    subprocess.run([PY, str(p), str(tmp_path / "plain.npy")], check=True, timeout=180, capture_output=True)
    t = record([str(p), str(tmp_path / "rec.npy")], tmp_path / "t", "--full-steps", "0", steps=10)
    assert len(read_trace(t).steps) == 3
    plain, rec = np.load(tmp_path / "plain.npy"), np.load(tmp_path / "rec.npy")
    assert plain.tobytes() == rec.tobytes()


def test_explicit_api_records_and_restores_hooks(tmp_path: Path) -> None:
    import torch

    import reprobisect.torch as rt

    sys.path.insert(0, str(EXAMPLES))
    try:
        import mlp
    finally:
        sys.path.remove(str(EXAMPLES))

    def run(trace: Path | None) -> bytes:
        args = mlp.parse(["--seed", "5", "--hidden", "32"])
        model, opt, loader, loss_fn = mlp.build(args)
        ctx = rt.record(model, opt, loader, trace=trace, steps=2) if trace else None
        if ctx:
            rec = ctx.__enter__()
        for i, (x, y) in enumerate(loader):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            if i == 3:
                break
        if ctx:
            ctx.__exit__(None, None, None)
            assert rec.done and rec.step == 2
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()

    plain = run(None)
    assert run(tmp_path / "a") == plain
    assert run(tmp_path / "b") == plain
    assert compare_traces(read_trace(tmp_path / "a"), read_trace(tmp_path / "b"))
    ta = read_trace(tmp_path / "a")
    assert len(ta.steps) == 2 and ta.manifest.outcome["status"] == "ok"
    from torch.nn.modules import module as nn_module

    assert not nn_module._global_forward_hooks, "record() left global hooks behind"
    assert torch.autograd.backward.__module__ == "torch.autograd"


def test_state_captured_by_the_launcher_resumes_bitwise(tmp_path: Path) -> None:
    """Launcher run of 4 steps with --state-steps 1; a fresh build restored from it replays steps 2-3."""
    import torch

    import reprobisect.torch as rt

    argv = ["--layers", "1", "--samples", "64", "--seed", "4"]  # 4 batches an epoch: step 3 starts a new one
    a = record([str(EXAMPLES / "transformer.py"), *argv], tmp_path / "a", "--state-steps", "1", steps=4)
    state = rt.load_state(a, 1)
    assert {"model", "optimizer", "scheduler", "rng", "data"} <= set(state)

    sys.path.insert(0, str(EXAMPLES))
    try:
        import transformer as ex
    finally:
        sys.path.remove(str(EXAMPLES))
    args = ex.parse(argv)
    model, opt, sched, loader = ex.build(args)
    rt.restore_state(a, 1, {"model": model, "optimizer": opt, "scheduler": sched}, loader=loader)
    loss_fn = torch.nn.CrossEntropyLoss()
    with rt.record(model, opt, loader, trace=tmp_path / "b", steps=2):
        done = 0
        while done < 2:
            for x, y in loader:
                opt.zero_grad()
                loss_fn(model(x).reshape(-1, args.vocab), y.reshape(-1)).backward()
                opt.step()
                sched.step()
                done += 1
                if done == 2:
                    break
    ta, tb = read_trace(a), read_trace(tmp_path / "b")
    for k in (0, 1):
        ra = [(r.kind, r.name, r.fingerprint) for r in ta.steps[2 + k].records]
        rb = [(r.kind, r.name, r.fingerprint) for r in tb.steps[k].records if r.kind != "init"]
        assert ra == rb, f"resumed step {2 + k} differs"
    # the resumed trace's initial parameters are the restored ones: A's after step 1
    init_b = [(r.name, r.fingerprint) for r in tb.steps[0].records if r.kind == "init"]
    assert init_b == [(r.name, r.fingerprint) for r in ta.steps[1].records if r.kind == "param"]
    assert ta.steps[3].batch_ids == tb.steps[1].batch_ids


CLOSURE = """
import torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(m(x), y)
    loss.backward()
    return loss
for _ in range(5):
    if {use_closure}:
        opt.step(closure)
    else:
        closure()
        opt.step()
"""


def test_step_with_closure_records_the_gradients_it_computes(tmp_path: Path) -> None:
    """Lightning and LBFGS run forward/backward inside optimizer.step(closure)."""
    traces = []
    for flag in (True, False):
        p = tmp_path / f"c{flag}.py"
        p.write_text(CLOSURE.format(use_closure=flag))
        traces.append(read_trace(record([str(p)], tmp_path / f"t{flag}")))
    with_closure, plain = traces
    s = with_closure.steps[0].scalars
    assert s["no_gradients"] is False and s["grad_params"] == 4 and s["grad_norm"] > 0
    fp = lambda t: [(r.kind, r.name, r.fingerprint) for st in t.steps for r in st.records]  # noqa: E731
    assert fp(with_closure) == fp(plain)


SCALER = """
import torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for i in range(6):
    opt.zero_grad()
    out = m(x)
    if i == 1:  # inf gradients from a finite loss: the scaler skips optimizer.step()
        out.register_hook(lambda g: g * float("inf"))
    loss = nn.functional.mse_loss(out, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


def test_a_step_the_grad_scaler_skips_is_its_own_step(tmp_path: Path) -> None:
    """One trace step per iteration: the skipped one says so and has no param records; the
    next is not folded into it, and the halved scale shows. Overflowing scaled gradients are
    what the scaler handles: --stop-on-nonfinite does not stop there."""
    p = tmp_path / "scaler.py"
    p.write_text(SCALER)
    t = read_trace(record([str(p)], tmp_path / "t", "--stop-on-nonfinite", steps=4))
    assert [s.step for s in t.steps] == [0, 1, 2, 3]
    s0, s1, s2 = t.steps[0], t.steps[1], t.steps[2]
    assert s1.scalars["scaler_skipped"] is True and "scaler_skipped" not in s2.scalars
    assert not [r for r in s1.records if r.kind in ("param", "optim_state")]
    assert {r.kind for r in s1.records} >= {"activation", "loss", "grad"}
    assert [r.name for r in s2.records if r.kind == "activation"] == [r.name for r in s0.records if r.kind == "activation"]
    assert (s0.scalars["scaler_scale"], s1.scalars["scaler_scale"], s2.scalars["scaler_scale"]) == (1024.0, 1024.0, 512.0)
    assert "first_nonfinite" not in s1.scalars
    assert any(r.stats["inf"] or r.stats["nan"] for r in s1.records if r.kind == "grad")


BROKEN_RECORDER = """
import inspect, sys
import torch
from torch import nn
import reprobisect.runners.fingerprint_torch as ft

orig, orig_many = ft.begin, ft.begin_many
calls = 0
def fail_inside():  # the recorder's own code failing, from inside {where}
    global calls
    if any(f.function == "{where}" for f in inspect.stack()[2:7]):
        calls += 1
        if calls == 3:
            raise RuntimeError("boom inside the recorder")
def begin(t, with_stats=True):
    fail_inside()
    return orig(t, with_stats)
def begin_many(ts, with_stats=True):
    fail_inside()
    return orig_many(ts, with_stats)
ft.begin, ft.begin_many = begin, begin_many
import reprobisect.runners.torch as rt  # (a small CPU gradient's hook fingerprints nothing: it reads its version)
import reprobisect.runners.torch_chain as rc
import reprobisect.runners.observers.torch_gradients as rg
orig_version = rt._version
def version(t):
    fail_inside()
    return orig_version(t)
rt._version = rc._version = rg._version = version  # where the step chain and the gradient hook read it

torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for i in range(100):
    opt.zero_grad()
    nn.functional.mse_loss(m(x), y).backward()
    opt.step()
print("finished", i, file=sys.stderr)
"""


@pytest.mark.parametrize("where", ["_fwd", "_grad_hook", "_opt_post"])
def test_a_failure_of_the_recorder_is_infra_never_the_programs_crash(tmp_path: Path, where: str) -> None:
    """A bug in reprobisect's own hooks must not read as the user's program crashing (a
    search would blame a commit for it): the probe ends as infra, promptly, and says why.
    Also from the gradient hook, which runs inside the autograd engine."""
    p = tmp_path / "broken.py"
    p.write_text(BROKEN_RECORDER.replace("{where}", where))
    trace = tmp_path / "t"
    cmd = [PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "50", "--", str(p)]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 7, r.stderr[-2000:]
    assert "finished" not in r.stderr  # stopped at the next safe point, not after 100 steps
    assert "recorder failed" in r.stderr and "boom inside the recorder" in r.stderr
    from reprobisect.core.outcome import Outcome

    t = read_trace(trace, allow_incomplete=True)
    o = Outcome.from_json(t.manifest.outcome)
    assert o.status == "infra" and "reprobisect bug" in o.detail and "boom" in (o.traceback or "")
    assert o.step is not None and o.step <= 2


def test_the_hooks_switch_gradients_off_and_back_as_they_were() -> None:
    """``_NoGrad`` (the per-module-call stand-in for ``torch.no_grad``): off inside, as it
    was after, also when the body raises (a StopRun from a hook)."""
    import torch

    from reprobisect.runners.torch import _NoGrad

    for before in (True, False):
        torch.set_grad_enabled(before)
        with _NoGrad():
            assert not torch.is_grad_enabled()
            with _NoGrad():
                assert not torch.is_grad_enabled()
            assert not torch.is_grad_enabled()
        assert torch.is_grad_enabled() is before
        with pytest.raises(KeyboardInterrupt):
            with _NoGrad():
                raise KeyboardInterrupt
        assert torch.is_grad_enabled() is before
    torch.set_grad_enabled(True)
