"""``--detail sentinel``: what a sentinel trace holds, how two are compared, the flags.

Synthetic traces (``TraceWriter``) check the comparison's order of sentinels within a step
(batch ids → batch → loss → grad norm → lr → scale → params after the step), a sentinel
against a full trace, and older traces without the field. Real recordings (torch on CPU,
the launcher in a subprocess) check what the recorder writes and what a planted late
change (a learning rate at step 5 of 8, a data-order change, a gradient changed after
clipping) is named as; the CLI checks the flags on ``capture`` and ``repro`` and that a
bad value is one usage line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from reprobisect import native
from reprobisect.cli import main
from reprobisect.core.compare import compare_traces
from reprobisect.errors import TraceError
from reprobisect.trace import TraceWriter, read_trace, record_array
from reprobisect.trace.format import SENTINEL_KINDS

PY = sys.executable
ENV = {"device": "cpu", "host": {"hostname": "h1"}}
SENTINEL = {"detail": "sentinel", "state_every": 3}
PARAMS = ("fc.weight", "fc.bias")


# -- synthetic traces: the comparison ---------------------------------------------------


def _sentinel_trace(path: Path, *, steps: int = 6, policy=SENTINEL, change=None, full: bool = False) -> Path:
    """A trace shaped like the recorder's sentinel traces (``full``: with gradients and
    optimizer state too); ``change(step, what, value)`` may return another value."""
    ch = change or (lambda k, what, v: v)
    with TraceWriter(path, command=["python", "train.py"], environment=ENV, policy=policy) as w:
        for k in range(steps):
            w.begin_step(k)
            rng = np.random.default_rng(k)  # the same values whatever else a step holds
            params = {n: rng.standard_normal((4, 2) if n.endswith("weight") else 4).astype(np.float32) for n in PARAMS}
            recs = []
            if k == 0:
                recs += [("init", n, a + 1) for n, a in params.items()]
            ids = np.asarray(ch(k, "ids", [2 * k, 2 * k + 1]), dtype=np.int64)
            recs += [("batch", "ids", ids), ("batch", "data[0]", rng.standard_normal((2, 2)).astype(np.float32))]
            recs.append(("loss", "loss", np.float32(ch(k, "loss", 1.0 / (k + 1)))))
            if full:
                recs += [("activation", "fc", rng.standard_normal((2, 4)).astype(np.float32))]
                recs += [("grad", n, a * 0.5) for n, a in params.items()]
            recs += [("param", n, ch(k, f"param:{n}", a)) for n, a in params.items()]
            if full:
                recs += [("optim_state", f"{n}/exp_avg", a * 0.1) for n, a in params.items()]
            for kind, name, a in recs:
                w.record(record_array(name, kind, a), None)
            scalars = {"loss": 1.0, "grad_norm": ch(k, "grad_norm", 2.5 + k), "lr": ch(k, "lr", [0.1]),
                       "scaler_scale": ch(k, "scale", 65536.0)}
            w.end_step(scalars, batch_ids=ids.tolist())
    return path


def _at(step: int, **values):
    """A change: at ``step``, the given sentinels take these values (``param='fc.bias'`` shifts that param)."""

    def change(k, what, v):
        if k != step:
            return v
        if what.startswith("param:") and values.get("param") == what[6:]:
            return v + np.float32(1.0)
        return values.get(what, v)

    return change


@pytest.mark.parametrize("planted, sentinel, name", [
    (dict(ids=[0, 99], loss=3.0, grad_norm=9.0, lr=[0.2], scale=2.0, param="fc.bias"), "batch ids", "<batch_ids>"),
    (dict(loss=3.0, grad_norm=9.0, lr=[0.2], scale=2.0, param="fc.bias"), "loss", "loss"),
    (dict(grad_norm=9.0, lr=[0.2], scale=2.0, param="fc.bias"), "grad norm", "grad_norm"),
    (dict(lr=[0.2], scale=2.0, param="fc.weight"), "lr", "lr"),
    (dict(scale=2.0, param="fc.weight"), "scaler scale", "scaler_scale"),
    (dict(param="fc.bias"), "param", "fc.bias"),
])
def test_first_sentinel_to_differ_in_a_step_is_named(tmp_path, planted, sentinel, name):
    a = _sentinel_trace(tmp_path / "a")
    b = _sentinel_trace(tmp_path / "b", change=_at(4, **planted))
    c = compare_traces(read_trace(a), read_trace(b))
    assert not c and c.sentinel
    assert (c.first.step, c.first.sentinel, c.first.name) == (4, sentinel, name)
    text = str(c)
    assert f"first divergence at step 4: sentinel {sentinel}" in text
    assert "(full detail: replay from the state after step" not in text  # synthetic: no state files
    first = c.to_json()["first"]
    assert first["sentinel"] == sentinel and first["step"] == 4
    assert c.to_json()["detail"] == {"a": "sentinel", "b": "sentinel"}


def test_param_sentinel_is_said_after_the_step(tmp_path):
    a = _sentinel_trace(tmp_path / "a")
    b = _sentinel_trace(tmp_path / "b", change=_at(5, param="fc.weight"))
    text = str(compare_traces(read_trace(a), read_trace(b)))
    assert "first divergence at step 5: sentinel param 'fc.weight' (after the step)" in text
    assert "verdict: DIVERGED at step 5 (sentinel param 'fc.weight' (after the step))" in text


def test_lr_of_a_second_group_is_named(tmp_path):
    a = _sentinel_trace(tmp_path / "a", change=lambda k, what, v: [0.1, 0.01] if what == "lr" else v)
    b = _sentinel_trace(tmp_path / "b", change=lambda k, what, v: ([0.1, 0.02] if k >= 3 else [0.1, 0.01]) if what == "lr" else v)
    c = compare_traces(read_trace(a), read_trace(b))
    assert (c.first.step, c.first.kind, c.first.name) == (3, "scalar", "lr[1]")
    assert "sentinel lr (group 1)" in str(c)


def test_scalar_tolerance_and_overrides(tmp_path):
    a = _sentinel_trace(tmp_path / "a")
    b = _sentinel_trace(tmp_path / "b", change=lambda k, what, v: v * (1 + 1e-7) if what == "grad_norm" and k == 2 else v)
    from reprobisect.core.compare import Tolerance

    assert compare_traces(read_trace(a), read_trace(b)).first.name == "grad_norm"  # bitwise: any bit
    assert compare_traces(read_trace(a), read_trace(b), Tolerance(mode="default"))  # within float32's figures
    strict = Tolerance(mode="default", overrides={"scalar/grad_norm": "bitwise"})
    assert not compare_traces(read_trace(a), read_trace(b), strict)


def test_identical_sentinel_traces_agree(tmp_path):
    a = _sentinel_trace(tmp_path / "a")
    b = _sentinel_trace(tmp_path / "b")
    c = compare_traces(read_trace(a), read_trace(b))
    assert c and "detail: sentinel" in str(c) and "verdict: AGREE" in str(c)
    # 2 init + per step: batch ids pseudo-record, ids, data, loss, 2 params, grad_norm, lr, scale
    assert c.records_compared == 2 + 6 * 8


def test_sentinel_against_full_compares_what_both_hold(tmp_path):
    s = _sentinel_trace(tmp_path / "s")
    f = _sentinel_trace(tmp_path / "f", full=True, policy={"detail": "full"},
                        change=lambda k, what, v: v * 2 if what == "grad_norm" else v)  # computed another way
    c = compare_traces(read_trace(s), read_trace(f))
    assert c, str(c)
    assert "trace A is sentinel, trace B full: compared what both hold" in c.note
    assert "gradient norm" in c.note and "were not compared" in c.note
    assert "detail: A sentinel, B full" in str(c)
    # a late change in what both hold is still found, and named as a sentinel
    f2 = _sentinel_trace(tmp_path / "f2", full=True, policy={}, change=_at(4, lr=[0.3]))
    c = compare_traces(read_trace(f2), read_trace(s))
    assert (c.first.step, c.first.sentinel) == (4, "lr")
    assert c.detail_a == "full" and c.detail_b == "sentinel"


def test_full_traces_compare_as_before(tmp_path):
    """Two full traces: no scalar is compared, no sentinel named (today's behaviour)."""
    a = _sentinel_trace(tmp_path / "a", full=True, policy={})
    b = _sentinel_trace(tmp_path / "b", full=True, policy={}, change=_at(3, lr=[0.5], param="fc.bias"))
    c = compare_traces(read_trace(a), read_trace(b))
    assert (c.first.kind, c.first.name, c.first.sentinel) == ("param", "fc.bias", None)
    assert "sentinel" not in str(c) and "sentinel" not in json.dumps(c.to_json()["first"])


def test_older_traces_without_the_field_read_as_full(tmp_path):
    t = _sentinel_trace(tmp_path / "old", policy={"steps": 6})
    m = json.loads((t / "manifest.json").read_text())
    assert "detail" not in m["policy"]
    tr = read_trace(t)
    assert tr.detail == "full" and tr.manifest.detail == "full" and tr.manifest.state_every is None


@pytest.mark.parametrize("policy, said", [({"detail": "everything"}, "unknown detail level 'everything'"),
                                          ({"detail": "sentinel", "state_every": 0}, "not a positive integer")])
def test_an_unknown_detail_level_is_refused(tmp_path, policy, said):
    t = _sentinel_trace(tmp_path / "t", policy=policy, steps=1)
    with pytest.raises(TraceError, match=said):
        read_trace(t)


# -- real recordings through the launcher -----------------------------------------------

SCRIPT = """
import argparse, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--lr-at", type=int, default=-1)
p.add_argument("--swap-at", type=int, default=-1)
p.add_argument("--halve-at", type=int, default=-1)
a = p.parse_args()
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
batches = [list(range(i, i + 8)) for i in range(0, 96, 8)]
if a.swap_at >= 0:
    batches[a.swap_at][0], batches[a.swap_at + 1][0] = batches[a.swap_at + 1][0], batches[a.swap_at][0]
loader = DataLoader(data, batch_sampler=batches)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step, (x, y) in enumerate(loader):
    if step == a.lr_at:
        for group in opt.param_groups:
            group["lr"] = 0.05
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    if step == a.halve_at:
        model[2].bias.grad.mul_(0.5)
    opt.step()
"""


def _launch(script: Path, trace: Path, *opts: str, steps: int = 8, args: tuple[str, ...] = ()) -> Path:
    cmd = [PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps), *opts, "--",
           str(script), *args]
    r = subprocess.run(cmd, cwd=trace.parent, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return trace


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Real traces of the script: sentinel (K=3) and full of the same run, and sentinel runs with planted changes."""
    tmp = tmp_path_factory.mktemp("sentinel")
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    sent = ("--detail", "sentinel", "--state-every", "3")
    return {
        "script": script,
        "sentinel": _launch(script, tmp / "sentinel", *sent),
        "full": _launch(script, tmp / "full"),
        "lr": _launch(script, tmp / "lr", *sent, args=("--lr-at", "5")),
        "order": _launch(script, tmp / "order", *sent, args=("--swap-at", "6")),
        "halve": _launch(script, tmp / "halve", *sent, args=("--halve-at", "4")),
    }


def test_sentinel_trace_holds_the_sentinels_only(recorded):
    t = read_trace(recorded["sentinel"])
    assert t.detail == "sentinel" and t.manifest.state_every == 3
    assert t.manifest.policy["detail"] == "sentinel" and t.manifest.policy["state_every"] == 3
    assert len(t.steps) == 8
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    for s in t.steps:
        kinds = {r.kind for r in s.records}
        assert kinds <= set(SENTINEL_KINDS), kinds
        assert not kinds & {"input", "activation", "output", "grad", "optim_state"}
        assert [r.name for r in s.records if r.kind == "param"] == names  # one fingerprint per parameter
        assert [r.name for r in s.records if r.kind == "loss"] == ["loss"]
        assert {r.name for r in s.records if r.kind == "batch"} == {"ids", "data[0]", "data[1]"}
        assert s.batch_ids == list(range(8 * s.step, 8 * s.step + 8))
        assert s.scalars["lr"] == [0.1] and s.scalars["grad_norm"] > 0
        assert "grad_norm_at_step" not in s.scalars  # no per-tensor gradients to sum
    assert [r.name for r in t.steps[0].records if r.kind == "init"] == names
    assert not any(r.kind == "init" for s in t.steps[1:] for r in s.records)
    # complete state after every 3rd step: after steps 2 and 5 (a replay of step 3 / 6 starts there)
    assert t.state_steps == [2, 5]
    assert any(rel.startswith("state/step-2/") for rel in t.manifest.files)


def test_sentinel_and_full_record_the_same_values(recorded):
    s, f = read_trace(recorded["sentinel"]), read_trace(recorded["full"])
    assert f.detail == "full" and f.manifest.policy["detail"] == "full" and f.state_steps == []
    assert any(r.kind == "optim_state" for r in f.steps[1].records)
    for ss, fs in zip(s.steps, f.steps):
        held = {r.key: r.fingerprint for r in fs.records if r.kind in SENTINEL_KINDS}
        assert {r.key: r.fingerprint for r in ss.records} == held  # observers observe, at either level
        assert ss.scalars["lr"] == fs.scalars["lr"]
        # the norm before clipping (clip at 0.5): the same bits at both levels where the
        # native kernel took them (its sum of squares is the statistics' own), else close
        if native.kernel() is not None:
            assert ss.scalars["grad_norm"] == fs.scalars["grad_norm"], ss.step
        else:
            assert ss.scalars["grad_norm"] == pytest.approx(fs.scalars["grad_norm"], rel=1e-5)
    c = compare_traces(s, f)
    assert c and "compared what both hold" in c.note


@pytest.mark.parametrize("which, step, sentinel, name", [
    ("lr", 5, "lr", "lr"),
    ("order", 6, "batch ids", "<batch_ids>"),
    ("halve", 4, "param", "2.bias"),
])
def test_a_late_change_is_named_by_its_sentinel(recorded, which, step, sentinel, name):
    c = compare_traces(read_trace(recorded["sentinel"]), read_trace(recorded[which]))
    assert not c
    assert (c.first.step, c.first.sentinel, c.first.name) == (step, sentinel, name)
    assert c.replay_from == max(s for s in (2, 5) if s < step)
    text = str(c)
    assert f"first divergence at step {step}: sentinel {sentinel}" in text
    assert f"replay from the state after step {c.replay_from}" in text
    data = c.to_json()
    assert data["first"]["sentinel"] == sentinel and data["replay_from"] == c.replay_from
    assert data["state_steps"] == [2, 5]


def test_the_launcher_refuses_a_bad_detail(tmp_path):
    script = tmp_path / "x.py"
    script.write_text("print('never runs')\n")
    for opts, said in ((["--detail", "foo"], "--detail takes full or sentinel (got 'foo')"),
                       (["--detail", "sentinel", "--state-every", "0"], "--state-every takes a whole number")):
        r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(tmp_path / "t"), *opts, "--",
                            str(script)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr and "never runs" not in r.stdout


# -- the CLI ----------------------------------------------------------------------------


def test_capture_with_detail_sentinel(recorded, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["capture", "-q", "-o", str(tmp_path / "cap"), "--steps", "4", "--detail", "sentinel",
                 "--state-every", "2", "--", PY, str(recorded["script"])])
    assert code == 0, capsys.readouterr()
    t = read_trace(tmp_path / "cap")
    assert t.detail == "sentinel" and t.manifest.state_every == 2 and t.state_steps == [1, 3]
    assert not any(r.kind == "grad" for s in t.steps for r in s.records)


def test_repro_with_sentinel_from_a_config_file_agrees(recorded, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "probe.yaml"
    cfg.write_text("detail: sentinel\nstate-every: 2\nsteps: 3\n")
    code = main(["repro", "--runs", "2", "--config", str(cfg), "-q", "-o", str(tmp_path / "out"), "--",
                 PY, str(recorded["script"])])
    out = capsys.readouterr().out
    assert code == 0, out
    traces = [read_trace(p.parent) for p in (tmp_path / "out").rglob("manifest.json")]
    assert len(traces) == 2 and all(t.detail == "sentinel" and t.state_steps == [1] for t in traces)


@pytest.mark.parametrize("command", ["capture", "repro"])
@pytest.mark.parametrize("flags, said", [(["--detail", "foo"], "--detail takes full or sentinel (got 'foo')"),
                                         (["--state-every", "0"], "--state-every must be at least 1 (got 0)"),
                                         (["--state-every", "x"], "'state-every' has a bad value 'x'")])
def test_a_bad_detail_value_is_one_usage_line(tmp_path, capsys, command, flags, said):
    extra = ["-o", str(tmp_path / "t")] if command == "capture" else []
    code = main([command, *extra, *flags, "--", PY, str(tmp_path / "never.py")])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and said in err, err


@pytest.mark.parametrize("command", ["capture", "runs", "probe", "repro", "seeds", "envs"])
def test_every_probing_command_takes_the_flags(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--detail" in out and "--state-every" in out


def test_the_flags_reach_the_launcher():
    from reprobisect.core.options import ProbeOptions
    from reprobisect.executors.process import launch_argv
    from reprobisect.workflows.repro import spec_for

    spec = spec_for([PY, "train.py"], ProbeOptions(detail="sentinel", state_every=7), key="k", workdir="/tmp")
    argv = launch_argv(spec, Path("/tmp/t"))
    assert argv[argv.index("--detail") + 1] == "sentinel" and argv[argv.index("--state-every") + 1] == "7"
    plain = launch_argv(spec_for([PY, "train.py"], ProbeOptions(), key="k", workdir="/tmp"), Path("/tmp/t"))
    assert "--detail" not in plain and "--state-every" not in plain  # the default: the launcher command as before


@pytest.mark.slow
def test_runs_with_sentinel_names_the_culprit_and_its_sentinel(tmp_path):
    from reprobisect.core.options import ProbeOptions
    from reprobisect.workflows.demo import build_demo_repo
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    repo = build_demo_repo(tmp_path / "repo", n_commits=3, culprit_at=2, broken_at=None)
    opts = ProbeOptions(jobs=2, quiet=True, detail="sentinel", state_every=2, keep=True, out=tmp_path / "out")
    r = find_first_bad(RunsConfig(repo=None, cwd=str(repo.path), good=repo.good, bad=repo.bad,
                                  command=("python", "train.py", "--steps", "20", "--seed", "0"), options=opts))
    assert r and r.first_bad.hash == repo.culprit
    first = r.divergence["first"]
    assert first["sentinel"] == "loss" and first["step"] == 0  # the model changed: step 0's loss is the first sentinel
    assert "sentinel loss" in str(r)
    kept = [read_trace(p.parent) for p in (tmp_path / "out").rglob("manifest.json")]
    probes = [t for t in kept if "-full" not in t.path.name]
    assert probes and all(t.detail == "sentinel" for t in probes)
    # the escalation re-ran both sides' step 0 with full detail (no state before it) and kept them
    replays = [t for t in kept if "-full0-" in t.path.name]
    assert len(replays) == 2 and all(t.detail == "full" for t in replays)
    esc = r.divergence["escalation"]
    assert esc["conclusive"] and esc["step"] == 0 and esc["from_step"] == 0, esc


# -- the step end's cost: what a sentinel step must not do ----------------------------------


def _record_in_process(tmp_path: Path, **policy) -> tuple[Path, int]:
    """Four steps of a tiny model recorded in this process; (trace, times the whole trace
    folder was walked for its size)."""
    import torch

    from reprobisect.runners.torch import RecordPolicy, TorchRecorder

    walks = [0]

    class Counting(TorchRecorder):
        def _trace_bytes(self) -> int:
            walks[0] += 1
            return super()._trace_bytes()

    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    writer = TraceWriter(tmp_path / "t", command=["t"], policy={})
    rec = Counting(writer, RecordPolicy(steps=10**9, detail="sentinel", state_every=2, **policy)).install()
    try:
        for _ in range(4):
            opt.zero_grad()
            net(torch.ones(2, 3)).sum().backward()
            opt.step()
        net(torch.ones(2, 3))  # the boundary after the last step (its state is captured here)
    finally:
        rec.remove()
        writer.close()
    return tmp_path / "t", walks[0]


def test_a_step_walks_the_trace_for_its_size_only_under_a_disk_budget(tmp_path):
    """The size of the trace folder (a walk of every file, more with every captured state)
    matters only to --max-disk: without one a step never walks it."""
    trace, walks = _record_in_process(tmp_path / "free")
    assert walks == 0 and len(read_trace(trace).steps) == 4
    _, walks = _record_in_process(tmp_path / "budget", max_disk=10**9)
    assert walks >= 4


def test_captured_state_json_is_one_compact_line_that_reads_back(tmp_path):
    """State JSON (the RNG lists run to thousands of numbers) goes through the C encoder:
    one line, no indentation; the trace verifies and its state reads back."""
    from reprobisect.trace.writer import write_json_atomic

    trace, _ = _record_in_process(tmp_path)
    rng = trace / "state" / "step-1" / "rng.json"
    text = rng.read_text()
    assert text.count("\n") == 1 and ": " not in text, text[:200]
    assert json.loads(text)["state"]
    read_trace(trace, verify=True)
    # not strict JSON as it is (a NaN, a NumPy number): the json_safe walk, still one line
    write_json_atomic(tmp_path / "x.json", {"a": float("nan"), "b": np.float32(1.5)}, compact=True)
    assert (tmp_path / "x.json").read_text() == '{"a":"nan","b":1.5}\n'
