"""One probe: command rewriting, outcome classification, verdicts, and ``bisect probe``.

Real launcher, real subprocesses, real torch on CPU; ``git bisect run bisect probe`` on a
generated repository.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from reprobisect.errors import UsageError
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.executors.local import LocalExecutor
from reprobisect.core.outcome import Outcome
from reprobisect.core.verdict import Verdict, classify
from reprobisect.executors.process import TAIL_BYTES, launch_argv, run_in_dir

PY = sys.executable

TRAIN = """
import argparse, torch
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--nan", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
X = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
if a.nan:
    X[3, 2] = float("nan")
y = X.sum(1, keepdim=True)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=8, shuffle=True,
                                 generator=torch.Generator().manual_seed(2))
m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=a.lr)
for epoch in range(5):
    for xb, yb in dl:
        opt.zero_grad(); torch.nn.functional.mse_loss(m(xb), yb).backward(); opt.step()
"""


def _spec(tmp: Path, *argv: str, **kw) -> ProbeSpec:
    return ProbeSpec(key=kw.pop("key", "p"), argv=tuple(argv), workdir=str(tmp), **kw)


def _bisect(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "reprobisect", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- launch_argv


@pytest.mark.parametrize(
    "argv, expect_prog, expect_opts",
    [
        (("python", "train.py", "--lr", "1"), ["train.py", "--lr", "1"], []),
        (("python3", "-u", "-m", "pkg.train", "-x"), ["-m", "pkg.train", "-x"], ["-u"]),
        ((f"python{sys.version_info.major}.{sys.version_info.minor}", "-X", "dev", "t.py"), ["t.py"], ["-X", "dev"]),
    ],
)
def test_launch_argv_rewrites_python_commands(tmp_path, argv, expect_prog, expect_opts):
    cmd = launch_argv(ProbeSpec(key="k", argv=argv, steps=5, full_steps=(0, 1)), tmp_path / "T", tmp_path)
    assert cmd[0] == PY  # a bare python resolves to the interpreter running reprobisect
    i = cmd.index("-m")
    assert cmd[1:i] == expect_opts
    assert cmd[i : i + 2] == ["-m", "reprobisect.runners.launch"]
    assert cmd[cmd.index("--trace") + 1] == str(tmp_path / "T")
    assert cmd[cmd.index("--steps") + 1] == "5"
    assert cmd[cmd.index("--full-steps") + 1] == "0,1"
    assert cmd[cmd.index("--") + 1 :] == expect_prog


def test_launch_argv_interpreter_paths(tmp_path):
    cmd = launch_argv(ProbeSpec(key="k", argv=("/opt/py/bin/python", "t.py")), tmp_path / "T")
    assert cmd[0] == "/opt/py/bin/python"
    cmd = launch_argv(ProbeSpec(key="k", argv=("python2.7", "t.py")), tmp_path / "T")
    assert cmd[0] == "python2.7"  # another version by name stays that interpreter
    cmd = launch_argv(ProbeSpec(key="k", argv=("python", "t.py"), python="/other/python3"), tmp_path / "T")
    assert cmd[0] == "/other/python3"
    script = tmp_path / "run.py"
    script.write_text("#!/usr/bin/env python3\nprint(1)\n")
    cmd = launch_argv(ProbeSpec(key="k", argv=("./run.py", "--a")), tmp_path / "T", tmp_path)
    assert cmd[0] == PY and cmd[-2:] == ["./run.py", "--a"]


@pytest.mark.parametrize(
    "argv, match",
    [
        (("python", "-c", "print(1)"), "python -c"),
        (("python", "-u"), "runs no script"),
        ((), "after --"),
    ],
)
def test_launch_argv_refuses_what_it_cannot_record(tmp_path, argv, match):
    with pytest.raises(UsageError, match=match):
        launch_argv(ProbeSpec(key="k", argv=argv), tmp_path / "T", tmp_path)


# --------------------------------------------------------------------------- outcomes (no framework)


def test_missing_script_is_skip(tmp_path):
    r = run_in_dir(_spec(tmp_path, "python", "nothere.py"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "skip"
    assert classify(r, "finite").verdict == "skip"


def test_missing_interpreter_is_skip(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    r = run_in_dir(_spec(tmp_path, "python", "t.py", python=str(tmp_path / "no-python")), tmp_path, tmp_path / "T")
    assert r.outcome.status == "skip" and "not found" in r.outcome.detail


def test_interpreter_without_reprobisect_is_skip_with_the_fix(tmp_path):
    base = Path(sys.base_prefix) / "bin" / "python3"
    if not base.is_file() or Path(sys.prefix) == Path(sys.base_prefix):
        pytest.skip("no base interpreter outside the virtual environment")
    if subprocess.run([str(base), "-c", "import reprobisect"], cwd=tmp_path, capture_output=True).returncode == 0:
        pytest.skip("the base interpreter has reprobisect installed")
    (tmp_path / "t.py").write_text("pass\n")
    r = run_in_dir(_spec(tmp_path, "python", "t.py", python=str(base)), tmp_path, tmp_path / "T")
    assert r.outcome.status == "skip" and "cannot import reprobisect" in r.outcome.detail


def test_missing_subdir_is_skip(tmp_path):
    r = run_in_dir(_spec(tmp_path, "python", "t.py", subdir="gone"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "skip" and "gone" in r.outcome.detail


def test_exception_is_crashed_and_bad(tmp_path):
    (tmp_path / "t.py").write_text("raise RuntimeError('boom')\n")
    r = run_in_dir(_spec(tmp_path, "python", "t.py"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "crashed"
    assert "boom" in (r.outcome.traceback or "") + r.outcome.detail + r.stderr_tail
    v = classify(r, "finite")
    assert v.verdict == "bad" and v.exit_code == 1


def test_killed_by_signal_is_infra_never_blamed(tmp_path):
    (tmp_path / "t.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = run_in_dir(_spec(tmp_path, "python", "t.py"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "infra" and "SIGKILL" in r.outcome.detail
    assert r.outcome.returncode == -signal.SIGKILL
    assert classify(r, "finite").verdict == "skip"


def test_timeout_outcome_and_env_and_tails(tmp_path):
    (tmp_path / "t.py").write_text(
        "import os, sys, time\n"
        "open('env.txt', 'w').write(os.environ.get('REPRO_TEST_VAR', '-'))\n"
        "sys.stdout.write('x' * 20000 + 'END'); sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    r = run_in_dir(_spec(tmp_path, "python", "t.py", env={"REPRO_TEST_VAR": "42"}, timeout=2), tmp_path, tmp_path / "T")
    assert r.outcome.status == "timeout" and r.outcome.wall_s is not None and r.outcome.wall_s < 30
    assert (tmp_path / "env.txt").read_text() == "42"
    assert len(r.stdout_tail) <= TAIL_BYTES and r.stdout_tail.endswith("END")
    assert classify(r, "match", reference="whatever").verdict == "skip"


def test_no_steps_is_skip(tmp_path):
    (tmp_path / "t.py").write_text("print('no training here')\n")
    r = run_in_dir(_spec(tmp_path, "python", "t.py"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "no_steps"
    assert classify(r, "finite").verdict == "skip"


def test_classify_rejects_bad_input(tmp_path):
    r = ProbeResult(spec=_spec(tmp_path, "python", "t.py"), outcome=Outcome("ok"))
    with pytest.raises(UsageError, match="unknown check"):
        classify(r, "fast")
    with pytest.raises(UsageError, match="--reference"):
        classify(r, "match")


def test_verdict_value():
    v = Verdict("bad", "why", check="match")
    assert not v and v.exit_code == 1 and "bad: why" == str(v)
    assert Verdict("good", "x") and Verdict("skip", "x").exit_code == 125
    assert json.dumps(v.to_json())
    with pytest.raises(ValueError):
        Verdict("maybe", "x")


# --------------------------------------------------------------------------- torch runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four real probes (two jobs at once): base, base again, another lr, a NaN in the data."""
    d = tmp_path_factory.mktemp("probe")
    (d / "train.py").write_text(TRAIN)
    subprocess.run(["git", "init", "-q"], cwd=d, check=True)
    subprocess.run(["git", "add", "train.py"], cwd=d, check=True)
    subprocess.run(["git", "commit", "-qm", "train"], cwd=d, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=d, capture_output=True, text=True).stdout.strip()
    variants = {"base": (), "again": (), "lr": ("--lr", "0.02"), "nan": ("--nan",)}
    ex = LocalExecutor(jobs=2, out_dir=d / "traces")
    futs = {k: ex.submit(_spec(d, "python", "train.py", *a, key=k)) for k, a in variants.items()}
    out = {k: f.result(timeout=300) for k, f in futs.items()}
    ex.close()
    out["_dir"], out["_head"] = d, head
    return out


