"""Record a few steps of a user's unmodified training command into a trace.

``bisect capture -o run.trace --steps 3 -- python train.py --lr 1e-3`` comes here. The
command is rewritten to run under the launcher (``python -m reprobisect.runners.launch
--trace DIR ... -- train.py --lr 1e-3``: ``python``/``python3`` become the interpreter
running reprobisect, an explicit path to a Python stays that Python, interpreter options
are kept) and run as a probe through an executor, like every probe (the local one by
default; ``--executor ray`` runs it on the cluster and fetches the trace into ``-o``):
its own process group, a timeout that kills the whole group, the outcome the launcher
sealed into the trace's manifest. On the local executor the command's output streams
live to the terminal; an executor that runs it elsewhere shows it when the probe ended.
"""

from __future__ import annotations

import errno
import os
import sys
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from reprobisect.core.checks import check_number
from reprobisect.core.outcome import Outcome, Status, disk_full, disk_full_detail, no_space_code
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.errors import UsageError
from reprobisect.executors.base import Executor
from reprobisect.executors.local import LocalExecutor
from reprobisect.executors.process import launch_argv
from reprobisect.support.outputlog import OUTPUT_LOG
from reprobisect.trace.format import DETAILS
from reprobisect.trace.outdir import check_trace_target

__all__ = ["CaptureConfig", "CaptureResult", "capture", "launch_command", "EXIT_CODES", "OUTCOME_BY_PARENT",
           "display_path", "outcome_lines", "user_traceback"]

OUTCOME_BY_PARENT = "REPROBISECT_OUTCOME_BY_PARENT"
"""Set (to ``1``) in a capture's environment: the launcher then does not print its outcome line,
because ``bisect capture`` prints the outcome once itself (and writes it, with the whole
traceback, into the trace's ``output.log``)."""

# exit status of `bisect capture` per outcome (2 is bad input, raised as UsageError): 1 only
# for what the command itself did; a timeout or a kill from outside could not test it (125)
EXIT_CODES = {Status.OK: 0, Status.SKIP: 125, Status.CRASHED: 1, Status.NONFINITE: 1, Status.NO_STEPS: 1,
              Status.TIMEOUT: 125, Status.INFRA: 125}


@dataclass(frozen=True, kw_only=True)
class CaptureConfig:
    """What to record of the command, and how long to wait for it."""

    steps: int = 3
    """Optimizer steps to record before the run is ended."""
    full_steps: tuple[int, ...] = ()
    """Steps whose full tensors are kept in the trace."""
    state_steps: tuple[int, ...] = ()
    """Steps after which complete state (model, optimizer, RNG, data order) is captured."""
    seed: str | int | None = None
    """The seed the command uses, recorded in the manifest (the command seeds itself)."""
    timeout: float | None = None
    """Seconds before the command's whole process group is killed (outcome ``timeout``)."""
    stop_on_nonfinite: bool = False
    """End the run at the first NaN/Inf (outcome ``nonfinite``)."""
    max_disk: int | None = None
    """Bound in bytes for the trace's full tensors and state."""
    max_records_per_step: int | None = None
    """Bound on a step's forward records (None: the recorder's default); past it they are counted, not recorded."""
    python: str | None = None
    """Interpreter to run instead of the command's own ``python``."""
    env: Mapping[str, str] | None = None
    """Extra environment variables for the command."""
    quiet: bool = False
    """Do not stream the command's output to the terminal (it is kept in ``output.log`` either way)."""
    detail: str = "full"
    """What each step records: ``full`` (the whole chain) or ``sentinel`` (batch, loss, gradient
    norm, learning rates, scale, parameters after the step; ``reprobisect.trace.format``)."""
    state_every: int | None = None
    """Complete state after every K-th step (None: 50 with ``sentinel``, else only ``state_steps``)."""
    doctor: tuple[str, ...] = ()
    """``bisect doctor``'s recorder switches: ``overfit``, ``memory`` (``runners.policy.RecordPolicy``)."""

    def __post_init__(self) -> None:
        # NaN compares False with everything: 'timeout <= 0' alone would take --timeout nan as no limit
        check_number("--steps", self.steps, minimum=1, integer=True)
        if self.timeout is not None:
            check_number("--timeout", self.timeout, minimum=0, open_min=True, unit=" seconds")
        if self.max_disk is not None:
            check_number("--max-disk", self.max_disk, minimum=1, integer=True, unit=" bytes")
        if self.max_records_per_step is not None:
            check_number("--max-records-per-step", self.max_records_per_step, minimum=1, integer=True)
        if self.detail not in DETAILS:
            raise UsageError(f"--detail takes {' or '.join(DETAILS)} (got {self.detail!r})")
        if self.state_every is not None:
            check_number("--state-every", self.state_every, minimum=1, integer=True)

    def spec(self, argv: Sequence[str], workdir: Path, trace: Path | None = None) -> ProbeSpec:
        """The probe that records ``argv`` run in ``workdir`` into ``trace``."""
        extra: list[str] = []
        if self.seed is not None:
            extra += ["--seed", str(self.seed)]
        if self.max_disk is not None:
            extra += ["--max-disk", str(self.max_disk)]
        if self.max_records_per_step is not None:
            extra += ["--max-records-per-step", str(self.max_records_per_step)]
        extra += [f"--{k}" for k in self.doctor]
        return ProbeSpec(
            key="capture",
            argv=tuple(argv),
            workdir=str(workdir),
            env=dict(self.env or {}),
            python=self.python,
            steps=self.steps,
            full_steps=tuple(self.full_steps),
            state_steps=tuple(self.state_steps),
            stop_on_nonfinite=self.stop_on_nonfinite,
            detail=self.detail,
            state_every=self.state_every,
            timeout=self.timeout,
            extra_launch_args=tuple(extra),
            trace_dir=str(trace) if trace is not None else None,
            echo=not self.quiet,
        )


