"""Issue 10 (reliability of the CLI): output folders, the one error boundary, numeric
options, and untrusted traces. Real folders, real subprocesses, a real ``git bisect run``.

Fault injection (``monkeypatch`` making a library call raise) is used only where no real
input can reach the code path: an internal error is by definition a bug we do not have.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.exitcodes import ExitCode
from reprobisect.errors import TraceError, UsageError
from reprobisect.trace.outdir import MARKER, check_trace_target, is_trace_dir, prepare_output_dir
from reprobisect.trace import Record, TraceWriter, read_trace

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]


def _bisect(*args: str, cwd: Path, timeout: float = 60, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([PY, "-m", "reprobisect", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=e, stdin=subprocess.DEVNULL, **kw)


def _project(d: Path) -> dict[str, bytes]:
    """A user's folder that happens to hold a file named manifest.json (a web app, say)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({"name": "my-app", "version": "1.0.0", "start_url": "/"}))
    (d / "README.md").write_text("# my app\n")
    (d / "src").mkdir(exist_ok=True)
    (d / "src" / "app.js").write_text("console.log('hi')\n")
    return _snapshot(d)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


HANG = "import time\ntime.sleep(30)\n"  # a training command that hangs: nothing may run it before validation


def _hang(d: Path) -> list[str]:
    (d / "hang.py").write_text(HANG)
    return ["--", "python", "hang.py"]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------- output folders


def test_capture_never_deletes_a_folder_that_merely_holds_a_manifest_json(tmp_path, capsys, monkeypatch):
    """The data-loss bug: capture -o on a web project (manifest.json, README.md, src/app.js) emptied it."""
    (tmp_path / "train.py").write_text("print('no training here')\n")
    proj = tmp_path / "webapp"
    before = _project(proj)
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "-o", str(proj), "--", "python", "train.py"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "not a reprobisect trace" in line and "nothing was deleted" in line
    assert _snapshot(proj) == before


def test_trace_writer_refuses_a_foreign_manifest_json_and_keeps_the_files(tmp_path):
    proj = tmp_path / "webapp"
    before = _project(proj)
    with pytest.raises(TraceError, match="not a reprobisect trace"):
        TraceWriter(proj)
    assert _snapshot(proj) == before
    # a manifest that names the format but no valid version is not a trace either
    (proj / "manifest.json").write_text(json.dumps({"format": "reprobisect-trace", "version": "1"}))
    assert not is_trace_dir(proj)
    with pytest.raises(TraceError):
        TraceWriter(proj)
    assert (proj / "src" / "app.js").is_file()


def test_a_real_trace_is_still_replaced_whole_and_an_empty_folder_is_used(tmp_path):
    t = tmp_path / "run.trace"
    with TraceWriter(t, command=["train.py"]) as w:
        w.begin_step(0)
        w.record(Record(name="m", kind="activation", dtype="float32", shape=(2,), fingerprint="x"))
        w.end_step()
    (t / "stale-extra-file").write_text("from an older attempt")
    assert is_trace_dir(t)
    check_trace_target(t)
    with TraceWriter(t, command=["train.py"]) as w:
        pass
    assert read_trace(t).manifest.steps == 0 and not (t / "stale-extra-file").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.trace")]  # no temporary sibling left
    empty = tmp_path / "empty"
    empty.mkdir()
    with TraceWriter(empty):
        pass
    assert is_trace_dir(empty)


@pytest.mark.parametrize(
    "args, code",
    [
        (["repro"], 2),
        (["seeds"], 2),
        (["envs", "--a", "X=1", "--b", "X=2"], 2),
        (["runs", "--good", "HEAD~1", "--bad", "HEAD"], 2),
        (["probe", "--check", "finite"], ExitCode.PROBE_USAGE),
    ],
)
def test_every_dash_o_refuses_a_folder_it_did_not_write(tmp_path, capsys, args, code, monkeypatch):
    proj = tmp_path / "webapp"
    before = _project(proj)
    monkeypatch.chdir(tmp_path)
    # the command would hang: the refusal must come before any probe runs
    t0 = time.monotonic()
    rc = main([*args, "-o", str(proj), *_hang(tmp_path)])
    assert rc == code and time.monotonic() - t0 < 20
    line = _one_line(capsys.readouterr().err)
    assert "reprobisect did not write" in line and "nothing was touched" in line
    assert _snapshot(proj) == before


