"""Escalation of --detail sentinel: the full chain at the step two sentinel traces first differ."""

from __future__ import annotations

import textwrap

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.core.outcome import Outcome
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.workflows.escalate import replay_spec

# a data-dependent branch: the batch holding sample 22 (step 5 of 8) gets unseeded noise
LATE_NOISE = textwrap.dedent(
    """
    import os
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    xs = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(torch.arange(64), xs), batch_size=4, shuffle=False)


    class Noisy(torch.nn.Module):
        flag = False

        def forward(self, h):
            if not self.flag:
                return h
            g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
            return h + torch.rand(h.shape, generator=g) * 1e-3


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(8, 16)
            self.noisy = Noisy()
            self.fc2 = torch.nn.Linear(16, 1)

        def forward(self, x):
            return self.fc2(self.noisy(torch.tanh(self.fc1(x))))


    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for ids, x in loader:
        model.noisy.flag = bool((ids == 22).any())
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    """
)


def test_a_replay_spec_records_from_the_state_after_k_through_the_divergence():
    side = ProbeResult(spec=ProbeSpec(key="run1", argv=("python", "t.py"), steps=8, detail="sentinel", state_every=2,
                                      extra_launch_args=("--max-disk", "9")),
                       outcome=Outcome("ok"), trace_dir="/traces/run1")
    spec = replay_spec(side, 5, 3)
    assert (spec.steps, spec.detail, spec.state_every, spec.state_steps) == (2, "full", None, ())
    assert spec.extra_launch_args == ("--max-disk", "9", "--replay-from", "/traces/run1", "--replay-step", "4")
    assert spec.key != side.spec.key and spec.argv == side.spec.argv
    # no state before the divergence: the whole prefix again, from the start, in full detail
    again = replay_spec(side, 5, None)
    assert (again.steps, again.extra_launch_args) == (6, ("--max-disk", "9"))


@pytest.mark.slow
def test_sentinel_repro_names_the_same_tensor_as_a_full_recording(tmp_path):
    """The escalated answer (replays from the state after step 3) equals what a full-detail
    recording of the whole run names: step 5, the noisy module's output."""
    from reprobisect.workflows.repro import run_repro

    (tmp_path / "train.py").write_text(LATE_NOISE)
    argv = ["python", "train.py"]
    sentinel = run_repro(argv, ProbeOptions(steps=8, detail="sentinel", state_every=2, quiet=True), runs=2, cwd=tmp_path)
    assert not sentinel
    first = sentinel.first_difference[1].first
    assert first.step == 5 and first.sentinel, first
    esc = sentinel.escalation
    assert esc and esc.step == 5 and esc.from_step == 4, esc.reason
    full = run_repro(argv, ProbeOptions(steps=8, quiet=True), runs=2, cwd=tmp_path)
    want = full.first_difference[1].first
    got = esc.comparison.first
    assert (got.step, got.kind, got.name) == (want.step, want.kind, want.name), (got, want)
    assert "noisy" in f"{got.name} {got.module}"
    from reprobisect.render import render_repro

    text = render_repro(sentinel)
    assert "full detail: replayed steps 4..5 from the state after step 3" in text


# the culprit scales one module's output, but only for the batch holding sample 22 (step 5 of 8)
_NOISE = """        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        return h + torch.rand(h.shape, generator=g) * 1e-3
"""
assert _NOISE in LATE_NOISE
LATE_CHANGE = LATE_NOISE.replace(_NOISE, "        return h * SCALE\n").replace(
    "torch.manual_seed(0)\n", "torch.manual_seed(0)\nSCALE = {scale}\n", 1)


