"""Errors are errors, never verdicts (issue 34, CLI/capture/executor part).

Real parts throughout: the real CLI (``reprobisect.cli.main`` or the ``bisect`` script), real
probes of tiny scripts, a real tmpfs for the full disk (skipped where mounting is not
permitted), real git repositories and real SIGKILLs for the stale worktree.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.core.outcome import Status, disk_full
from reprobisect.core.probe import ProbeSpec
from reprobisect.core.verdict import classify
from reprobisect.errors import TraceError, UsageError
from reprobisect.executors.process import run_in_dir
from reprobisect.workflows.runs import RunsConfig

ROOT = Path(__file__).resolve().parents[1]
BISECT = ROOT / ".venv" / "bin" / "bisect"
MLP = ROOT / "examples" / "mlp.py"


def _bisect(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [str(BISECT)] if BISECT.exists() else [sys.executable, "-m", "reprobisect"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --------------------------------------------------------------------------- 1. a full disk


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MB tmpfs (root only; skipped where mounting is not permitted), unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(disk: Path, leave_kib: int) -> None:
    """Fill ``disk`` but for ``leave_kib`` KiB."""
    st = os.statvfs(disk)
    size = st.f_bavail * st.f_frsize - leave_kib * 1024
    with open(disk / "filler", "wb") as f:
        f.truncate(0)
        os.posix_fallocate(f.fileno(), 0, max(size, 0))


def _assert_not_complete(trace: Path) -> None:
    from reprobisect.trace.reader import read_trace

    if (trace / "manifest.json").exists():  # 'failed' or 'incomplete': never read as a complete trace
        with pytest.raises(TraceError):
            read_trace(trace)
    assert not list(trace.glob(".manifest.json.tmp*")), "a half-written manifest was left behind"


@pytest.mark.slow
def test_capture_on_a_full_disk_is_one_line_exit_2_naming_the_disk(tiny_disk):
    # a wide model with full tensors: the child's recorder hits ENOSPC writing the trace's tensors
    trace = tiny_disk / "run.trace"
    r = _bisect("capture", "-q", "-o", str(trace), "--steps", "2", "--full-steps", "0,1", "--",
                "python", str(MLP), "--hidden", "512", "--steps", "3", cwd=tiny_disk.parent)
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert line.startswith(f"error: no space left on the disk holding '{trace}' (ENOSPC) while writing the trace; "
                           "free space there or choose another -o"), line
    _assert_not_complete(trace)


@pytest.mark.slow
def test_capture_on_a_full_disk_without_q_ends_with_the_one_line_and_no_traceback(tiny_disk):
    trace = tiny_disk / "run.trace"
    r = _bisect("capture", "-o", str(trace), "--steps", "2", "--full-steps", "0,1", "--",
                "python", str(MLP), "--hidden", "512", "--steps", "3", cwd=tiny_disk.parent)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "  File " not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: no space left on the disk holding '{trace}'"), r.stderr
    _assert_not_complete(trace)


@pytest.mark.slow
@pytest.mark.parametrize("leave_kib", [4, 8, 16])
def test_capture_on_an_almost_full_disk_is_one_line_wherever_enospc_hits(tiny_disk, leave_kib):
    # 4 KiB: this process cannot even make the trace's files; 8: the launcher's first writes
    # (its claim, the first manifest); 16: the recorder's first step: all one line, exit 2
    _fill(tiny_disk, leave_kib)
    trace = tiny_disk / "run.trace"
    r = _bisect("capture", "-q", "-o", str(trace), "--steps", "2", "--", "python", str(MLP), "--steps", "3",
                cwd=tiny_disk.parent)
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert line.startswith(f"error: no space left on the disk holding '{trace}' (ENOSPC)"), line
    _assert_not_complete(trace)


@pytest.mark.slow
def test_a_full_disk_in_the_child_is_infra_never_the_programs_crash(tiny_disk):
    spec = ProbeSpec(key="p", argv=("python", str(MLP), "--hidden", "512", "--steps", "3"), workdir=str(ROOT),
                     steps=2, full_steps=(0, 1))
    r = run_in_dir(spec, ROOT, tiny_disk / "run.trace")
    assert r.outcome.status is Status.INFRA, r.outcome
    assert disk_full(r.outcome) == f"no space left on the disk holding '{tiny_disk / 'run.trace'}' (ENOSPC) " \
                                   "while writing the trace", r.outcome
    assert classify(r, "finite").verdict == "skip"


def test_a_parent_side_full_disk_names_the_disk(tmp_path, capsys):
    # what this process itself cannot write (ENOSPC from the OS) is exit 2, naming the disk, not the generic
    # "check the path and its permissions"
    from reprobisect.cli import _os_error

    e = OSError(28, "No space left on device", str(tmp_path / "x.trace"))
    assert _os_error(e) == (f"no space left on the disk holding '{tmp_path / 'x.trace'}' (ENOSPC); "
                            "free space there or choose another path")


# --------------------------------------------------------------------------- 2. bad config files


@pytest.mark.parametrize("argv,code", [
    (["capture", "-o", "t.trace", "--config", "bad.yaml", "--", "python", "x.py"], 2),
    (["runs", "--good", "a", "--bad", "b", "--config", "bad.yaml", "--", "python", "x.py"], 2),
    (["repro", "--config", "bad.yaml", "--", "python", "x.py"], 2),
    (["probe", "--check", "finite", "--config", "bad.yaml", "--", "python", "x.py"], 128),
])
def test_a_non_utf8_config_file_is_one_line_naming_it(tmp_path, monkeypatch, capsys, argv, code):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe\x00steps: 3")
    assert main(argv) == code
    captured = capsys.readouterr()
    assert _one_line(captured.err) == ("error: config file 'bad.yaml' is not UTF-8 text (byte 0xff at offset 0); "
                                       "save it as UTF-8 YAML or JSON")
    assert not (tmp_path / "t.trace").exists()


@pytest.mark.parametrize("content,message", [
    ("- 1\n- 2\n", "error: config file 'c.yaml' must hold a mapping of option: value"),
    ("steps: [1,\n", "error: config file 'c.yaml' is not valid YAML/JSON"),
    ("lock_timeout: .nan\n", "error: config file 'c.yaml': unknown key 'lock_timeout'"),
    (None, "error: invalid value for '--config': File 'c.yaml' is a directory; see bisect "),
])
@pytest.mark.parametrize("cmd,code", [("capture", 2), ("probe", 128)])
def test_other_bad_config_files_are_one_line(tmp_path, monkeypatch, capsys, content, message, cmd, code):
    monkeypatch.chdir(tmp_path)
    if content is None:
        (tmp_path / "c.yaml").mkdir()
    else:
        (tmp_path / "c.yaml").write_text(content)
    argv = ["capture", "-o", "t.trace"] if cmd == "capture" else ["probe", "--check", "finite"]
    assert main([*argv, "--config", "c.yaml", "--", "python", "x.py"]) == code
    assert _one_line(capsys.readouterr().err).startswith(message)


def test_a_config_folder_given_to_the_library_is_a_usage_error(tmp_path):
    from reprobisect.cli.options import load_config

    with pytest.raises(UsageError, match=r"config file '.*' is a folder; give --config a YAML or JSON file"):
        load_config(tmp_path)


# --------------------------------------------------------------------------- 3. --lock-timeout


@pytest.mark.parametrize("value,why", [("nan", "a finite number (got nan)"), ("inf", "a finite number (got inf)"),
                                       ("-1", ">= 0 (got -1)")])
def test_lock_timeout_nan_inf_and_negative_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys, value, why):
    monkeypatch.chdir(tmp_path)  # not even a repository: the flag is refused first
    assert main(["runs", "--good", "a", "--bad", "b", "--lock-timeout", value, "--", "python", "x.py"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == f"error: invalid value for '--lock-timeout': the value must be {why}; see bisect runs --help"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_runs_config_refuses_a_bad_lock_timeout(value):
    with pytest.raises(UsageError, match="--lock-timeout must be"):
        RunsConfig(good="a", bad="b", command=("python", "x.py"), lock_timeout=value)
    assert RunsConfig(good="a", bad="b", command=("python", "x.py"), lock_timeout=2.5).lock_timeout == 2.5


# --------------------------------------------------------------------------- 4. a program that aborts itself


def _spec(tmp: Path, *argv: str, **kw) -> ProbeSpec:
    return ProbeSpec(key="p", argv=tuple(argv), workdir=str(tmp), **kw)


@pytest.mark.parametrize("script,sig,words", [
    ("import os\nos.abort()\n", signal.SIGABRT, "the program aborted itself (SIGABRT"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", signal.SIGSEGV, "the program crashed itself (SIGSEGV"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGFPE)\n", signal.SIGFPE, "the program crashed itself (SIGFPE"),
])
def test_a_program_that_aborts_itself_is_crashed_and_bad(tmp_path, script, sig, words):
    (tmp_path / "t.py").write_text(script)
    r = run_in_dir(_spec(tmp_path, "python", "t.py"), tmp_path, tmp_path / "T")
    assert r.outcome.status is Status.CRASHED, r.outcome
    assert r.outcome.detail.startswith(words) and r.outcome.returncode == -sig
    assert classify(r, "finite").verdict == "bad"
    assert classify(r, "match", reference="unused").verdict == "bad"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_kill_from_outside_stays_infra(tmp_path, sig):
    (tmp_path / "t.py").write_text(f"import os\nos.kill(os.getpid(), {int(sig)})\n")
    r = run_in_dir(_spec(tmp_path, "python", "t.py"), tmp_path, tmp_path / "T")
    assert r.outcome.status is Status.INFRA and sig.name in r.outcome.detail
    assert classify(r, "finite").verdict == "skip"


def test_bisect_probe_exits_1_bad_for_a_program_that_aborts_itself(tmp_path):
    (tmp_path / "t.py").write_text("import os\nos.abort()\n")
    r = _bisect("probe", "--check", "finite", "-q", "--", "python", "t.py", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "aborted itself (SIGABRT" in r.stdout


ABORT_AFTER_A_STEP = """import os, torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(5):
    opt.zero_grad()
    m(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    if step == 1:
        os.abort()
"""


@pytest.mark.slow
def test_capture_of_a_torch_program_that_aborts_names_the_step(tmp_path):
    (tmp_path / "abort.py").write_text(ABORT_AFTER_A_STEP)
    r = _bisect("capture", "-q", "-o", "a.trace", "--steps", "3", "--", "python", "abort.py", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines()[0].startswith("crashed at step 2: the program aborted itself (SIGABRT"), r.stdout


# --------------------------------------------------------------------------- 5. click's usage errors


@pytest.mark.parametrize("argv,code,line", [
    (["capture", "--stepz", "3", "--", "python", "x.py"], 2,
     "error: no such option '--stepz' for bisect capture (did you mean --steps?); "
     "see bisect capture --help"),
    (["probe", "--stepz", "3"], 128,
     "error: no such option '--stepz' for bisect probe (did you mean --steps?); "
     "see bisect probe --help"),
    (["capture", "--zzz", "--", "x"], 2, "error: no such option '--zzz' for bisect capture; see bisect capture --help"),
    (["capture", "-o", "t", "--steps", "abc", "--", "python", "x.py"], 2,
     "error: invalid value for '--steps': 'abc' is not a valid integer; see bisect capture --help"),
    (["runs", "--bad", "x", "--", "python", "x.py"], 2, "error: missing option '--good'; see bisect runs --help"),
    (["compare", "a"], 2, "error: missing argument 'B'; see bisect compare --help"),
    (["nosuch"], 2, "error: no such command 'nosuch' for bisect; see bisect --help"),
])
def test_click_usage_errors_are_one_line_with_the_fix(tmp_path, monkeypatch, capsys, argv, code, line):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == code
    captured = capsys.readouterr()
    assert _one_line(captured.err) == line
    assert "Usage:" not in captured.err and "Try " not in captured.err


def test_bare_bisect_still_shows_the_help(capsys):
    assert main([]) == 2
    assert "Usage: bisect" in capsys.readouterr().err


# --------------------------------------------------------------------------- 6. --resume prunes stale worktrees


SLOW = """import os, signal, time
if os.path.exists(os.environ["FLAG"]):
    with open(os.environ["PIDFILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(120)
else:  # the resumed session's probe: the killed session's orphaned probe ends meanwhile
    for pid in open(os.environ["PIDFILE"]).read().split():
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.5)
print("nothing to train")
"""


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_resume_after_a_sigkill_prunes_the_killed_sessions_worktree(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for i in range(2):
        (root / "slow.py").write_text(SLOW)
        (root / "n.txt").write_text(f"{i}\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"c{i}")
    flag, pidfile = tmp_path / "flag", tmp_path / "pids"
    flag.touch()
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLAG=str(flag), PIDFILE=str(pidfile))
    argv = [sys.executable, "-m", "reprobisect", "runs", "--good", "HEAD~1", "--bad", "HEAD", "-q"]
    p = subprocess.Popen([*argv, "--", "python", "slow.py"], cwd=root, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    p.kill()  # SIGKILL: nothing is cleaned; the probe goes on as an orphan
    p.communicate(timeout=30)
    orphan = int(pidfile.read_text().split()[0])
    try:
        assert _git(root, "worktree", "list", "--porcelain").count("worktree ") == 2
        flag.unlink()
        # --resume starts while the orphan still works in the old worktree (kept: in use) and ends it
        r = subprocess.run([*argv, "--resume", "--", "python", "slow.py"], cwd=root, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2, r.stderr  # slow.py records no step: --good does not probe good
    finally:
        try:
            os.killpg(orphan, signal.SIGKILL)
        except OSError:
            pass
    listed = _git(root, "worktree", "list", "--porcelain")
    assert listed.count("worktree ") == 1, listed  # only the user's checkout: the stale entry went with --resume
    assert not list((root / ".git" / "reprobisect" / "worktrees").iterdir())


def test_resume_prunes_a_leftover_of_a_dead_owner(tmp_path):
    # a leftover as a SIGKILL'd session leaves it (registered in git, its owner pid dead), resumed
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for i in range(2):
        (root / "fast.py").write_text(f"print({i})\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"c{i}")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = root / ".git" / "reprobisect" / "worktrees" / f"{socket.gethostname()}-{dead.pid}-{uuid.uuid4().hex[:6]}"
    stale.mkdir(parents=True)
    _git(root, "worktree", "add", "--detach", str(stale / "wt1"), "HEAD")
    argv = ["runs", "--good", "HEAD~1", "--bad", "HEAD", "-q", "--", "python", "fast.py"]
    assert _bisect(*argv, cwd=root).returncode == 2  # a session log to resume
    _git(root, "worktree", "add", "--detach", str(stale / "wt2"), "HEAD")  # the killed session's
    r = _bisect(*argv[:-3], "--resume", *argv[-3:], cwd=root)
    assert r.returncode == 2 and "does not probe good" in r.stderr, r.stderr
    assert _git(root, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not stale.exists()


# --------------------------------------------------------------------------- capture: untested is not a verdict


def test_capture_that_timed_out_could_not_test_the_command_exit_125(tmp_path):
    """A timeout says nothing of the command: 125 (could not be tested), never 1 (a verdict)."""
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(60)\n")
    p = _bisect("capture", "-q", "-o", str(tmp_path / "t.trace"), "--timeout", "2", "--", sys.executable, str(script),
                cwd=tmp_path)
    assert p.returncode == 125, (p.returncode, p.stdout, p.stderr)
    assert "timeout" in (p.stdout + p.stderr).lower()