def test_output_folder_new_empty_ours_or_only_traces(tmp_path):
    new = prepare_output_dir(tmp_path / "a" / "b")
    assert (new / MARKER).is_file()
    prepare_output_dir(new)  # reprobisect's own, by its marker
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_output_dir(empty)
    assert (empty / MARKER).is_file()
    traces = tmp_path / "traces"  # written before the marker existed: nothing but traces
    with TraceWriter(traces / "p-a0"):
        pass
    prepare_output_dir(traces)
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        prepare_output_dir(tmp_path / "f")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / MARKER).write_text('{"format": "something-else", "version": 1}')
    (fake / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="did not write"):
        prepare_output_dir(fake)


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder nobody may write into, root included (chmod, then chattr +i where root ignores modes)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    immutable = False
    try:
        probe = d / ".w"
        probe.write_text("")
        probe.unlink()
        writable = True
    except OSError:
        writable = False
    if writable:
        r = subprocess.run(["chattr", "+i", str(d)], capture_output=True)
        immutable = r.returncode == 0
        if not immutable:
            pytest.skip("cannot make a read-only folder here (root without chattr)")
    yield d
    if immutable:
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)
    d.chmod(0o755)


@pytest.mark.parametrize(
    "args",
    [
        ["capture", "-o", "{ro}/run.trace"],
        ["capture", "-o", "{ro}"],
        ["repro", "-o", "{ro}/out"],
        ["repro", "-o", "{ro}"],
        ["runs", "--good", "a", "--bad", "b", "-o", "{ro}/out"],
    ],
)
def test_a_read_only_output_folder_is_one_line_exit_2(read_only_dir, tmp_path, args):
    (tmp_path / "train.py").write_text("print(1)\n")
    argv = [a.replace("{ro}", str(read_only_dir)) for a in args]
    p = _bisect(*argv, "--", "python", "train.py", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("error: cannot ") and str(read_only_dir) in line


# --------------------------------------------------------------------------- the error boundary


def _two_traces(tmp_path: Path, fa: str = "x", fb: str = "y", **kw) -> tuple[Path, Path]:
    out = []
    for name, fp in (("a.trace", fa), ("b.trace", fb)):
        with TraceWriter(tmp_path / name, **kw) as w:
            w.begin_step(0)
            w.record(Record(name="m", kind="activation", dtype="float32", shape=(2,), fingerprint=fp))
            w.end_step()
        out.append(tmp_path / name)
    return out[0], out[1]


def test_an_internal_error_is_exit_3_one_line_and_a_log(tmp_path, monkeypatch, capsys):
    a, b = _two_traces(tmp_path)
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("REPROBISECT_DEBUG", raising=False)
    import reprobisect.core.compare

    def broken(*args, **kw):
        raise KeyError("an unexpected bug")

    monkeypatch.setattr(reprobisect.core.compare, "compare_paths", broken)
    assert main(["compare", str(a), str(b)]) == ExitCode.INTERNAL == 3
    line = _one_line(capsys.readouterr().err)
    assert "internal error in reprobisect (a bug" in line and "--debug" in line
    log = Path(line.split("traceback written to ")[1].split(";")[0])
    assert log.parent == tmp_path / "cache" / "logs"
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "an unexpected bug" in text and "bisect compare" in text
    # --debug (or REPROBISECT_DEBUG=1) prints the traceback as well; the status stays 3
    assert main(["--debug", "compare", str(a), str(b)]) == 3
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    monkeypatch.setenv("REPROBISECT_DEBUG", "1")
    assert main(["compare", str(a), str(b)]) == 3
    assert "KeyError: 'an unexpected bug'" in capsys.readouterr().err


def test_probe_internal_error_aborts_git_bisect(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path / "cache"))
    import reprobisect.workflows.repro

    def broken(*args, **kw):
        raise AttributeError("'NoneType' object has no attribute 'trace_dir'")

    monkeypatch.setattr(reprobisect.workflows.repro, "probe_checkout", broken)
    rc = main(["probe", "--check", "finite", "--", "python", "t.py"])
    assert rc == ExitCode.PROBE_INTERNAL and rc >= 128
    assert "internal error in reprobisect" in _one_line(capsys.readouterr().err)


def test_permission_error_on_a_user_path_is_exit_2(tmp_path, monkeypatch, capsys):
    import reprobisect.core.compare

    def denied(a, b, **kw):
        raise PermissionError(13, "Permission denied", str(a))

    monkeypatch.setattr(reprobisect.core.compare, "compare_paths", denied)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"cannot use '{tmp_path / 'a'}': Permission denied" in line


