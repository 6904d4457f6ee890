"""Running one probe's child process on this machine: the launcher command, its process group, its end.

``run_in_dir`` turns a ``ProbeSpec`` into a ``ProbeResult``: it rewrites the user's
Python command into the launcher command (``launch_argv``), runs it in its own process
group (so a timeout kills DataLoader workers too) and reads the outcome the launcher
sealed in the trace's manifest. Whatever killed the probe from outside (a timeout, a
signal, a lost manifest) is ``timeout``/``infra``: never evidence about the code.

Both the local and the Ray executor (on its worker) call ``run_in_dir``; it imports no
ML framework.

Any command runs. A plain Python command (``python train.py ...``, ``python3 -m pkg ...``,
``/path/to/python ...`` with interpreter flags such as ``-u`` or ``-X dev``, an executable
script whose ``#!`` line names Python) is rewritten into the launcher command as it always
was (``python -m reprobisect.runners.launch ... -- train.py ...``). Anything else (``bash
train.sh``, ``./job.sh``, ``torchrun ...``, ``python -m torch.distributed.run ...``) runs as
given. Either way the probe gets a folder of its own (``reprobisect.runners.bootstrap``) first
on the command's ``PYTHONPATH``: its ``sitecustomize`` records every Python process the
command starts that steps an optimizer (the ranks torchrun or ``mp.spawn`` start write one
shard each under ``TRACE/ranks/``; a single training process under a job script writes the
flat trace). A command that is not rewritten also gets the folder of the interpreter
running reprobisect first on ``PATH`` (so its ``python``/``torchrun`` are that
environment's, as a bare ``python`` is on the rewritten path). Every process of the probe
carries its token (``bootstrap.ENV_PROBE``): a timeout, an interrupt or the end of the
command kills all of them, torchrun's ranks in their own sessions included
(``reprobisect.executors.anycommand``). What a command that runs as given still does
``CUT_GRACE_S`` after its recording ended (a job script's evaluation) is stopped and not
judged. ``python -c CODE`` is still refused (there is no script to re-run).

A probe of a commit in a checkout of its own (a worktree, a Ray worker's unpacked tree)
first gets that commit's DVC-tracked data from the user's DVC cache, linked, never copied
(``reprobisect.vcs.dvc``); data that cannot be had makes the probe ``skip`` with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from reprobisect.core.hints import missing_link_hint
from reprobisect.core.outcome import LAUNCH_EXIT, Outcome, Status
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.errors import UsageError
from reprobisect.executors import anycommand
from reprobisect.executors.ports import release, rendezvous_vars
from reprobisect.runners import bootstrap
from reprobisect.support.outputlog import OUTPUT_LOG, BoundedOutput, echo_streams, pump
from reprobisect.vcs import dvc

__all__ = ["launch_argv", "run_in_dir", "kill_all_running", "set_owner", "TAIL_BYTES", "KILL_GRACE_S"]

TAIL_BYTES = 4096
"""How much of the end of stdout / stderr a result keeps."""
KILL_GRACE_S = 3.0
"""Seconds between SIGTERM and SIGKILL when a probe's process group is stopped."""
CUT_GRACE_S = 5.0
"""Seconds a command that runs as given may go on after its recording ended (every rank, or
the process of the flat trace, stopped after ``--steps``) before the rest of it (a job
script's evaluation, a second training run) is stopped: it is not judged."""

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
# interpreter options that take a separate value (python -X dev, -W ignore)
_PY_OPTS_WITH_VALUE = {"-X", "-W", "--check-hash-based-pycs"}

# process groups of probes running in this process -> owner token, for Ctrl-C (kill_all_running)
_LIVE: dict[int, object] = {}
_TOKENS: dict[int, str] = {}  # process group -> the probe token its processes carry
_LIVE_LOCK = threading.Lock()
_OWNER = threading.local()


# --------------------------------------------------------------------------- argv


def _is_python(exe: str) -> bool:
    return bool(_PYTHON_NAME.match(os.path.basename(exe)))