@pytest.mark.slow
def test_sentinel_runs_names_the_culprit_and_the_tensor_a_full_search_names(tmp_path):
    import subprocess

    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    commits = []
    for i, scale in enumerate(["1.0", "1.0", "1.001", "1.001"]):
        (repo / "train.py").write_text(LATE_CHANGE.replace("{scale}", scale))
        (repo / "notes.txt").write_text(f"{i}\n")
        git("add", "-A")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", f"c{i}")
        commits.append(git("rev-parse", "HEAD").stdout.strip())

    def search(**opts):
        cfg = RunsConfig(cwd=str(repo), good=commits[0], bad=commits[-1], command=("python", "train.py"),
                         cache_dir=str(tmp_path / f"cache-{opts.get('detail', 'full')}"),
                         options=ProbeOptions(steps=8, jobs=2, quiet=True, **opts))
        return find_first_bad(cfg)

    sentinel = search(detail="sentinel", state_every=2)
    assert sentinel.first_bad.hash == commits[2], (str(sentinel), commits)
    esc = sentinel.divergence["escalation"]
    assert esc["conclusive"] and esc["step"] == 5 and esc["from_step"] == 4, esc
    assert "full detail: replayed steps 4..5 from the state after step 3" in sentinel.divergence_text
    full = search()
    assert full.first_bad.hash == commits[2]
    want, got = full.divergence["first"], esc["comparison"]["first"]
    assert (got["step"], got["kind"], got["name"]) == (want["step"], want["kind"], want["name"]), (got, want)


@pytest.mark.slow
def test_a_difference_keyed_to_the_loops_own_counter_is_never_pinned_on_a_tensor(tmp_path):
    """The noise comes at the loop's 6th iteration: a replay from a state cannot know the
    loop's counter, so the escalation must not name a tensor: it says the replays agree (the
    difference did not reproduce) or that it is inconclusive."""
    from reprobisect.render import render_repro
    from reprobisect.workflows.repro import run_repro

    script = LATE_NOISE.replace("for ids, x in loader:\n    model.noisy.flag = bool((ids == 22).any())",
                                "for i, (ids, x) in enumerate(loader):\n    model.noisy.flag = i == 5")
    assert script != LATE_NOISE
    (tmp_path / "train.py").write_text(script)
    r = run_repro(["python", "train.py"], ProbeOptions(steps=8, detail="sentinel", state_every=2, quiet=True),
                  runs=2, cwd=tmp_path)
    assert not r and r.first_difference[1].first.step == 5
    esc = r.escalation
    assert esc is not None and (esc.comparison is None or bool(esc.comparison)), esc
    assert "did not reproduce" in render_repro(r) or "inconclusive" in render_repro(r)


# --------------------------------------------------------------------------- seeds, envs, probe

# the seed is drawn from only for the batch holding sample 22 (step 5 of 8): init, data order
# and every earlier step are the same under every seed
LATE_SEED = LATE_NOISE.replace(_NOISE, """        g = torch.Generator().manual_seed(int(sys.argv[1]))
        return h + torch.rand(h.shape, generator=g) * 1e-3
""").replace("import os\n", "import os\nimport sys\n", 1)
# an environment variable read only for the batch holding sample 22 (step 5 of 8)
LATE_ENV = LATE_NOISE.replace(_NOISE, '        return h * float(os.environ.get("LATE_SCALE", "1"))\n')
assert LATE_SEED != LATE_NOISE and LATE_ENV != LATE_NOISE


def _same_place(got, want):
    assert (got.step, got.kind, got.name) == (want.step, want.kind, want.name), (got, want)
    assert "noisy" in f"{got.name} {got.module}"


@pytest.mark.slow
def test_sentinel_seeds_names_the_same_tensor_as_a_full_recording(tmp_path):
    from reprobisect.render import render_seed_map, seed_map_json
    from reprobisect.workflows.seeds import run_seeds

    (tmp_path / "train.py").write_text(LATE_SEED)
    argv = ["python", "train.py", "{seed}"]
    sentinel = run_seeds(argv, ProbeOptions(steps=8, detail="sentinel", state_every=2, quiet=True), seeds="0,1",
                         cwd=tmp_path)
    first = sentinel.first_divergence.first
    assert first.step == 5 and first.sentinel, first
    esc = sentinel.escalation
    assert esc and esc.step == 5 and esc.from_step == 4, esc.reason
    full = run_seeds(argv, ProbeOptions(steps=8, quiet=True), seeds="0,1", cwd=tmp_path)
    assert full.escalation is None
    _same_place(esc.comparison.first, full.first_divergence.first)
    text = render_seed_map(sentinel)
    assert "full detail: replayed steps 4..5 from the state after step 3" in text, text
    assert seed_map_json(sentinel)["escalation"]["comparison"]["first"]["step"] == 5
    assert "escalation" not in seed_map_json(full)