@dataclass(frozen=True)
class CaptureResult:
    """How the capture ended and where its trace is; truthy when the trace is complete."""

    outcome: Outcome
    trace: str
    command: tuple[str, ...]
    stdout_tail: str = ""
    stderr_tail: str = ""
    output_tail: str = ""

    @property
    def output_log(self) -> str | None:
        """The command's output (bounded) in the trace folder, when it was kept."""
        p = Path(self.trace) / OUTPUT_LOG
        return str(p) if p.is_file() else None

    def __bool__(self) -> bool:
        return bool(self.outcome)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.outcome.status, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.to_json(),
            "trace": self.trace,
            "command": list(self.command),
            "exit_code": self.exit_code,
            "output_log": self.output_log,
        }


def launch_command(argv: Sequence[str], trace: str | os.PathLike, config: CaptureConfig | None = None,
                   cwd: str | os.PathLike | None = None) -> list[str]:
    """The launcher command line that records ``argv`` into ``trace`` (nothing runs)."""
    config = config or CaptureConfig()
    if not argv:
        raise UsageError("give the training command after --, e.g. bisect capture -o run.trace -- python train.py")
    workdir = Path(cwd or os.getcwd())
    return launch_argv(config.spec(argv, workdir), Path(trace), workdir)


def capture(argv: Sequence[str], out: str | os.PathLike, config: CaptureConfig | None = None,
            cwd: str | os.PathLike | None = None, executor: Executor | None = None) -> CaptureResult:
    """Run ``argv`` (``python train.py ...``) in ``cwd`` under the launcher, recording into ``out``.

    The probe runs on ``executor`` (default: a local one, made and closed here). Raises
    ``UsageError`` for a command that is not Python, an output path that is not a trace
    folder, or a trace that could not be written because its disk is full (ENOSPC/EDQUOT:
    the tool's own writing failed, so exit 2 like an unwritable -o, not 125); every way
    the command itself can end is an ``Outcome``.
    """
    config = config or CaptureConfig()
    workdir = Path(cwd or os.getcwd()).resolve()
    trace = Path(out)
    if not trace.is_absolute():
        trace = workdir / trace
    trace = Path(os.path.normpath(trace))  # 'proj/../traces/a.trace' is '/…/traces/a.trace'
    # new, empty, or verifiably a reprobisect trace (its manifest parses as one), and writable
    check_trace_target(trace)
    cmd = launch_command(argv, trace, config, workdir)
    # the command's output streams live (as under git bisect run) unless quiet; it is kept
    # in the trace folder as output.log either way (reprobisect.support.outputlog)
    spec = config.spec(argv, workdir, trace)
    spec = replace(spec, env={**spec.env, OUTCOME_BY_PARENT: "1"})  # said once, by us
    try:
        result = _run(spec, executor)
    except OSError as e:  # this process's own writing (the trace folder, the probe's files) on a full disk
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise UsageError(f"{disk_full_detail(str(trace), errno.errorcode[e.errno])}; free space there or "
                         "choose another -o") from None
    code = no_space_code(result.outcome)
    full = disk_full(result.outcome) or (disk_full_detail(str(trace), code) if code else None)
    if full is not None:  # the tool's own writing failed: bad environment (exit 2), never a verdict on the command
        raise UsageError(f"{full}; free space there or choose another -o (the trace there is incomplete)")
    _log_outcome(trace, result.outcome)
    return CaptureResult(
        outcome=result.outcome,
        trace=str(trace),
        command=tuple(cmd),
        stdout_tail=result.stdout_tail,
        stderr_tail=result.stderr_tail,
        output_tail=result.output_tail,
    )