def _shebang_python(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _interpreter_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """(interpreter options, program + args) of ``python [options] prog ...``."""
    rest = argv[1:]
    opts: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "-m" or not a.startswith("-") or a == "-":
            break
        if a == "-c" or a.startswith("-c"):
            raise UsageError(
                "bisect cannot probe 'python -c CODE'; put the code in a script and give 'python script.py'"
            )
        if a in _PY_OPTS_WITH_VALUE:
            opts += rest[i : i + 2]
            i += 2
            continue
        opts.append(a)
        i += 1
    prog = rest[i:]
    if not prog:
        raise UsageError(f"'{' '.join(argv)}' runs no script; give 'python train.py ...' or 'python -m pkg ...'")
    return opts, prog


def _split_interpreter(argv: list[str], cwd: Path | None) -> tuple[str | None, list[str], list[str]]:
    """(interpreter as given or None for a #! script, interpreter options, program + args)."""
    exe = argv[0]
    if _is_python(exe):
        opts, prog = _interpreter_options(argv)
        return exe, opts, prog
    path = Path(exe) if os.path.isabs(exe) or cwd is None else cwd / exe
    if os.sep in exe and path.is_file() and _shebang_python(path):
        return None, [], [exe, *argv[1:]]
    raise UsageError(
        f"bisect probes Python commands ('python train.py ...', 'python -m pkg ...', '/path/to/python ...'); "
        f"'{exe}' is not one: give the python command it runs instead"
    )


def is_rewritten(argv: list[str], cwd: Path | None = None) -> bool:
    """Whether ``argv`` is a plain Python command the launcher runs in-process (``python
    train.py``, ``python -m pkg``, a ``#!`` Python script); not torchrun's agent
    (``python -m torch.distributed.run``, the ``torchrun`` script), which runs as given.
    ``UsageError`` for ``python -c`` or a ``python`` without a program, as always."""
    if _is_python(argv[0]):
        _, prog = _interpreter_options(argv)
        if prog[0] == "-m":
            return not (len(prog) > 1 and prog[1] in bootstrap.LAUNCHER_MODULES)
        return os.path.basename(prog[0]) not in bootstrap.LAUNCHER_SCRIPTS
    exe = argv[0]
    path = Path(exe) if os.path.isabs(exe) or cwd is None else cwd / exe
    return (os.sep in exe and path.is_file() and _shebang_python(path)
            and os.path.basename(exe) not in bootstrap.LAUNCHER_SCRIPTS)


def _python_for(spec: ProbeSpec, given: str | None) -> str:
    """``spec.python``, else the command's interpreter: a bare ``python``/``python3``/``python3.X``
    of the running version (or a ``#!`` script: ``given`` None) is the one running reprobisect."""
    ours = {"python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"}
    if spec.python:
        return spec.python
    if given is None or given in ours:
        return sys.executable
    return given  # a path, or another version by name (python3.10): that interpreter


def launch_argv(spec: ProbeSpec, trace_dir: Path, cwd: Path | None = None) -> list[str]:
    """The command that records ``spec.argv`` into ``trace_dir``.

    A plain Python command (``is_rewritten``) becomes the launcher command: the interpreter
    is ``spec.python`` when given, else the command's own interpreter; a bare
    ``python``/``python3``/``python3.X`` of the running version resolves to the interpreter
    running reprobisect (the one an activated virtual environment gives); another version by
    name or a path is kept as given. Any other command is returned as given (the bootstrap
    records it; a bare ``python -m torch.distributed.run`` gets the same interpreter).
    """
    argv = list(spec.argv)
    if not argv:
        raise UsageError("give the training command after --, e.g. bisect repro -- python train.py")
    if not is_rewritten(argv, cwd):
        return [_python_for(spec, argv[0]), *argv[1:]] if _is_python(argv[0]) else argv
    given, opts, prog = _split_interpreter(argv, cwd)
    python = _python_for(spec, given)
    return [python, *opts, "-m", "reprobisect.runners.launch", *launch_options(spec, trace_dir), "--", *prog]


def launch_options(spec: ProbeSpec, trace_dir: Path) -> list[str]:
    """The launcher's options for ``spec`` (what goes between ``launch`` and ``--``)."""
    cmd = ["--trace", str(trace_dir), "--steps", str(spec.steps)]
    if spec.full_steps:
        cmd += ["--full-steps", ",".join(str(s) for s in spec.full_steps)]
    if spec.state_steps:
        cmd += ["--state-steps", ",".join(str(s) for s in spec.state_steps)]
    if spec.stop_on_nonfinite:
        cmd.append("--stop-on-nonfinite")
    if spec.detail != "full":
        cmd += ["--detail", spec.detail]
    if spec.state_every is not None:
        cmd += ["--state-every", str(spec.state_every)]
    cmd += list(spec.extra_launch_args)
    return cmd


# --------------------------------------------------------------------------- process groups


def _kill_group(pgid: int, proc: subprocess.Popen | None, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the whole group and every process carrying the probe's token (torchrun's
    ranks run in sessions of their own), wait up to ``grace`` for the leader, then SIGKILL
    all of them."""
    token = _TOKENS.get(pgid)
    anycommand.signal_tree(token, signal.SIGTERM)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        _reap_group(pgid)
        return
    if proc is not None:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    else:
        time.sleep(min(grace, 0.2))
    _reap_group(pgid)


def _reap_group(pgid: int) -> None:
    """SIGKILL whatever is left of a process group (stray DataLoader workers, children) and
    of the probe's processes outside it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    anycommand.kill_tree(_TOKENS.get(pgid))


def set_owner(owner: object | None) -> None:
    """Tag the probes this thread starts from now on with ``owner`` (see ``kill_all_running``)."""
    _OWNER.value = owner


def kill_all_running(owner: object | None = None) -> int:
    """Kill the process group of every probe running in this process (Ctrl-C), or only of
    those started under ``set_owner(owner)``; returns how many."""
    with _LIVE_LOCK:
        groups = [g for g, o in _LIVE.items() if owner is None or o is owner]
    for g in groups:
        _kill_group(g, None, grace=0.5)
    return len(groups)


# --------------------------------------------------------------------------- one run


@dataclass
class _Ended:
    """How the child process ended and what it printed."""

    returncode: int
    timed_out: bool
    out: str
    err: str
    both: str
    log: BoundedOutput | None = None
    cut: bool = False
    """The rest of a command that runs as given was stopped after its recording ended."""


def _commit_of(workdir: Path) -> str | None:
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    try:
        r = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, timeout=30, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def _sealed_outcome(trace_dir: Path) -> Outcome | None:
    try:
        raw = json.loads((trace_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("status") == "incomplete" or not isinstance(raw.get("outcome"), dict):
        return None
    try:
        return Outcome.from_json(raw["outcome"])
    except (TypeError, ValueError):
        return None


_EXIT_OUTCOME = {v: k for k, v in LAUNCH_EXIT.items()}


def _with(o: Outcome, **changes: Any) -> Outcome:
    d = o.to_json()
    d.update({k: v for k, v in changes.items() if d.get(k) is None or k in ("returncode", "wall_s")})
    return Outcome(**d)


def _unrunnable(spec: ProbeSpec, cwd: Path, cmd: list[str]) -> Outcome | None:
    """A ``skip`` outcome when the folder or the interpreter is not there; None when it can run."""
    if not cwd.is_dir():
        return Outcome(Status.SKIP, detail=f"folder '{spec.subdir}' does not exist at this revision")
    exe = cmd[0]
    if os.sep in exe and not os.path.isabs(exe) and not is_rewritten(list(spec.argv), cwd):
        exe = str(cwd / exe)  # ./job.sh: the command's folder, where it runs
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            return Outcome(Status.SKIP, detail=f"interpreter '{exe}' not found or not executable")
    elif shutil.which(exe, path=_search_path(spec, cmd)) is None:
        return Outcome(Status.SKIP, detail=f"command '{exe}' not found on PATH")
    return None


def _search_path(spec: ProbeSpec, cmd: list[str]) -> str | None:
    """The PATH the command will search: a command that runs as given finds reprobisect's
    interpreter's folder first (``_probe_env``)."""
    path = {**os.environ, **spec.env}.get("PATH")
    if cmd and cmd[0] == spec.argv[0] and not _is_python(cmd[0]):
        bindir = os.path.dirname(os.path.abspath(spec.python or sys.executable))
        return bindir + (os.pathsep + path if path else "")
    return path


def _wait(proc: subprocess.Popen, timeout: float | None,
          recorded: Callable[[], bool] | None = None) -> tuple[int, bool, bool]:
    """(return code, timed out, cut): the whole group is killed on a timeout or an interrupt,
    and ``CUT_GRACE_S`` after ``recorded()`` turned true (cut: the rest of the command)."""
    pgid = proc.pid
    try:
        try:
            rc, cut = _wait_recorded(proc, timeout, recorded)
            return rc, False, cut
        except subprocess.TimeoutExpired:
            _kill_group(pgid, proc)
            return proc.wait(), True, False
        except BaseException:
            _kill_group(pgid, proc, grace=0.5)
            proc.wait()
            raise
    finally:
        _reap_group(pgid)  # stray children (DataLoader workers) die with the probe


def _wait_recorded(proc: subprocess.Popen, timeout: float | None,
                   recorded: Callable[[], bool] | None) -> tuple[int, bool]:
    """Wait for ``proc`` (``TimeoutExpired`` past ``timeout``); with ``recorded``, stop the
    rest of the command once the recording ended and it ran on ``CUT_GRACE_S`` more."""
    if recorded is None:
        return proc.wait(timeout=timeout), False
    deadline = None if timeout is None else time.monotonic() + timeout
    since: float | None = None
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0)
        try:
            return proc.wait(timeout=0.25 if deadline is None else min(0.25, deadline - now)), False
        except subprocess.TimeoutExpired:
            pass
        if since is None and recorded():
            since = time.monotonic()
        if since is not None and time.monotonic() - since >= CUT_GRACE_S:
            _kill_group(proc.pid, proc, grace=1.0)
            return proc.wait(), True


def _run_child(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float | None, trace_dir: Path,
               echo: bool, recorded: Callable[[], bool] | None = None) -> _Ended | Outcome:
    """Run ``cmd`` in its own process group, keeping (and maybe echoing) its output; an
    ``Outcome`` (skip) when it cannot even start. ``env`` carries the probe's token
    (``bootstrap.ENV_PROBE``): every process holding it dies with the probe."""
    log = BoundedOutput()
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError, OSError) as e:
        return Outcome(Status.SKIP, detail=f"cannot start '{cmd[0]}': {e.strerror or e}")
    with _LIVE_LOCK:
        _LIVE[proc.pid] = getattr(_OWNER, "value", None)
        if env.get(bootstrap.ENV_PROBE):
            _TOKENS[proc.pid] = env[bootstrap.ENV_PROBE]
    to_out, to_err = echo_streams() if echo else (None, None)
    readers, (out_ring, err_ring) = pump([(proc.stdout, to_out), (proc.stderr, to_err)], log, TAIL_BYTES)
    try:
        rc, timed_out, cut = _wait(proc, timeout, recorded)
    finally:
        with _LIVE_LOCK:
            _LIVE.pop(proc.pid, None)
            _TOKENS.pop(proc.pid, None)
        for t in readers:  # the group is dead: its pipes end (a daemon outside it may keep one open)
            t.join(timeout=2.0)
    return _Ended(rc, timed_out, out_ring.tail_text(TAIL_BYTES), err_ring.tail_text(TAIL_BYTES),
                  log.tail_text(TAIL_BYTES), log, cut)


def _save_log(end: _Ended, trace_dir: Path) -> None:
    if end.log is not None and (trace_dir / "manifest.json").is_file():
        try:
            end.log.save(trace_dir / OUTPUT_LOG)
        except OSError:
            pass  # the output is a courtesy: never a reason to lose the probe


SELF_INFLICTED = {
    signal.SIGABRT: "aborted itself (SIGABRT: abort(), a failed C/C++ assert or a fatal library error)",
    signal.SIGSEGV: "crashed itself (SIGSEGV: an invalid memory access)",
    signal.SIGBUS: "crashed itself (SIGBUS: an invalid memory access)",
    signal.SIGFPE: "crashed itself (SIGFPE: an arithmetic fault, e.g. an integer division by zero)",
    signal.SIGILL: "crashed itself (SIGILL: an illegal instruction)",
}
"""Signals a program raises on itself, and what each says. Dying by one is the program's
own crash, evidence about the code (``crashed``, bad for ``finite``/``match``), not
``infra``: an outside kill is SIGKILL (the OOM killer, a person, our timeout's second
blow) or SIGTERM/SIGINT/SIGHUP, which stay ``infra`` (retried, then skipped)."""


def _recorded_steps(trace_dir: Path | None) -> int | None:
    """How many steps a trace the launcher never sealed holds (complete ``steps.jsonl``
    lines): the step a program that died by a signal was in, as a crash names it; None
    when there is no such file."""
    if trace_dir is None:
        return None
    try:
        with open(trace_dir / "steps.jsonl", "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return None


def _killed(spec: ProbeSpec, end: _Ended, rc: int, how: str, trace_dir: Path | None = None) -> Outcome | None:
    """The outcome of a probe ended by its timeout or a signal, else None. An outside end
    (timeout, SIGKILL, SIGTERM) is never evidence about the code; a signal the program
    raised on itself (``SELF_INFLICTED``: abort(), a segfault) is its crash, at the step
    its unsealed trace reached."""
    if end.timed_out:
        return Outcome(Status.TIMEOUT, detail=f"no result after {spec.timeout:g} s; {how}", returncode=rc)
    if rc < 0:
        try:
            sig: signal.Signals | None = signal.Signals(-rc)
        except ValueError:
            sig = None
        if sig in SELF_INFLICTED:
            return Outcome(Status.CRASHED, detail=f"the program {SELF_INFLICTED[sig]}", returncode=rc,
                           step=_recorded_steps(trace_dir))
        name = sig.name if sig is not None else f"signal {-rc}"
        return Outcome(Status.INFRA, detail=f"killed by {name} (out of memory or stopped from outside)", returncode=rc)
    return None


def _judge_end(spec: ProbeSpec, exe: str, trace_dir: Path, end: _Ended, boot: Path | None = None) -> Outcome:
    """The outcome of a process that ran: timeout, signal, the sealed one, or the launcher's exit code."""
    rc, err = end.returncode, end.err
    killed = _killed(spec, end, rc, "process group killed", trace_dir)
    if killed is not None:
        return killed
    shards = anycommand.read_shards(trace_dir)
    if shards:  # ranks the program started (mp.spawn): they are the trace, the launcher's own is empty
        parent = _sealed_outcome(trace_dir)
        quiet = parent is not None and parent.status in (Status.OK, Status.NO_STEPS)
        said = "\n".join([err, *(x or "" for x in ((parent.detail, parent.traceback) if parent else ()))])
        return _with(anycommand.judge_ranks(shards, 0 if quiet else rc, said,
                                                bootstrap.crash_times(boot) if boot else None), trace=str(trace_dir))
    sealed = _sealed_outcome(trace_dir)
    if sealed is not None and sealed.status is Status.NO_STEPS and boot is not None and bootstrap.unrecorded(boot):
        child = bootstrap.unrecorded(boot)[0]
        return _with(replace(sealed, detail=(
            f"{sealed.detail}; a process it started trained instead ({' '.join(map(str, child.get('argv') or []))}, "
            "not recorded: the trace is the launched script's); give that process's command")), returncode=rc)
    if sealed is not None:
        return _with(sealed, returncode=rc, trace=str(trace_dir) if sealed.status is Status.OK else sealed.trace)
    if "No module named reprobisect" in err or "No module named 'reprobisect" in err:
        return Outcome(Status.SKIP, detail=f"the interpreter '{exe}' cannot import reprobisect; install it there",
                       returncode=rc)
    status = _EXIT_OUTCOME.get(rc)
    if status in (Status.SKIP, Status.NO_STEPS):
        return Outcome(status, detail=_last_line(err), returncode=rc)
    return Outcome(Status.INFRA, detail=f"the launcher exited {rc} without sealing a trace: {_last_line(err)}",
                   returncode=rc)


def _judge_wrapped(spec: ProbeSpec, trace_dir: Path, end: _Ended, boot: Path) -> Outcome:
    """The outcome of a command that ran as given: timeout, signal, then the shards of its
    ranks, the flat trace its training process wrote, or its exit status."""
    rc, err = (0 if end.cut else end.returncode), end.err
    killed = _killed(spec, end, rc, "every process of the probe killed", trace_dir)
    if killed is not None:
        return killed
    shards = anycommand.read_shards(trace_dir)
    if shards:
        return _with(anycommand.judge_ranks(shards, rc, err, bootstrap.crash_times(boot)), trace=str(trace_dir))
    sealed = _sealed_outcome(trace_dir)
    out = anycommand.judge_flat(sealed, rc, err, bootstrap.unrecorded(boot))
    return _with(out, trace=str(trace_dir)) if sealed is not None and sealed.status is Status.OK else out


def _probe_env(spec: ProbeSpec, cmd: list[str], trace_dir: Path, cwd: Path, boot: Path, wrapped: bool,
               ports: dict[str, str]) -> dict[str, str]:
    """The command's environment: this process's, ``spec.env``, a rendezvous port of its own
    (``ports``: ``ports.rendezvous_vars``), the bootstrap folder first on PYTHONPATH; a command that runs as given also finds reprobisect's interpreter first on PATH."""
    from reprobisect.runners.registry import recorders

    env = {**os.environ, **spec.env, **ports}
    triggers = [t for e in recorders() for t in e.triggers]
    env.update(bootstrap.prepare(boot, trace_dir=trace_dir, launch_args=launch_options(spec, trace_dir),
                                 command=list(spec.argv), triggers=triggers, cwd=cwd,
                                 pythonpath=env.get("PYTHONPATH") or None))
    if wrapped:
        bindir = os.path.dirname(os.path.abspath(spec.python or sys.executable))
        env["PATH"] = bindir + (os.pathsep + env["PATH"] if env.get("PATH") else "")
    return env


def _run_probe(spec: ProbeSpec, cmd: list[str], cwd: Path, trace_dir: Path, echo: bool) -> tuple[Outcome, _Ended | None]:
    """Run the probe's command with its bootstrap folder (removed afterwards) and judge its end."""
    wrapped = not is_rewritten(list(spec.argv), cwd)
    trace_dir.parent.mkdir(parents=True, exist_ok=True)
    if wrapped:
        refused = anycommand.clear_trace(trace_dir)
        if refused:
            return Outcome(Status.INFRA, detail=f"{refused}; choose another output path"), None
    # beside the trace (hidden), so it goes with the probe's traces folder if this process is killed
    boot = Path(tempfile.mkdtemp(prefix=f".{trace_dir.name}.boot-", dir=trace_dir.parent))
    ports = rendezvous_vars({**os.environ, **spec.env})  # a free port per probe unless the user set one
    try:
        env = _probe_env(spec, cmd, trace_dir, cwd, boot, wrapped, ports)
        recorded = (lambda: bootstrap.recording_ended(boot)) if wrapped else None
        end = _run_child(cmd, cwd, env, spec.timeout, trace_dir, echo, recorded)
        if isinstance(end, Outcome):
            return end, None
        if wrapped:
            judged = _judge_wrapped(spec, trace_dir, end, boot)
            if end.cut:
                judged = replace(judged, detail=f"{judged.detail}; the rest of the command was stopped "
                                                f"{CUT_GRACE_S:g} s after the recording ended")
        else:
            judged = _judge_end(spec, cmd[0], trace_dir, end, boot)
        if anycommand.read_shards(trace_dir):
            anycommand.assemble(trace_dir, command=list(spec.argv), outcome=judged)
        _save_log(end, trace_dir)
        return judged, end
    finally:
        shutil.rmtree(boot, ignore_errors=True)
        release(ports)


def run_in_dir(spec: ProbeSpec, workdir: Path, trace_dir: Path, *, echo: bool = False) -> ProbeResult:
    """Run one probe of ``spec`` in ``workdir/spec.subdir``, recording into ``trace_dir``.

    ``spec.env`` is added to this process's environment; the command runs in its own
    session (process group). Outcome: the one the launcher sealed in the trace manifest;
    ``timeout`` when ``spec.timeout`` passed (the whole group is killed: SIGTERM, then
    SIGKILL after ``KILL_GRACE_S``); ``crashed`` when it died by a signal it raised on
    itself (``SELF_INFLICTED``: abort(), a segfault); ``infra`` when it was killed from
    outside (SIGKILL, SIGTERM) or left no sealed manifest; ``skip`` when the command or interpreter cannot be found or run.
    Raises ``UsageError`` only for ``python -c`` or a ``python`` without a program.
    Ranks (torchrun's, ``mp.spawn``'s) leave one shard each under ``trace_dir/ranks/`` and
    the top manifest is assembled once the command ended (``anycommand.assemble``).

    The command's stdout and stderr are kept, bounded (``reprobisect.support.outputlog``), as
    ``output.log`` in ``trace_dir`` once it ended (when the launcher made the trace
    folder); ``echo`` also streams them live to this process's stdout/stderr (``bisect
    capture``). The result's ``output_tail`` holds the last lines of both, interleaved.
    """
    workdir = Path(workdir)
    trace_dir = Path(trace_dir)
    cwd = (workdir / spec.subdir).resolve()
    t0 = time.monotonic()
    commit = _commit_of(workdir)
    end: _Ended | Outcome | None = None
    cmd = launch_argv(spec, trace_dir, cwd) if cwd.is_dir() else []
    outcome = _unrunnable(spec, cwd, cmd)
    run_spec = spec
    if outcome is None:  # DVC-tracked data of the probe's own commit, from the user's cache (or skip)
        outcome, run_spec = _restore_data(spec, workdir)
    if outcome is None:
        outcome, end = _run_probe(run_spec, cmd, cwd, trace_dir, echo)
    ended = end if isinstance(end, _Ended) else _Ended(0, False, "", "", "")
    outcome = _with(outcome, wall_s=round(time.monotonic() - t0, 3))
    if not outcome and spec.repo and spec.revision:
        outcome = _link_hint(outcome, spec, workdir, ended.err)
    return ProbeResult(
        spec=spec,
        outcome=outcome,
        trace_dir=str(trace_dir) if (trace_dir / "manifest.json").is_file() else None,
        commit_ran=commit,
        host=os.uname().nodename,
        stdout_tail=ended.out,
        stderr_tail=ended.err,
        output_tail=ended.both,
    )


def _restore_data(spec: ProbeSpec, workdir: Path) -> tuple[Outcome | None, ProbeSpec]:
    """Make the DVC-tracked data of a commit's checkout appear in it (``reprobisect.vcs.dvc``):
    (a ``skip`` outcome when it could not, else None; the spec to run, whose environment says
    how the data came, ``REPROBISECT_PROBE_DATA``: recorded as information)."""
    if not (spec.repo and spec.revision and dvc.enabled(spec.env)) or workdir.resolve() == Path(spec.repo).resolve():
        return None, spec  # the user's own checkout is never touched
    got = dvc.dvc_pull_at(workdir, spec.repo, subdir=spec.subdir, links=spec.links, track=_track)
    if not got:
        return Outcome(Status.SKIP, detail=got.detail), spec
    if got.status == "none":
        return None, spec
    said = f"dvc {got.status} {len(got.outs)} output(s) ({got.link or 'linked'}) in {got.wall_s:.1f} s"
    return None, replace(spec, env={**spec.env, "REPROBISECT_PROBE_DATA": said})


def _track(pid: int, running: bool) -> None:
    """A helper process of the probe (DVC) in its own group: killed with the probes (``kill_all_running``)."""
    with _LIVE_LOCK:
        if running:
            _LIVE[pid] = getattr(_OWNER, "value", None)
        else:
            _LIVE.pop(pid, None)


def _link_hint(outcome: Outcome, spec: ProbeSpec, workdir: Path, err: str) -> Outcome:
    """Say ``--link PATH`` when the probe failed on a file the user's checkout has and the
    worktree lacks (data git ignores, an untracked config); ``reprobisect.core.hints``."""
    try:
        hint = missing_link_hint("\n".join(x for x in (outcome.detail, outcome.traceback or "", err) if x),
                                 workdir, str(spec.repo), spec.subdir)
    except (OSError, ValueError):
        return outcome
    if not hint:
        return outcome
    detail = outcome.detail if len(outcome.detail) <= 160 else outcome.detail[:159] + "…"
    return replace(outcome, detail=f"{detail}; {hint}" if detail else hint)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""