@pytest.mark.parametrize(
    "args",
    [
        ["probe", "--", "python", "t.py"],  # no --reference
        ["probe", "--check", "finite"],  # no command
        ["probe", "--check", "bogus", "--", "python", "t.py"],  # click's own usage error
        ["probe", "--no-such-flag", "--", "python", "t.py"],
        ["probe", "--timeout", "nan", "--check", "finite", "--", "python", "t.py"],
        ["probe", "--reference", "no/such/trace", "--", "python", "t.py"],
    ],
)
def test_probe_usage_errors_abort_git_bisect(tmp_path, args, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == ExitCode.PROBE_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


def _git_repo(repo: Path, files: list[str], commits: int = 2):
    repo.mkdir(exist_ok=True)
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()  # noqa: E731
    git("init", "-q")
    for i in range(commits):
        for f in files:
            p = repo / f
            p.write_text((p.read_text() if p.exists() else "") + f"# {i}\n")
        git("add", *files)
        git("commit", "-qm", f"c{i}")
    return git


def test_git_bisect_run_aborts_on_a_probe_usage_error(tmp_path):
    """Exit 2 would read as 'bad' and git would blame a commit; >= 128 makes it stop."""
    repo = tmp_path / "repo"
    git = _git_repo(repo, ["train.py"], commits=3)
    git("bisect", "start", "HEAD", "HEAD~2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(["git", "bisect", "run", PY, "-m", "reprobisect", "probe", "--", "python", "train.py"],
                       cwd=repo, capture_output=True, text=True, timeout=120, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "is the first bad commit" not in out
    assert "--reference" in out  # our one line reached the user
    log = git("bisect", "log")
    assert "# bad:" not in log.split("git bisect start")[-1].split("\n", 1)[-1]  # no commit was judged
    git("bisect", "reset")


def test_ordinary_commands_keep_2_for_usage_and_never_1(tmp_path, capsys):
    assert main(["repro", "--no-such-flag"]) == 2
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert main(["frobnicate"]) == 2
    capsys.readouterr()


# --------------------------------------------------------------------------- numeric options


@pytest.mark.parametrize(
    "args",
    [
        ["repro", "--timeout", "nan"],
        ["repro", "--timeout", "inf"],
        ["repro", "--timeout", "0"],
        ["repro", "--atol", "nan"],
        ["repro", "--rtol", "-1"],
        ["repro", "--steps", "0"],
        ["repro", "--jobs", "0"],
        ["repro", "--gpus-per-probe", "nan"],
        ["runs", "--good", "HEAD~1", "--bad", "HEAD", "--atol", "nan"],
        ["runs", "--good", "HEAD~1", "--bad", "HEAD", "--timeout", "nan"],
        ["seeds", "--timeout", "-inf"],
        ["envs", "--a", "X=1", "--b", "X=2", "--rtol", "nan"],
        ["capture", "-o", "t.trace", "--timeout", "nan"],
        ["capture", "-o", "t.trace", "--timeout", "inf"],
    ],
)
def test_non_finite_or_out_of_range_numbers_are_refused_before_any_probe(tmp_path, capsys, args, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = _hang(tmp_path)
    if args[0] == "runs":  # a real repository: before the fix, --atol nan was refused only after probing
        _git_repo(tmp_path, ["hang.py"])
    t0 = time.monotonic()
    rc = main([*args, *cmd])
    assert rc == 2 and time.monotonic() - t0 < 20
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()
    assert not (tmp_path / "t.trace").exists()


def test_compare_refuses_nan_tolerances(tmp_path, capsys):
    a, b = _two_traces(tmp_path)
    for flag in ("--atol", "--rtol"):
        assert main(["compare", str(a), str(b), flag, "nan"]) == 2
        assert "finite" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        ("timeout: .nan\n", "--timeout must be a finite number"),
        ("timeout: .inf\n", "--timeout must be a finite number"),
        ("atol: .nan\n", "--atol must be a finite number"),
        ("rtol: -0.5\n", "--rtol must be >= 0"),
        ("jobs: 0\n", "--jobs must be at least 1"),
        ("steps: 1.5\n", "'steps' has a bad value"),
        ("probe:\n  timeout: nan\n", "--timeout must be a finite number"),
    ],
)
def test_config_file_numbers_are_validated_up_front(tmp_path, capsys, text, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probe.yaml").write_text(text)
    t0 = time.monotonic()
    rc = main(["repro", "--config", "probe.yaml", *_hang(tmp_path)])
    assert rc == 2 and time.monotonic() - t0 < 20
    assert message in _one_line(capsys.readouterr().err)


# --------------------------------------------------------------------------- untrusted traces


EVIL = "from pathlib import Path\nPath('RAN').write_text('the trace command ran')\n"


def _foreign_traces(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """Two diverging traces whose command writes RAN, recorded by 'another user' (another key)."""
    (tmp_path / "evil.py").write_text(EVIL)
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path / "other-user-cache"))
    a, b = _two_traces(tmp_path, command=["evil.py"], environment={"python": {"executable": PY}},
                       recorder={"cwd": str(tmp_path)})
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path / "my-cache"))
    return a, b


