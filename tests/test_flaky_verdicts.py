"""Verdicts that rest on nondeterminism are said to, not trusted: ``runs`` answers
"inconclusive" when the first divergence moves between runs of the culprit, ``repro``
compares 3 runs by default and says when the place of the difference moves.

The scripts are nondeterministic on purpose but reproducibly so: a counter file (kept
per commit) decides at which step a run perturbs its input, so "where it diverges"
changes from one run of a commit to the next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reprobisect.errors import ProbeError, UsageError
from reprobisect.core.options import ProbeOptions
from reprobisect.workflows.runs import RunsConfig, find_first_bad

ROOT = Path(__file__).resolve().parents[1]

MOVING = """import hashlib, os
import torch

NONDET = {nondet}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
at = -1
if NONDET:  # run n of this commit perturbs its input at step n % 2: the divergence moves
    key = hashlib.sha256(open("notes.txt").read().encode()).hexdigest()[:8]
    path = os.environ["FLAKY_COUNTER"] + "-" + key
    n = int(open(path).read()) if os.path.exists(path) else 0
    open(path, "w").write(str(n + 1))
    at = n % 2
for step in range(4):
    opt.zero_grad()
    inp = x * 1.5 if step == at else x
    model(inp).pow(2).mean().backward()
    opt.step()
"""


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def _repo(root: Path, nondet: list[bool]) -> list[str]:
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    commits = []
    for i, nd in enumerate(nondet):
        (root / "train.py").write_text(MOVING.format(nondet=nd))
        (root / "notes.txt").write_text(f"{i}\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"commit {i}" + (" (nondeterministic)" if nd else ""))
        commits.append(_git(root, "rev-parse", "HEAD").strip())
    return commits


@pytest.mark.slow
@pytest.mark.torch
def test_runs_is_inconclusive_when_the_divergence_moves_between_runs(tmp_path):
    root = tmp_path / "repo"
    commits = _repo(root, [False, False, True, True])
    cfg = RunsConfig(cwd=str(root), good=commits[0], bad="HEAD", command=("python", "train.py"),
                     env={"FLAKY_COUNTER": str(tmp_path / "counter")}, options=ProbeOptions(jobs=2, quiet=True))
    r = find_first_bad(cfg)
    text = str(r)
    assert not r, text  # no culprit is claimed
    assert r.recheck.startswith("disagreed") and "moves between runs" in r.recheck, r.recheck
    assert "--repeat 3" in r.recheck
    assert text.startswith("inconclusive:") and "re-check agreed" not in text, text
    assert "step 0" in r.recheck and "step 1" in r.recheck
    data = json.loads(json.dumps(r.to_json()))
    assert data["found"] is False and "moves between runs" in data["inconclusive"]
    # the revision the user typed is shown, with its hash beside it
    assert f"--bad HEAD ({commits[-1][:10]})" in text, text


@pytest.mark.slow
@pytest.mark.torch
def test_repeat_skips_a_commit_whose_runs_all_differ_in_different_places(tmp_path):
    from reprobisect.workflows.runs import Prober  # the judgement itself, on one commit
    from reprobisect.core.session import ResultCache
    from reprobisect.executors.local import LocalExecutor

    root = tmp_path / "repo"
    commits = _repo(root, [False, True])
    cfg = RunsConfig(cwd=str(root), good=commits[0], bad=commits[1], command=("python", "train.py"), repeat=2,
                     env={"FLAKY_COUNTER": str(tmp_path / "counter")}, options=ProbeOptions(jobs=2, quiet=True))
    with LocalExecutor(jobs=2) as ex:
        pr = Prober(cfg, root, ".", ex, ResultCache(tmp_path / "cache"), "bitwise")
        ref = pr.judge(commits[0])
        pr.reference, pr.reference_commit = ref.trace, commits[0]
        j = pr.judge(commits[1])
    assert j.verdict == "skip" and "first divergence moves" in j.reason, j.reason


REPRO = """import os
import torch

path = os.environ["FLAKY_COUNTER"]
n = int(open(path).read()) if os.path.exists(path) else 0
open(path, "w").write(str(n + 1))
at = [-1, 1, 0][n % 3]  # run 0 clean, run 1 perturbed at step 1, run 2 at step 0
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
for step in range(3):
    opt.zero_grad()
    model(x * 1.5 if step == at else x).pow(2).mean().backward()
    opt.step()
"""


@pytest.mark.slow
@pytest.mark.torch
def test_repro_compares_three_runs_by_default_and_says_the_place_moves(tmp_path):
    (tmp_path / "train.py").write_text(REPRO)
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLAKY_COUNTER=str(tmp_path / "counter"), PYTHONHASHSEED="0")
    p = subprocess.run([sys.executable, "-m", "reprobisect", "repro", "--json", "--", "python", "train.py"],
                       cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    assert len(data["runs"]) == 3  # the default: two runs would have compared run 0 with run 1 only
    assert data["places"][0].startswith("step 1") and data["places"][1].startswith("step 0"), data["places"]
    assert "moves between runs" in data["flakiness"]


# --------------------------------------------------------------------------- messages (no torch)


@pytest.fixture
def tiny(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    commits = []
    for i in range(3):
        (root / "fast.py").write_text(f"print('commit {i}')\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"c{i}")
        commits.append(_git(root, "rev-parse", "HEAD").strip())
    return root, commits


def test_lock_refusal_names_the_real_option_and_the_option_waits(tiny):
    from reprobisect.vcs.git import session_lock

    root, commits = tiny
    cfg = RunsConfig(cwd=str(root), good="HEAD~2", bad="HEAD", command=("python", "fast.py"), options=ProbeOptions(quiet=True))
    with session_lock(root):
        with pytest.raises(UsageError, match=r"longer lock timeout than 0 s with --lock-timeout SECONDS"):
            find_first_bad(cfg)
    held = threading.Event()

    def hold() -> None:
        with session_lock(root):
            held.set()
            time.sleep(1.0)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    t0 = time.monotonic()
    # waits for the holder, then runs (and stops at --good: fast.py records no step)
    with pytest.raises(ProbeError, match="--good HEAD~2 does not probe good"):
        find_first_bad(RunsConfig(**{**cfg.__dict__, "lock_timeout": 30.0}))
    assert time.monotonic() - t0 >= 0.5
    t.join()
    r = subprocess.run([sys.executable, "-m", "reprobisect", "runs", "--help"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert "--lock-timeout" in r.stdout


def test_messages_name_the_revisions_as_typed(tiny):
    root, commits = tiny
    base = dict(cwd=str(root), command=("python", "fast.py"), options=ProbeOptions(quiet=True))
    with pytest.raises(UsageError, match=rf"--good HEAD and --bad HEAD are the same commit {commits[-1][:12]}"):
        find_first_bad(RunsConfig(good="HEAD", bad="HEAD", **base))
    with pytest.raises(UsageError, match=r"--good HEAD~1 is not an ancestor of --bad HEAD~2: HEAD~2 is older"):
        find_first_bad(RunsConfig(good="HEAD~1", bad="HEAD~2", **base))