def test_ok_probe_reports_trace_and_commit(runs):
    r = runs["base"]
    assert r.outcome.status == "ok", r.stderr_tail
    assert r.trace_dir and (Path(r.trace_dir) / "manifest.json").is_file()
    assert r.commit_ran == runs["_head"]
    assert r.outcome.wall_s and r.outcome.wall_s > 0


def test_finite(runs):
    assert classify(runs["base"], "finite").verdict == "good"
    v = classify(runs["nan"], "finite")
    assert v.verdict == "bad" and "NaN" in v.reason


def test_match(runs):
    ref = runs["base"].trace_dir
    v = classify(runs["again"], "match", reference=ref, tolerance="bitwise")
    assert v.verdict == "good" and v.comparison
    v = classify(runs["lr"], "match", reference=ref, tolerance="bitwise")
    assert v.verdict == "bad" and v.comparison is not None and not v.comparison
    assert "step" in v.reason
    # a crash against a reference that ran is a behaviour change
    crashed = replace(runs["lr"], outcome=Outcome("crashed", detail="boom", step=1))
    assert classify(crashed, "match", reference=ref).verdict == "bad"


def test_repro_check(runs):
    assert classify(runs["again"], "repro", reference=runs["base"]).verdict == "good"
    assert classify(runs["lr"], "repro", reference=runs["base"]).verdict == "bad"
    crashed = replace(runs["lr"], outcome=Outcome("crashed", detail="boom"))
    assert classify(crashed, "repro", reference=runs["base"]).verdict == "bad"
    assert classify(crashed, "repro", reference=crashed).verdict == "skip"


