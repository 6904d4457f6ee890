"""One probe: run the user's command under the launcher, classify how it ended, judge it.

``run_in_dir`` turns a ``ProbeSpec`` into a ``ProbeResult`` on this machine: it rewrites
the user's Python command into the launcher command (``launch_argv``), runs it in its own
process group (so a timeout kills DataLoader workers too) and reads the outcome the
launcher sealed in the trace's manifest. Whatever killed the probe from outside
(a timeout, a signal, a lost manifest) is ``timeout``/``infra``: never evidence about the
code. ``classify`` then turns a result into a ``Verdict`` (good / bad / skip) for one of
the predicates a search asks: ``match``, ``repro`` or ``finite``.

Both the local and the Ray executor call ``run_in_dir``; it imports no ML framework.

Commands that are supported: ``python train.py ...``, ``python3 -m pkg ...``,
``/path/to/python ...`` (with interpreter flags such as ``-u`` or ``-X dev``) and an
executable script whose ``#!`` line names Python. Anything else (a shell script that
wraps Python, ``torchrun``) is refused with one line saying so: its recorder cannot be
installed without changing the user's command.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reprobisect.errors import ProbeError, UsageError
from reprobisect.executors.base import Executor, ProbeResult, ProbeSpec
from reprobisect.core.outcome import LAUNCH_EXIT, Outcome

__all__ = [
    "CHECKS",
    "VERDICTS",
    "Verdict",
    "launch_argv",
    "run_in_dir",
    "classify",
    "run_with_retry",
    "retry_once",
    "compare_traces",
    "as_tolerance",
    "summarize",
    "kill_all_running",
    "set_owner",
    "TAIL_BYTES",
    "KILL_GRACE_S",
]

CHECKS = ("match", "repro", "finite")
VERDICTS = ("good", "bad", "skip")
TAIL_BYTES = 4096
"""How much of the end of stdout / stderr a result keeps."""
KILL_GRACE_S = 3.0
"""Seconds between SIGTERM and SIGKILL when a probe's process group is stopped."""

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
# interpreter options that take a separate value (python -X dev, -W ignore)
_PY_OPTS_WITH_VALUE = {"-X", "-W", "--check-hash-based-pycs"}

# process groups of probes running in this process -> owner token, for Ctrl-C (kill_all_running)
_LIVE: dict[int, object] = {}
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


def _split_interpreter(argv: list[str], cwd: Path | None) -> tuple[str | None, list[str], list[str]]:
    """(interpreter as given or None for a #! script, interpreter options, program + args)."""
    exe = argv[0]
    if _is_python(exe):
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
        return exe, opts, prog
    path = Path(exe) if os.path.isabs(exe) or cwd is None else cwd / exe
    if os.sep in exe and path.is_file() and _shebang_python(path):
        return None, [], [exe, *argv[1:]]
    raise UsageError(
        f"bisect probes Python commands ('python train.py ...', 'python -m pkg ...', '/path/to/python ...'); "
        f"'{exe}' is not one: give the python command it runs instead"
    )


def launch_argv(spec: ProbeSpec, trace_dir: Path, cwd: Path | None = None) -> list[str]:
    """The launcher command that records ``spec.argv`` into ``trace_dir``.

    The interpreter is ``spec.python`` when given, else the command's own interpreter;
    a bare ``python``/``python3``/``python3.X`` of the running version resolves to the
    interpreter running reprobisect (the one an activated virtual environment gives);
    another version by name or a path is kept as given. Raises ``UsageError`` for commands that
    are not Python (see the module docstring).
    """
    argv = list(spec.argv)
    if not argv:
        raise UsageError("give the training command after --, e.g. bisect repro -- python train.py")
    given, opts, prog = _split_interpreter(argv, cwd)
    ours = {"python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"}
    if spec.python:
        python = spec.python
    elif given is None or given in ours:
        python = sys.executable
    else:
        python = given  # a path, or another version by name (python3.10): that interpreter
    cmd = [python, *opts, "-m", "reprobisect.runners.launch", "--trace", str(trace_dir), "--steps", str(spec.steps)]
    if spec.full_steps:
        cmd += ["--full-steps", ",".join(str(s) for s in spec.full_steps)]
    if spec.state_steps:
        cmd += ["--state-steps", ",".join(str(s) for s in spec.state_steps)]
    if spec.stop_on_nonfinite:
        cmd.append("--stop-on-nonfinite")
    cmd += list(spec.extra_launch_args)
    cmd.append("--")
    cmd += prog
    return cmd