def test_trust_is_an_hmac_of_what_a_rerun_executes(tmp_path, monkeypatch):
    from reprobisect.support.trust import is_trusted

    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path / "cache"))
    a, _ = _two_traces(tmp_path, command=["train.py"], recorder={"cwd": str(tmp_path)})
    assert is_trusted(read_trace(a))
    key = tmp_path / "cache" / "trust-key"
    assert key.stat().st_mode & 0o077 == 0  # private to the user
    raw = json.loads((a / "manifest.json").read_text())
    assert "trust" in raw["recorder"] and key.read_text() not in json.dumps(raw)  # the secret never leaves
    raw["command"] = ["evil.py"]  # editing what would run breaks the signature
    (a / "manifest.json").write_text(json.dumps(raw))
    assert not is_trusted(read_trace(a))
    (tmp_path / "mine").mkdir()
    mine, _ = _two_traces(tmp_path / "mine", command=["train.py"])
    assert is_trusted(read_trace(mine))
    monkeypatch.setenv("REPROBISECT_CACHE_DIR", str(tmp_path / "someone-else"))  # another user (or machine)
    assert not is_trusted(read_trace(mine))
    raw = json.loads((mine / "manifest.json").read_text())
    del raw["recorder"]["trust"]
    (mine / "manifest.json").write_text(json.dumps(raw))
    assert not is_trusted(read_trace(mine))


def test_zoom_refuses_an_untrusted_trace_without_a_terminal(tmp_path, monkeypatch):
    a, b = _foreign_traces(tmp_path, monkeypatch)
    p = _bisect("compare", "--zoom", str(a), str(b), cwd=tmp_path,
                env={"REPROBISECT_CACHE_DIR": str(tmp_path / "my-cache")})
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "was not recorded by this user on this machine" in line and "--trust-trace" in line
    assert "evil.py" in line  # says what it would have run
    assert not (tmp_path / "RAN").exists()
    assert p.stdout == ""  # as for every zoom error (tests/test_compare.py::test_cli_zoom)


def test_zoom_runs_an_untrusted_trace_with_trust_trace(tmp_path, monkeypatch):
    a, b = _foreign_traces(tmp_path, monkeypatch)
    p = _bisect("compare", "--zoom", "--trust-trace", str(a), str(b), cwd=tmp_path,
                env={"REPROBISECT_CACHE_DIR": str(tmp_path / "my-cache")}, timeout=120)
    assert (tmp_path / "RAN").exists(), p.stderr
    assert p.returncode == 2 and "did not record a trace" in p.stderr  # evil.py trains nothing


@pytest.mark.parametrize("answer, runs", [(b"n\n", False), (b"y\n", True)])
def test_zoom_asks_on_a_terminal(tmp_path, monkeypatch, answer, runs):
    a, b = _foreign_traces(tmp_path, monkeypatch)
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([PY, "-m", "reprobisect", "compare", "--zoom", str(a), str(b)], cwd=tmp_path,
                                stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "REPROBISECT_CACHE_DIR": str(tmp_path / "my-cache")})
        os.write(master, answer)
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(master)
        os.close(slave)
    err = err.decode()
    assert "run these commands?" in err and "evil.py" in err
    assert (tmp_path / "RAN").exists() is runs
    assert proc.returncode == 2


def test_probe_timeout_is_a_skip_not_bad_nor_abort(tmp_path):
    """Infrastructure (a timeout, retried once) is git bisect's 125: skip the commit."""
    _hang(tmp_path)
    p = _bisect("probe", "--check", "finite", "--timeout", "1", "--", "python", "hang.py", cwd=tmp_path)
    assert p.returncode == 125, p.stderr
    assert p.stdout.startswith("skip")