def _run(spec: ProbeSpec, executor: Executor | None) -> ProbeResult:
    """Run the capture's one probe on ``executor`` (None: a local one, made and closed here)."""
    if executor is None:
        with LocalExecutor(jobs=1) as local:
            return local.submit(spec).result()
    result = executor.submit(spec).result()
    if spec.echo and not getattr(executor, "live_output", False):
        _show_output(result)
    return result


def _show_output(result: ProbeResult) -> None:
    """The command's output once it ended (an executor that ran it elsewhere could not stream it)."""
    log = Path(result.trace_dir) / OUTPUT_LOG if result.trace_dir else None
    tail = (result.output_tail or result.stdout_tail + result.stderr_tail).encode()
    try:
        data = log.read_bytes() if log is not None and log.is_file() else tail
    except OSError:
        data = tail
    out = getattr(sys.stdout, "buffer", None)
    if out is not None and data:
        out.write(data)
        out.flush()


OUTCOME_LOG_CHARS = 16384
"""At most this much of the outcome line and traceback is appended to ``output.log``."""


def _log_outcome(trace: Path, outcome: Outcome) -> None:
    """The outcome line, and a crash's whole traceback, at the end of the trace's ``output.log``
    (the terminal gets them once, shortened: ``outcome_lines``, ``user_traceback``)."""
    log = trace / OUTPUT_LOG
    if not log.is_file():
        return
    text = f"reprobisect: {outcome}\n" + (outcome.traceback or "")
    if len(text) > OUTCOME_LOG_CHARS:  # the log stays bounded: a traceback's last frames matter most
        text = text[:200] + "\n[...]\n" + text[-(OUTCOME_LOG_CHARS - 210):]
    try:
        with open(log, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        pass  # the log is a convenience; the manifest holds the outcome and its traceback


def display_path(path: str | os.PathLike) -> str:
    """``path`` as a user wants to read it: relative to the current folder when under it
    (``traces/a.trace``), else absolute, and normalised either way (no ``proj/../``)."""
    full = os.path.normpath(os.path.abspath(path))
    here = os.getcwd()
    try:
        rel = os.path.relpath(full, here)
    except ValueError:  # another drive
        return full
    return full if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def outcome_lines(result: "CaptureResult") -> list[str]:
    """What ``bisect capture`` prints on stdout: how the run ended (steps counted from 0, as in
    the trace, said where a step is named) and where the trace is."""
    o = result.outcome
    lines = [str(o)]
    if o.step is not None and o.status is not Status.OK:
        done = "no step completed" if o.step == 0 else (
            "step 0 completed" if o.step == 1 else f"steps 0-{o.step - 1} completed")
        lines.append(f"  (steps count from 0, as in the trace: {done}; it ended during step {o.step})")
    lines.append(f"trace: {display_path(result.trace)}")
    return lines


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+')


def _ours(path: str) -> bool:
    """A frame of reprobisect's launcher or of runpy (what started the program), not the user's."""
    return (path == "<frozen runpy>" or os.path.basename(path) == "runpy.py"
            or os.path.abspath(path).startswith(_PACKAGE + os.sep))


def user_traceback(text: str | None) -> list[str]:
    """A crash's traceback with only the user's frames: the launcher's and runpy's are dropped
    (the whole one is in the trace's ``output.log`` and manifest)."""
    out: list[str] = []
    skipping = False
    for line in (text or "").splitlines():
        m = _FRAME.match(line)
        if m is not None:
            skipping = _ours(m.group("file"))
        elif not line.startswith("    "):
            skipping = False  # the exception line, a chained-exception header
        if not skipping:
            out.append(line)
    return out