# --------------------------------------------------------------------------- running


def _kill_group(pgid: int, proc: subprocess.Popen | None, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the whole group, wait up to ``grace`` for the leader, then SIGKILL the group."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
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
    """SIGKILL whatever is left of a process group (stray DataLoader workers, children)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    import json

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


def run_in_dir(spec: ProbeSpec, workdir: Path, trace_dir: Path, *, echo: bool = False) -> ProbeResult:
    """Run one probe of ``spec`` in ``workdir/spec.subdir``, recording into ``trace_dir``.

    ``spec.env`` is added to this process's environment; the command runs in its own
    session (process group). Outcome: the one the launcher sealed in the trace manifest;
    ``timeout`` when ``spec.timeout`` passed (the whole group is killed: SIGTERM, then
    SIGKILL after ``KILL_GRACE_S``); ``infra`` when it was killed by a signal or left no
    sealed manifest; ``skip`` when the command or interpreter cannot be found or run.
    Raises ``UsageError`` only for a command that is not Python (nothing can run it).

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

    def result(outcome: Outcome, out: str = "", err: str = "", both: str = "") -> ProbeResult:
        outcome = _with(outcome, wall_s=round(time.monotonic() - t0, 3))
        if not outcome and spec.repo and spec.revision:
            outcome = _link_hint(outcome, spec, workdir, err)
        return ProbeResult(
            spec=spec,
            outcome=outcome,
            trace_dir=str(trace_dir) if (trace_dir / "manifest.json").is_file() else None,
            commit_ran=commit,
            host=os.uname().nodename,
            stdout_tail=out,
            stderr_tail=err,
            output_tail=both,
        )

    if not cwd.is_dir():
        return result(Outcome("skip", detail=f"folder '{spec.subdir}' does not exist at this revision"))
    cmd = launch_argv(spec, trace_dir, cwd)
    exe = cmd[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            return result(Outcome("skip", detail=f"interpreter '{exe}' not found or not executable"))
    elif shutil.which(exe) is None:
        return result(Outcome("skip", detail=f"command '{exe}' not found on PATH"))

    env = dict(os.environ)
    env.update(spec.env)
    trace_dir.parent.mkdir(parents=True, exist_ok=True)
    timed_out = False
    from reprobisect.support.outputlog import OUTPUT_LOG, BoundedOutput, echo_streams, pump

    log = BoundedOutput()
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError, OSError) as e:
        return result(Outcome("skip", detail=f"cannot start '{exe}': {e.strerror or e}"))
    pgid = proc.pid
    with _LIVE_LOCK:
        _LIVE[pgid] = getattr(_OWNER, "value", None)
    to_out, to_err = echo_streams() if echo else (None, None)
    readers, (out_ring, err_ring) = pump([(proc.stdout, to_out), (proc.stderr, to_err)], log, TAIL_BYTES)
    try:
        try:
            rc = proc.wait(timeout=spec.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(pgid, proc)
            rc = proc.wait()
        except BaseException:
            _kill_group(pgid, proc, grace=0.5)
            proc.wait()
            raise
        finally:
            _reap_group(pgid)  # stray children (DataLoader workers) die with the probe
    finally:
        with _LIVE_LOCK:
            _LIVE.pop(pgid, None)
        for t in readers:  # the group is dead: its pipes end (a daemon outside it may keep one open)
            t.join(timeout=2.0)
        if (trace_dir / "manifest.json").is_file():
            try:
                log.save(trace_dir / OUTPUT_LOG)
            except OSError:
                pass  # the output is a courtesy: never a reason to lose the probe
    out_t, err_t = out_ring.tail_text(TAIL_BYTES), err_ring.tail_text(TAIL_BYTES)
    both = log.tail_text(TAIL_BYTES)

    if timed_out:
        return result(
            Outcome("timeout", detail=f"no result after {spec.timeout:g} s; process group killed", returncode=rc),
            out_t,
            err_t,
            both,
        )
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return result(
            Outcome("infra", detail=f"killed by {name} (out of memory or stopped from outside)", returncode=rc),
            out_t,
            err_t,
            both,
        )
    sealed = _sealed_outcome(trace_dir)
    if sealed is not None:
        return result(_with(sealed, returncode=rc, trace=str(trace_dir) if sealed.status == "ok" else sealed.trace), out_t, err_t, both)
    if "No module named reprobisect" in err_t or "No module named 'reprobisect" in err_t:
        return result(
            Outcome("skip", detail=f"the interpreter '{exe}' cannot import reprobisect; install it there", returncode=rc),
            out_t,
            err_t,
            both,
        )
    status = _EXIT_OUTCOME.get(rc)
    if status in ("skip", "no_steps"):
        return result(Outcome(status, detail=_last_line(err_t), returncode=rc), out_t, err_t, both)
    return result(
        Outcome("infra", detail=f"the launcher exited {rc} without sealing a trace: {_last_line(err_t)}", returncode=rc),
        out_t,
        err_t,
        both,
    )


def _link_hint(outcome: Outcome, spec: ProbeSpec, workdir: Path, err: str) -> Outcome:
    """Say ``--link PATH`` when the probe failed on a file the user's checkout has and the
    worktree lacks (data git ignores, an untracked config); ``reprobisect.core.hints``."""
    from reprobisect.core.hints import missing_link_hint

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


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    """What a probe says about the predicate: good, bad or skip, and why."""

    verdict: str
    reason: str
    comparison: Any = None
    """The ``reprobisect.core.compare`` result when one was made."""
    check: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict '{self.verdict}' (one of {', '.join(VERDICTS)})")

    def __bool__(self) -> bool:
        return self.verdict == "good"

    def __str__(self) -> str:
        return f"{self.verdict}: {self.reason}"

    @property
    def exit_code(self) -> int:
        """git bisect run's convention: 0 good, 1 bad, 125 skip."""
        return {"good": 0, "bad": 1, "skip": 125}[self.verdict]

    def to_json(self) -> dict[str, Any]:
        comp = self.comparison
        if comp is not None and hasattr(comp, "to_json"):
            comp = comp.to_json()
        elif comp is not None:
            comp = str(comp)
        return {"verdict": self.verdict, "reason": self.reason, "check": self.check, "comparison": comp}


def _trace_path(x: Any) -> str | None:
    if x is None:
        return None
    if isinstance(x, ProbeResult):
        return x.trace_dir
    if hasattr(x, "path") and hasattr(x, "manifest"):
        return str(x.path)
    return str(x)


def as_tolerance(tolerance: Any) -> Any:
    """A ``reprobisect.core.compare.Tolerance`` from None (auto), 'bitwise', 'default',
    {'atol', 'rtol'} (explicit) or a ``Tolerance`` itself."""
    from reprobisect.core.compare import Tolerance

    if tolerance is None or isinstance(tolerance, Tolerance):
        return tolerance
    if isinstance(tolerance, str):
        return Tolerance(mode=tolerance)
    if isinstance(tolerance, dict):
        return Tolerance(mode="explicit", atol=tolerance.get("atol"), rtol=tolerance.get("rtol"))
    raise UsageError(f"tolerance {tolerance!r} is not 'bitwise', 'default' or atol/rtol")


def compare_traces(a: Any, b: Any, tolerance: Any = None) -> Any:
    """Compare two traces (paths, ``Trace`` objects or ``ProbeResult``s): a ``Comparison``.

    ``tolerance`` as ``as_tolerance`` takes it. Incomplete traces are read up to their
    last whole step (a probe stopped at its step limit is complete; one that crashed is
    compared as far as it got).
    """
    from reprobisect.core.compare import compare_paths

    pa, pb = _trace_path(a), _trace_path(b)
    if pa is None or pb is None:
        raise ProbeError("a probe left no trace to compare")
    return compare_paths(pa, pb, tolerance=as_tolerance(tolerance), allow_incomplete=True)


def _nonfinite_in(trace_dir: str) -> str | None:
    """Name the first record or scalar holding NaN/Inf in a sealed trace, or None."""
    import math

    from reprobisect.trace.reader import read_trace

    tr = read_trace(trace_dir, allow_incomplete=True)
    for st in tr.steps:
        for r in st.records:
            if (r.stat("nan") or 0) > 0 or (r.stat("inf") or 0) > 0:
                return f"{r.kind} '{r.name}' at step {st.step} holds NaN/Inf"
        for k, v in (st.scalars or {}).items():
            try:
                if isinstance(v, (int, float, str)) and not isinstance(v, bool) and not math.isfinite(float(v)):
                    return f"scalar '{k}' at step {st.step} is {v}"
            except ValueError:
                continue
    return None


_NOT_EVIDENCE = ("skip", "timeout", "infra", "no_steps")


def classify(result: ProbeResult, check: str, reference: Any = None, tolerance: Any = None) -> Verdict:
    """Judge one probe for ``check``.

    - ``finite``: good when the run stepped with no NaN/Inf in any record or scalar.
    - ``match``: good when the trace equals ``reference`` (a trace path, ``Trace`` or
      ``ProbeResult``) under ``tolerance``.
    - ``repro``: good when ``result`` and ``reference`` (a second result at the same
      commit) agree under ``tolerance``.

    Outcomes skip / timeout / infra / no_steps give ``skip`` (the caller retries timeout
    and infra once: ``run_with_retry``). ``crashed`` and ``nonfinite`` are ``bad`` for
    ``finite`` and ``match``: a crash is a behaviour change. For ``repro``, a crash on one
    side only is ``bad``; on both, ``skip`` (nothing to compare).
    """
    if check not in CHECKS:
        raise UsageError(f"unknown check '{check}'; use --check match, repro or finite")
    o = result.outcome
    if o.status in _NOT_EVIDENCE:
        return Verdict("skip", f"probe could not test: {o}", check=check)
    if check == "finite":
        if o.status in ("crashed", "nonfinite"):
            return Verdict("bad", str(o), check=check)
        where = _nonfinite_in(result.trace_dir) if result.trace_dir else None
        if where:
            return Verdict("bad", where, check=check)
        return Verdict("good", f"no NaN/Inf in {result.spec.steps} step(s)", check=check)
    if reference is None:
        need = "--reference TRACE" if check == "match" else "a second run at the same commit"
        raise UsageError(f"--check {check} needs {need}")
    if check == "match":
        if o.status in ("crashed", "nonfinite"):
            return Verdict("bad", f"{o} (the reference ran)", check=check)
        comp = compare_traces(reference, result, tolerance)
        return _from_comparison(comp, check, "matches the reference", "differs from the reference")
    # repro
    ro = reference.outcome if isinstance(reference, ProbeResult) else Outcome("ok")
    if ro.status in _NOT_EVIDENCE:
        return Verdict("skip", f"second run could not test: {ro}", check=check)
    if o.status != "ok" or ro.status != "ok":
        if o.status == ro.status:
            return Verdict("skip", f"both runs ended {o.status}; nothing to compare", check=check)
        return Verdict("bad", f"runs ended differently: {o} vs {ro}", check=check)
    comp = compare_traces(reference, result, tolerance)
    return _from_comparison(comp, check, "two runs agree", "two runs differ")


def _from_comparison(comp: Any, check: str, good: str, bad: str) -> Verdict:
    if bool(comp):
        return Verdict("good", good, comparison=comp, check=check)
    return Verdict("bad", f"{bad}: {summarize(comp)}", comparison=comp, check=check)


def summarize(comp: Any) -> str:
    """One line naming a comparison's first divergence (step, kind, tensor, module)."""
    d = getattr(comp, "first", None)
    if d is None:
        structure = getattr(comp, "structure", "")
        return structure or ("agree" if comp else "differ")
    mod = f" ({d.module})" if getattr(d, "module", None) else ""
    return f"first divergence at step {d.step}, {d.kind} '{d.name}'{mod}: {d.verdict}"


def run_with_retry(executor: Executor, spec: ProbeSpec, retries: int = 1) -> ProbeResult:
    """Run ``spec`` on ``executor``; re-run up to ``retries`` times on timeout / infra.

    Each retry has ``attempt`` + 1, so its trace never shares a folder with the failed one.
    The last result is returned (still timeout / infra if every attempt failed: ``skip``).
    """
    res = executor.submit(spec).result()
    n = 0
    while res.outcome.status in ("timeout", "infra") and n < retries:
        n += 1
        spec = replace(spec, attempt=spec.attempt + 1)
        res = executor.submit(spec).result()
    return res


def retry_once(executor: Executor, result: ProbeResult) -> ProbeResult:
    """``result`` itself, or a second attempt when it ended ``timeout`` / ``infra``.

    For callers that submitted several probes at once and retry the failed ones after.
    """
    if result.outcome.status not in ("timeout", "infra"):
        return result
    return executor.submit(replace(result.spec, attempt=result.spec.attempt + 1)).result()