@pytest.mark.slow
def test_sentinel_envs_names_the_same_tensor_as_a_full_recording(tmp_path):
    from reprobisect.render import envs_json, render_envs
    from reprobisect.workflows.envs import run_envs

    (tmp_path / "train.py").write_text(LATE_ENV)
    argv = ["python", "train.py"]
    sides = {"a": "env.LATE_SCALE=1", "b": "env.LATE_SCALE=1.001"}
    sentinel = run_envs(argv, ProbeOptions(steps=8, detail="sentinel", state_every=2, quiet=True), cwd=tmp_path, **sides)
    assert not sentinel and sentinel.comparison.first.step == 5 and sentinel.comparison.first.sentinel
    esc = sentinel.escalation
    assert esc and esc.step == 5 and esc.from_step == 4, esc.reason
    full = run_envs(argv, ProbeOptions(steps=8, quiet=True), cwd=tmp_path, **sides)
    assert full.escalation is None
    _same_place(esc.comparison.first, full.comparison.first)
    text = render_envs(sentinel)
    assert "full detail: replayed steps 4..5 from the state after step 3" in text, text
    assert envs_json(sentinel)["escalation"]["conclusive"] is True


@pytest.mark.slow
def test_sentinel_probe_repro_names_the_same_tensor_as_a_full_recording(tmp_path):
    from reprobisect.render import probe_report_json, render_probe_report
    from reprobisect.workflows.repro import probe_checkout

    (tmp_path / "train.py").write_text(LATE_NOISE)
    argv = ["python", "train.py"]
    sentinel = probe_checkout(argv, ProbeOptions(steps=8, detail="sentinel", state_every=2, quiet=True,
                                                 out=tmp_path / "kept"), check="repro", cwd=tmp_path)
    assert sentinel.verdict.verdict == "bad" and sentinel.verdict.comparison.first.step == 5
    esc = sentinel.escalation
    assert esc and esc.step == 5 and esc.from_step == 4, esc.reason
    full = probe_checkout(argv, ProbeOptions(steps=8, quiet=True), check="repro", cwd=tmp_path)
    assert full.verdict.verdict == "bad" and full.escalation is None
    _same_place(esc.comparison.first, full.verdict.comparison.first)
    assert "full detail: replayed steps 4..5 from the state after step 3" in render_probe_report(sentinel)
    assert probe_report_json(sentinel)["escalation"]["from_step"] == 4
    # against a reference trace (another run, maybe of another commit): nothing to replay it
    # from here, so the answer says so instead of naming a tensor
    ref = probe_checkout(argv, ProbeOptions(steps=8, detail="sentinel", state_every=2, quiet=True),
                         reference=sentinel.result.trace_dir, cwd=tmp_path)
    assert ref.verdict.verdict == "bad" and ref.escalation is not None and ref.escalation.comparison is None
    text = render_probe_report(ref)
    assert "full detail at step 5 is inconclusive" in text and "cannot be replayed" in text, text


# --------------------------------------------------------------------------- planted late divergence


def _late_divergence():
    """scripts/bench/late_divergence.py as a module (its planted cases and history builder)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "late_divergence.py"
    spec = importlib.util.spec_from_file_location("late_divergence", path)
    mod = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_sentinel_runs_over_200_steps_names_a_late_lr_milestone_as_full_detail_does(tmp_path):
    """An LR milestone moved to step 150 of 200: ``bisect runs --detail sentinel`` finds the
    culprit and its escalation (replays of steps 100..150 from the state after step 99) names
    the same step · kind · tensor as two full-detail recordings of the whole run."""
    ld = _late_divergence()
    r = ld.run_case("lr_milestone", tmp_path, steps=200, full="pair")
    assert r.culprit_found, r
    assert r.escalated is not None and r.escalated[0] == 150, r
    assert r.escalated == r.full, r
    assert r.reason == "full detail: replayed steps 100..150 from the state after step 99 with full detail on both sides"
