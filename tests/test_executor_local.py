"""The local executor: process-group timeouts, real concurrency, worktrees, Ctrl-C cleanup.

Every probe runs the real launcher in a real subprocess; the scripts here import no
framework (the launcher then ends them as ``no_steps``), which keeps these tests fast
while exercising everything the executor itself does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprobisect.executors import make_executor
from reprobisect.core.probe import ProbeSpec, trace_dir_name
from reprobisect.executors.base import Executor
from reprobisect.executors.local import LocalExecutor
from reprobisect.executors.retry import run_with_retry

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


SPAWNER = """
import subprocess, sys, time, os, pathlib
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(300)
"""


def test_local_executor_is_an_executor(tmp_path):
    with LocalExecutor(jobs=2, out_dir=tmp_path) as ex:
        assert isinstance(ex, Executor)
        assert ex.name == "local" and ex.max_parallel == 2
    assert isinstance(make_executor("local", jobs=1, out_dir=tmp_path), LocalExecutor)


def test_timeout_kills_the_whole_process_group(tmp_path):
    (tmp_path / "spawn.py").write_text(SPAWNER)
    pidfile = tmp_path / "child.pid"
    spec = ProbeSpec(key="t", argv=("python", "spawn.py", str(pidfile)), workdir=str(tmp_path), timeout=4.0)
    with LocalExecutor(out_dir=tmp_path / "out") as ex:
        fut = ex.submit(spec)
        child = int(_wait_for(pidfile))
        assert _alive(child)
        res = fut.result(timeout=60)
    assert res.outcome.status == "timeout"
    assert "process group killed" in res.outcome.detail
    time.sleep(0.2)
    assert not _alive(child), "the probe's child process survived the timeout"


def test_concurrent_probes_really_overlap(tmp_path):
    script = tmp_path / "stamp.py"
    script.write_text(
        "import sys, time, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "p.with_suffix('.start').write_text(repr(time.time()))\n"
        "time.sleep(2.0)\n"
        "p.with_suffix('.end').write_text(repr(time.time()))\n"
    )
    specs = [
        ProbeSpec(key=f"p{i}", argv=("python", "stamp.py", str(tmp_path / f"s{i}")), workdir=str(tmp_path))
        for i in range(2)
    ]
    with LocalExecutor(jobs=2, out_dir=tmp_path / "out") as ex:
        results = [f.result(timeout=120) for f in [ex.submit(s) for s in specs]]
    assert [r.outcome.status for r in results] == ["no_steps", "no_steps"]
    starts = [float((tmp_path / f"s{i}.start").read_text()) for i in range(2)]
    ends = [float((tmp_path / f"s{i}.end").read_text()) for i in range(2)]
    # both probes were running at the same moment: each started before the other ended
    assert starts[0] < ends[1] and starts[1] < ends[0]


def test_jobs_bound_concurrency(tmp_path):
    script = tmp_path / "stamp.py"
    script.write_text(
        "import sys, time, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "p.with_suffix('.start').write_text(repr(time.time()))\n"
        "time.sleep(0.5)\n"
        "p.with_suffix('.end').write_text(repr(time.time()))\n"
    )
    specs = [ProbeSpec(key=f"p{i}", argv=("python", "stamp.py", str(tmp_path / f"s{i}")), workdir=str(tmp_path)) for i in range(2)]
    with LocalExecutor(jobs=1, out_dir=tmp_path / "out") as ex:
        [f.result(timeout=120) for f in [ex.submit(s) for s in specs]]
    s = sorted((float((tmp_path / f"s{i}.start").read_text()), float((tmp_path / f"s{i}.end").read_text())) for i in range(2))
    assert s[1][0] >= s[0][1], "with jobs=1 the second probe started before the first ended"


def test_trace_folder_per_key_and_attempt(tmp_path):
    (tmp_path / "hang.py").write_text("import time; time.sleep(60)\n")
    spec = ProbeSpec(key="c0ffee/run 1", argv=("python", "hang.py"), workdir=str(tmp_path), timeout=1.0)
    calls = []

    class Counting(LocalExecutor):
        def submit(self, s):
            calls.append(s)
            return super().submit(s)

    with Counting(out_dir=tmp_path / "out") as ex:
        res = run_with_retry(ex, spec, retries=1)
    assert res.outcome.status == "timeout"
    assert [c.attempt for c in calls] == [0, 1]
    assert trace_dir_name(calls[0]) != trace_dir_name(calls[1])
    assert "/" not in trace_dir_name(calls[0]) and " " not in trace_dir_name(calls[0])


def test_temporary_traces_removed_unless_kept(tmp_path):
    (tmp_path / "quick.py").write_text("print('hi')\n")
    spec = ProbeSpec(key="q", argv=("python", "quick.py"), workdir=str(tmp_path))
    ex = LocalExecutor()
    res = ex.submit(spec).result(timeout=60)
    assert res.outcome.status == "no_steps" and res.trace_dir and Path(res.trace_dir).is_dir()
    out = ex.out_dir
    ex.close()
    assert not out.exists()
    ex = LocalExecutor(keep=True)
    res = ex.submit(spec).result(timeout=60)
    ex.close()
    assert Path(res.trace_dir).is_dir()
    import shutil

    shutil.rmtree(ex.out_dir)


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "sub").mkdir(parents=True)
    _git(r, "init", "-q")
    (r / "sub" / "which.py").write_text("import os, pathlib, sys\npathlib.Path(sys.argv[1]).write_text('v1 ' + os.getcwd())\n")
    _git(r, "add", ".")
    _git(r, "commit", "-qm", "v1")
    v1 = _git(r, "rev-parse", "HEAD")
    (r / "sub" / "which.py").write_text("import os, pathlib, sys\npathlib.Path(sys.argv[1]).write_text('v2 ' + os.getcwd())\n")
    _git(r, "commit", "-qam", "v2")
    # the user's own uncommitted edit must survive and must not be what runs
    (r / "sub" / "which.py").write_text("raise SystemExit('dirty working tree ran')\n")
    (r / "untracked.txt").write_text("mine")
    return r, v1


def test_revision_runs_in_a_worktree_and_leaves_the_checkout_alone(repo, tmp_path):
    r, v1 = repo
    before = (_git(r, "status", "--porcelain"), _git(r, "rev-parse", "HEAD"), _git(r, "stash", "list"))
    out = tmp_path / "which.txt"
    spec = ProbeSpec(key="v1", argv=("python", "which.py", str(out)), repo=str(r), revision=v1, subdir="sub")
    with LocalExecutor(out_dir=tmp_path / "out") as ex:
        res = ex.submit(spec).result(timeout=60)
    assert res.commit_ran == v1
    text = out.read_text()
    assert text.startswith("v1 ") and text.endswith(os.sep + "sub")
    assert not text.split(" ", 1)[1].startswith(str(r) + os.sep + "sub")  # not the user's folder
    assert (_git(r, "status", "--porcelain"), _git(r, "rev-parse", "HEAD"), _git(r, "stash", "list")) == before
    assert (r / "untracked.txt").read_text() == "mine"
    assert len(_git(r, "worktree", "list").splitlines()) == 1


def test_close_kills_running_probes_and_removes_worktrees(repo, tmp_path):
    r, v1 = repo
    (tmp_path / "spawn.py").write_text(SPAWNER)
    pidfile = tmp_path / "child.pid"
    spec = ProbeSpec(key="hang", argv=("python", str(tmp_path / "spawn.py"), str(pidfile)), repo=str(r), revision=v1)
    ex = LocalExecutor(out_dir=tmp_path / "out")
    fut = ex.submit(spec)
    child = int(_wait_for(pidfile))
    assert len(_git(r, "worktree", "list").splitlines()) == 2
    t0 = time.monotonic()
    ex.close()  # what a KeyboardInterrupt handler (or leaving `with`) does
    assert time.monotonic() - t0 < 30
    assert fut.done()
    time.sleep(0.2)
    assert not _alive(child)
    assert len(_git(r, "worktree", "list").splitlines()) == 1
    assert _git(r, "status", "--porcelain") != ""  # the user's dirty edit is still there


def test_keyboard_interrupt_in_with_block_cleans_up(repo, tmp_path):
    r, v1 = repo
    (tmp_path / "spawn.py").write_text(SPAWNER)
    pidfile = tmp_path / "child.pid"
    spec = ProbeSpec(key="hang", argv=("python", str(tmp_path / "spawn.py"), str(pidfile)), repo=str(r), revision=v1)
    child = None
    with pytest.raises(KeyboardInterrupt):
        with LocalExecutor(out_dir=tmp_path / "out") as ex:
            ex.submit(spec)
            child = int(_wait_for(pidfile))
            raise KeyboardInterrupt
    time.sleep(0.2)
    assert child is not None and not _alive(child)
    assert len(_git(r, "worktree", "list").splitlines()) == 1


def test_bad_revision_is_infra_not_a_crash(repo, tmp_path):
    r, _ = repo
    spec = ProbeSpec(key="x", argv=("python", "which.py", "x"), repo=str(r), revision="0" * 40)
    with LocalExecutor(out_dir=tmp_path / "out") as ex:
        res = ex.submit(spec).result(timeout=60)
    assert res.outcome.status in ("infra", "skip")
    assert res.outcome.detail


def test_parallel_probes_at_two_revisions(repo, tmp_path):
    r, v1 = repo
    v2 = _git(r, "rev-parse", "HEAD")
    specs = [
        ProbeSpec(key=k, argv=("python", "which.py", str(tmp_path / f"{k}.txt")), repo=str(r), revision=rev, subdir="sub")
        for k, rev in (("a", v1), ("b", v2))
    ]
    with LocalExecutor(jobs=2, out_dir=tmp_path / "out") as ex:
        results = [f.result(timeout=60) for f in [ex.submit(s) for s in specs]]
    assert [x.commit_ran for x in results] == [v1, v2]
    assert (tmp_path / "a.txt").read_text().startswith("v1")
    assert (tmp_path / "b.txt").read_text().startswith("v2")
    assert len(_git(r, "worktree", "list").splitlines()) == 1
