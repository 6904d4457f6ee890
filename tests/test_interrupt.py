"""SIGTERM / SIGHUP end a probing command like Ctrl-C; a SIGKILL'd session's leftovers go at the next start.

Real CLI subprocesses on a tiny real git repository whose command sleeps (no torch: the
probe is the launcher running a slow script), real signals, real ``git worktree list``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprobisect.support import interrupt

ROOT = Path(__file__).resolve().parents[1]

SLOW = """import os, time
with open(os.environ["PIDFILE"], "a") as f:
    f.write(f"{os.getpid()}\\n")
print("slow script started", flush=True)
time.sleep(120)
"""
FAST = "print('nothing to train')\n"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for i in range(2):
        (root / "slow.py").write_text(SLOW)
        (root / "fast.py").write_text(FAST)
        (root / "n.txt").write_text(f"{i}\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"c{i}")
    return root


def _env(tmp_path: Path) -> dict[str, str]:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp), PIDFILE=str(tmp_path / "pids"))


def _argv(cmd: str, tmp_path: Path, script: str = "slow.py") -> list[str]:
    bisect = [sys.executable, "-m", "reprobisect"]
    if cmd == "runs":
        return [*bisect, "runs", "--good", "HEAD~1", "--bad", "HEAD", "-q", "--", "python", script]
    if cmd == "repro":
        return [*bisect, "repro", "--runs", "2", "-q", "--", "python", script]
    if cmd == "seeds":
        return [*bisect, "seeds", "--seeds", "0,1", "-q", "--", "python", script, "--seed", "{seed}"]
    if cmd == "envs":
        return [*bisect, "envs", "--a", "env.X=1", "--b", "env.X=2", "-q", "--", "python", script]
    if cmd == "probe":
        return [*bisect, "probe", "--check", "finite", "-q", "--", "python", script]
    return [*bisect, "capture", "-o", str(tmp_path / "cap.trace"), "--", "python", script]


def _start(cmd: str, repo: Path, tmp_path: Path, script: str = "slow.py") -> subprocess.Popen:
    def default_hup() -> None:  # a test runner under nohup would hand its SIG_IGN down
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    return subprocess.Popen(_argv(cmd, tmp_path, script), cwd=repo, env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_hup)


def _wait_for_probe(p: subprocess.Popen, pidfile: Path, n: int = 1) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []
        if len(pids) >= n:
            time.sleep(0.3)
            return pids
        if p.poll() is not None:
            pytest.fail(f"the command ended before its probe started: {p.communicate()}")
        time.sleep(0.1)
    p.kill()
    pytest.fail("the probe never started")


def _group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(proc.name))
    return out


def _leftovers(repo: Path, tmp_path: Path) -> dict:
    wt_cache = repo / ".git" / "reprobisect" / "worktrees"
    return {
        "worktrees": _git(repo, "worktree", "list", "--porcelain").count("worktree "),
        "cache": sorted(p.name for p in wt_cache.iterdir()) if wt_cache.is_dir() else [],
        "tmp": sorted(p.name for p in (tmp_path / "tmp").iterdir()),
    }


CASES = [("runs", signal.SIGTERM), ("runs", signal.SIGHUP), ("repro", signal.SIGTERM), ("capture", signal.SIGTERM),
         ("seeds", signal.SIGTERM), ("envs", signal.SIGHUP), ("probe", signal.SIGTERM)]


@pytest.mark.parametrize("cmd,sig", CASES, ids=[f"{c}-{s.name}" for c, s in CASES])
def test_signal_cleans_up_like_ctrl_c(repo, tmp_path, cmd, sig):
    p = _start(cmd, repo, tmp_path)
    pids = _wait_for_probe(p, tmp_path / "pids")
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    time.sleep(0.2)
    survivors = [pid for pid in pids if _group_alive(pid)]
    for pid in survivors:  # never leave this test's orphans running
        os.killpg(pid, signal.SIGKILL)
    assert p.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in err and "Traceback" not in err
    # the probe ran as leader of its own group: nothing of it survives
    assert not survivors, f"probe groups {survivors} survived {sig.name}"
    left = _leftovers(repo, tmp_path)
    assert left == {"worktrees": 1, "cache": [], "tmp": []}, left
    if cmd == "runs":  # the session log holds only finished probes: none
        from reprobisect.core.session import SessionLog

        (log,) = (repo / ".git" / "reprobisect" / "sessions").glob("*.jsonl")
        assert len(SessionLog.load(log)) == 0


def test_sigkill_leftovers_are_cleaned_at_the_next_start_but_not_while_in_use(repo, tmp_path):
    p = _start("runs", repo, tmp_path)
    (pid,) = _wait_for_probe(p, tmp_path / "pids")
    p.kill()
    p.communicate(timeout=30)
    left = _leftovers(repo, tmp_path)
    # the killed run's traces folder, and the claim on its probe's rendezvous port (its owner is gone: the next
    # start sweeps it)
    ours = [n for n in left["tmp"] if not n.startswith("reprobisect-ports-")]
    assert left["worktrees"] == 2 and len(left["cache"]) == 1 and len(ours) == 1, left
    assert _group_alive(pid), "the orphaned probe should still run (SIGKILL cannot be handled)"

    # the next start while the orphaned probe still runs: its worktree and folder stay
    r = subprocess.run(_argv("runs", tmp_path, "fast.py"), cwd=repo, env=_env(tmp_path), capture_output=True, text=True)
    assert r.returncode == 2, r.stderr  # fast.py records no step: --good does not probe good
    assert _leftovers(repo, tmp_path) == {**left, "tmp": ours}  # only the dead owner's port claim went

    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    r = subprocess.run(_argv("runs", tmp_path, "fast.py"), cwd=repo, env=_env(tmp_path), capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert _leftovers(repo, tmp_path) == {"worktrees": 1, "cache": [], "tmp": []}


def test_temp_cleanup_removes_only_our_dead_owners_folders(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()

    def folder(name: str, record: dict | None) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "data").write_text("x")
        if record is not None:
            (d / interrupt.OWNER_FILE).write_text(json.dumps(record))
        return d

    gone = folder("reprobisect-traces-dead", {"pid": dead.pid, "host": host, "start": None})
    reused = folder("reprobisect-traces-reused", {"pid": os.getpid(), "host": host, "start": "1"})
    live = folder("reprobisect-traces-live", interrupt.owner_record())
    foreign = folder("reprobisect-traces-foreign", None)  # no owner file: not provably ours
    other_host = folder("reprobisect-traces-elsewhere", {"pid": dead.pid, "host": host + "-other"})
    not_ours = folder("other-tool-dead", {"pid": dead.pid, "host": host})
    garbage = folder("reprobisect-traces-garbage", None)
    (garbage / interrupt.OWNER_FILE).write_text("{not json")
    removed = interrupt.clean_stale_temp_dirs(tmp_path)
    assert sorted(removed) == sorted([gone, reused])
    for d in (live, foreign, other_host, not_ours, garbage):
        assert d.is_dir()


def test_exit_codes_follow_the_shell_convention():
    assert interrupt.Interrupted(signal.SIGTERM).exit_code == 143
    assert interrupt.Interrupted(signal.SIGHUP).exit_code == 129
    assert interrupt.Interrupted(signal.SIGINT).exit_code == 130
    assert interrupt.exit_code(KeyboardInterrupt()) == 130
    try:
        try:
            raise interrupt.Interrupted(signal.SIGTERM)
        except KeyboardInterrupt as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        assert interrupt.exit_code(e) == 143