# --------------------------------------------------------------------------- bisect probe


@pytest.mark.slow
def test_probe_command_exit_codes(runs):
    d = runs["_dir"]
    ref = runs["base"].trace_dir
    good = _bisect("probe", "--reference", ref, "--", "python", "train.py", cwd=d)
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("good")
    bad = _bisect("probe", "--reference", ref, "--json", "--", "python", "train.py", "--lr", "0.5", cwd=d)
    assert bad.returncode == 1, bad.stderr
    data = json.loads(bad.stdout)
    assert data["verdict"] == "diverged" and data["exit_code"] == 1
    assert data["probe_verdict"]["verdict"] == "bad" and data["probe_verdict"]["comparison"]["first"]["step"] == 0
    skip = _bisect("probe", "--check", "finite", "--", "python", "missing.py", cwd=d)
    assert skip.returncode == 125, skip.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["probe", "--check", "finite"], "give the training command after --"),
        (["probe", "--", "python", "t.py"], "--reference"),
        (["probe", "--check", "match", "--", "python", "t.py"], "--reference"),
        (["probe", "--reference", "no/such/trace", "--", "python", "t.py"], "no trace at"),
        (["probe", "--check", "finite", "--", "python", "-c", "1"], "python -c"),
    ],
)
def test_probe_command_bad_input_is_one_line(tmp_path, args, message):
    p = _bisect(*args, cwd=tmp_path)
    # >= 128 makes `git bisect run` abort; 2 would read as "bad" and blame the commit (issue 10)
    assert p.returncode == 128
    assert message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_git_bisect_run_with_bisect_probe(tmp_path, runs):
    """`git bisect run bisect probe --reference good -- CMD` names the commit that changed numerics."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()  # noqa: E731
    git("init", "-q")
    commits = []
    for i, (lr, broken) in enumerate([("0.01", False), ("0.01", True), ("0.01", False), ("0.02", False), ("0.02", False)]):
        src = f"# commit {i}\n" + TRAIN.replace("default=0.01", f"default={lr}")
        if broken:  # an unbuildable commit: skipped, never blamed
            src = "import torch_not_installed_here\n" + src
        (repo / "train.py").write_text(src)
        git("add", "train.py")
        git("commit", "-qm", f"c{i}")
        commits.append(git("rev-parse", "HEAD"))
    ref = runs["base"].trace_dir  # lr 0.01
    git("bisect", "start", commits[-1], commits[0])
    p = subprocess.run(
        ["git", "bisect", "run", PY, "-m", "reprobisect", "probe", "--quiet", "--reference", ref, "--", "python", "train.py"],
        cwd=repo, capture_output=True, text=True, timeout=600,
    )
    log = p.stdout + p.stderr
    git("bisect", "reset")
    assert f"{commits[3]} is the first bad commit" in log, log
