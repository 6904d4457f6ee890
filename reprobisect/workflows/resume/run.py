"""The library behind ``bisect resume``: three runs of the user's command and the verdict.

``check_resume(argv, resume_args, at=K, options)`` runs, one after another, each in its own
copy of the working folder (``folders``: a resumed run reads only what the interrupted run
wrote, never a file the uninterrupted run left; the user's folder is only read):

1. ``argv`` uninterrupted for ``options.steps`` (N) steps: steps ``0..N-1``;
2. ``argv`` again, interrupted like a preemption once K steps (``0..K-1``) are done and
   step K-1's own end-of-step code (its checkpoint save) has run: the recorder stops the
   process as step K begins (``runners.preempt_torch``);
3. ``argv + resume_args`` for N-K steps, in a copy of the folder as run 2 left it: its step
   ``j`` is step ``K + j`` of run 1. A checkpoint the resume arguments name that run 2 did not
   write is refused first, in one line (``folders.check_named``).

Run 2 must agree with run 1 over steps ``0..K-1`` (else the command is not deterministic
and no verdict about the resume is possible); then run 3 is compared with run 1's steps
``K..N-1`` (``diagnose``; from an older checkpoint's next step when run 3 restarted from one:
``diagnose.align``). Returns a frozen ``ResumeResult``, truthy when the continuation
is bitwise the uninterrupted run.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reprobisect.core.options import ProbeOptions
from reprobisect.core.outcome import Status
from reprobisect.errors import ReproError, UsageError
from reprobisect.executors import executor_for
from reprobisect.executors.base import ProbeResult, ProbeSpec
from reprobisect.support.progress import progress
from reprobisect.trace.ranks import read_rank0
from reprobisect.workflows.repro import spec_for
from reprobisect.workflows.resume.diagnose import Finding, align, bookkeeping_notes, diagnose, first_difference
from reprobisect.workflows.resume.folders import Wrote, check_named, copy_folder, snapshot, written

__all__ = ["Reference", "ResumeResult", "RunSummary", "check_resume", "judge_resumed", "record_reference",
           "split_resume_args"]

VERDICTS = ("bitwise", "diverged", "inconclusive")


@dataclass(frozen=True)
class RunSummary:
    """One of the three runs: what ran, how it ended, how many steps it recorded."""

    role: str
    """``uninterrupted``, ``interrupted`` or ``resumed``."""
    command: tuple[str, ...]
    status: str
    detail: str
    steps: int
    trace: str | None
    last_line: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "command": list(self.command), "status": self.status, "detail": self.detail,
                "steps": self.steps, "trace": self.trace, "last_line": self.last_line}


@dataclass(frozen=True)
class ResumeResult:
    """The verdict of ``bisect resume``; truthy when the resumed run continues the uninterrupted one bitwise."""

    at: int
    """K: the run was interrupted after K steps (0..K-1); the resumed run's first step is step K."""
    steps: int
    """N: steps of the uninterrupted run; steps K..N-1 are compared."""
    verdict: str
    """``bitwise``, ``diverged`` or ``inconclusive`` (``VERDICTS``)."""
    runs: tuple[RunSummary, ...]
    finding: Finding | None = None
    """Where the resumed run first differs and the state component named (``diverged``)."""
    reason: str = ""
    """Why there is no verdict (``inconclusive``), or a note on a ``bitwise`` one."""
    detail: str = "full"
    """The detail level the runs recorded at (``sentinel``: what the sentinels saw)."""
    compared: int = 0
    """Aligned steps compared."""
    start: int | None = None
    """The uninterrupted run's step the resumed run's first step was compared with: ``at``, or the step
    after an older checkpoint the resume restarted from (it redid the steps up to ``at``); None: ``at``."""

    @property
    def compared_steps(self) -> tuple[int, int]:
        """The first and last step of the uninterrupted run compared (``at..N-1`` when none was)."""
        first = self.at if self.start is None else self.start
        return (first, first + self.compared - 1) if self.compared else (self.at, self.steps - 1)

    def __bool__(self) -> bool:
        return self.verdict == "bitwise"

    @property
    def exit_code(self) -> int:
        return 0 if self else 1


def split_resume_args(text: str | None) -> list[str]:
    """``--resume-args`` split as a POSIX shell would; empty or unbalanced quotes → ``UsageError``."""
    if text is None:
        raise UsageError("give --resume-args ARGS: the flags that make the command resume (e.g. --resume-args '--resume ckpt.pt')")
    try:
        args = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--resume-args {text!r} cannot be split like a shell would: {e}; fix the quotes") from None
    if not args:
        raise UsageError("--resume-args is empty; give the flags that make the command resume, e.g. '--resume ckpt.pt'")
    return args


def _spec(argv: list[str], options: ProbeOptions, key: str, steps: int, workdir: Path,
          extra: tuple[str, ...] = ()) -> ProbeSpec:
    # repro's spec (options' env, timeout, detail) for ``steps`` steps, run in place
    return replace(spec_for(argv, options, key=key, workdir=workdir), steps=steps,
                   full_steps=tuple(s for s in options.full_steps if s < steps), extra_launch_args=extra, in_place=True)


def _summary(role: str, r: ProbeResult) -> RunSummary:
    steps = 0
    if r.trace_dir:
        try:
            steps = len(read_rank0(r.trace_dir, allow_incomplete=True).steps)
        except (ReproError, OSError, ValueError):  # a run that left no readable trace recorded nothing
            steps = 0
    last = r.last_lines(1)
    return RunSummary(role=role, command=r.spec.argv, status=str(r.outcome.status),
                      detail=r.outcome.detail or "", steps=steps, trace=r.trace_dir, last_line=last[:300])


@dataclass(frozen=True)
class Reference:
    """Runs 1 and 2: the uninterrupted run and the interrupted one, checked against each other
    over steps ``0..K-1``; ``reason`` says why no resume can be judged against them ('' when one can)."""

    at: int
    steps: int
    runs: tuple[RunSummary, ...]
    full: Any = None
    """The uninterrupted run's trace (``reprobisect.trace.reader.Trace``)."""
    reason: str = ""
    folder: str | None = None
    """The copy of the working folder the interrupted run ran in, as it left it: each resumed run
    starts from a fresh copy of it."""
    wrote: Wrote = Wrote()
    """The files runs 1 and 2 wrote in their folders."""
    saved: tuple[dict[str, Any], ...] = ()
    """What the interrupted run's end-of-step code saved (``runners.preempt_torch``: each
    ``torch.save`` with the scheduler state it held and the ``scheduler.step()`` calls after it)."""


def _check_args(argv: list[str], at: int, n: int) -> None:
    if not argv:
        raise UsageError("give the training command after --, e.g. bisect resume --at 3 --resume-args '--resume ckpt.pt' -- python train.py")
    if isinstance(at, bool) or not isinstance(at, int) or at < 1:
        raise UsageError(f"--at takes the number of steps after which the run is interrupted, >= 1 (got {at!r})")
    if at >= n:
        raise UsageError(f"--at {at} leaves no step to compare with --steps {n}; use --at below --steps (e.g. --at {max(1, n // 2)})")


def _run_in_copy(executor: Any, spec: ProbeSpec, source: Path, folder: Path) -> tuple[ProbeResult, tuple[str, ...],
                                                                                    tuple[float, float]]:
    """Run ``spec`` in ``folder``, a fresh copy of ``source``; what it wrote there and when it ran."""
    copy_folder(source, folder)
    before, t0 = snapshot(folder), time.time()
    r = executor.submit(replace(spec, workdir=str(folder))).result()
    return r, written(before, snapshot(folder)), (t0, time.time())


def record_reference(argv: list[str], *, at: int, options: ProbeOptions, executor: Any,
                     cwd: str | os.PathLike | None = None, progress_: Any = None,
                     scratch: str | os.PathLike | None = None) -> Reference:
    """Run ``argv`` uninterrupted for ``options.steps`` steps, then interrupted after ``at`` steps
    (after step ``at - 1``'s own end-of-step code), on ``executor``, one after the other, each in
    its own copy of ``cwd`` under ``scratch`` (default: a new temporary folder the caller removes)."""
    n = options.steps
    _check_args(argv, at, n)
    workdir = Path(cwd or os.getcwd()).resolve()
    root = Path(scratch) if scratch is not None else Path(tempfile.mkdtemp(prefix="reprobisect-resume-"))
    tag = uuid.uuid4().hex[:8]
    runs: list[RunSummary] = []
    traces: list[Any] = []
    files: list[tuple[str, ...]] = []
    spans: list[tuple[float, float]] = []
    for role, spec in (("uninterrupted", _spec(argv, options, f"resume-{tag}-full", n, workdir)),
                       ("interrupted", _spec(argv, options, f"resume-{tag}-interrupted", at, workdir, ("--defer-stop",)))):
        if progress_ is not None:
            progress_.update(f"{role} run")
        r, wrote, span = _run_in_copy(executor, spec, workdir, root / f"{tag}-{role}")
        s = _summary(role, r)
        runs.append(s)
        files.append(wrote)
        spans.append(span)
        if progress_ is not None:
            progress_.advance()
        stop = _check_run(role, r, s, n=n, at=at)
        if stop is not None:
            return Reference(at=at, steps=n, runs=tuple(runs), reason=stop)
        traces.append(read_rank0(r.trace_dir, allow_incomplete=True))
    full, cut = traces
    done = Wrote(uninterrupted=files[0], interrupted=files[1], spans=tuple(spans))
    saved = tuple(((cut.manifest.environment or {}).get("preempt") or {}).get("saves") or ())
    kept = dict(folder=str(root / f"{tag}-interrupted"), wrote=done, saved=saved)
    for k in range(at):  # the interruption must not change what came before it
        sa, sb = full.step(k), cut.step(k)
        what = first_difference(sa, sb) if sa is not None and sb is not None else "a step is missing"
        if what is not None:
            return Reference(at=at, steps=n, runs=tuple(runs), full=full, **kept, reason=(
                f"the uninterrupted and the interrupted runs already differ at step {k} ({what}), before the "
                "interruption: the command is not deterministic, so no difference after the resume can be "
                "blamed on it; make it deterministic first (bisect repro names the cause)"
                + ("; or the command resumed by itself from a checkpoint outside its working folder that the "
                   "first run left (such paths are shared by the runs): make resuming opt-in, e.g. behind the "
                   "resume arguments" if k == 0 else "")))
    return Reference(at=at, steps=n, runs=tuple(runs), full=full, **kept)


def judge_resumed(ref: Reference, argv: list[str], resume_args: list[str], *, options: ProbeOptions, executor: Any,
                  cwd: str | os.PathLike | None = None, progress_: Any = None) -> ResumeResult:
    """Run ``argv + resume_args`` for N-K steps in a fresh copy of the folder ``ref``'s interrupted
    run left and compare it with the uninterrupted run's steps K..N-1. A checkpoint the arguments
    name that the interrupted run did not write is refused first (``UsageError``, one line)."""
    at, n = ref.at, ref.steps
    if not resume_args:
        raise UsageError("--resume-args is empty; give the flags that make the command resume")
    if ref.reason:
        return ResumeResult(at=at, steps=n, verdict="inconclusive", runs=ref.runs, reason=ref.reason, detail=options.detail)
    workdir = Path(cwd or os.getcwd()).resolve()
    left = Path(ref.folder) if ref.folder is not None else workdir
    check_named(resume_args, left, ref.wrote, at)
    tag = uuid.uuid4().hex[:8]
    spec = _spec([*argv, *resume_args], options, f"resume-{tag}-resumed", n - at, workdir)
    if progress_ is not None:
        progress_.update("resumed run")
    r, _, _ = _run_in_copy(executor, spec, left, left.parent / f"{tag}-resumed")
    s = _summary("resumed", r)
    if progress_ is not None:
        progress_.advance()
    runs = (*ref.runs, s)
    stop = _check_run("resumed", r, s, n=n, at=at, wrote=ref.wrote.interrupted)
    if stop is not None:
        return ResumeResult(at=at, steps=n, verdict="inconclusive", runs=runs, reason=stop, detail=options.detail)
    full, resumed = ref.full, read_rank0(r.trace_dir, allow_incomplete=True)
    al = align(full, resumed, at)
    finding = diagnose(full, resumed, at, saved=ref.saved)
    compared = sum(1 for sc in al.trace.steps if full.step(al.start + sc.step) is not None)
    notes = list(al.notes)
    if finding is not None and finding.component == "checkpoint":
        notes.append(f"each run worked in its own copy of the folder; the interrupted run wrote: "
                     f"{', '.join(ref.wrote.interrupted[:5]) or 'no file there'}")
    if finding is not None:
        return ResumeResult(at=at, steps=n, verdict="diverged", runs=runs, finding=finding, detail=options.detail,
                            compared=compared, start=al.start, reason="; ".join(filter(None, [*notes, _sentinel_note(options.detail, finding)])))
    if compared < n - at:
        return ResumeResult(
            at=at, steps=n, verdict="inconclusive", runs=runs, detail=options.detail, compared=compared,
            reason="; ".join([f"the resumed run recorded only {compared} of the {n - at} steps {at}..{n - 1} and they agree; "
                              "it ended early (did it resume at a later step than the checkpoint's?)", *notes]))
    return ResumeResult(at=at, steps=n, verdict="bitwise", runs=runs, detail=options.detail, compared=compared,
                        start=al.start, reason="; ".join([*notes, *bookkeeping_notes(full, al.trace, al.start)]))


def check_resume(argv: list[str], resume_args: list[str], *, at: int, options: ProbeOptions,
                 cwd: str | os.PathLike | None = None) -> ResumeResult:
    """Run the command uninterrupted, interrupted after ``at`` steps, and resumed; compare steps ``at..N-1``."""
    _check_args(argv, at, options.steps)
    if not resume_args:
        raise UsageError("--resume-args is empty; give the flags that make the command resume")
    # each run works in its own copy of the folder (``folders``), removed at the end; the specs run
    # in that copy itself (``ProbeSpec.in_place``) on every executor, a borrowed one included
    with executor_for(options) as ex, progress("resume", total=3, quiet=options.quiet) as p, \
            tempfile.TemporaryDirectory(prefix="reprobisect-resume-") as scratch:
        ref = record_reference(argv, at=at, options=options, executor=ex, cwd=cwd, progress_=p, scratch=scratch)
        return judge_resumed(ref, argv, resume_args, options=options, executor=ex, cwd=cwd, progress_=p)


def _sentinel_note(detail: str, f: Finding) -> str:
    if detail != "sentinel" or f.component not in ("RNG", "optimizer state", "learning rate / scheduler", "other"):
        return ""
    return ("recorded at --detail sentinel (batch, loss, gradient norm, learning rates, scale, parameters): the "
            "component is inferred from those; rerun with --detail full to see the first differing tensor")


def _check_run(role: str, r: ProbeResult, s: RunSummary, *, n: int, at: int, wrote: tuple[str, ...] = ()) -> str | None:
    """Why the three runs cannot be judged after ``role`` ended as it did (None: go on)."""
    tail = f" (its last line: {s.last_line})" if s.last_line else ""
    if role == "uninterrupted":
        if not r.outcome:
            raise UsageError(f"the command does not run to {n} steps: it ended {r.outcome.status} {r.outcome.detail or ''}"
                             f"{tail}; check it with bisect capture first")
        if s.steps < n:
            raise UsageError(f"the command ran only {s.steps} step(s) by itself; use --steps {s.steps} or fewer")
        return None
    if role == "interrupted":
        if not r.outcome:
            return (f"the interrupted run ended {r.outcome.status} before it could be interrupted after step {at - 1}"
                    f"{tail}: a crash in its end-of-step code (the checkpoint save?)")
        if s.steps < at:
            raise UsageError(f"the interrupted run never reached step {at}: it ended after {s.steps} step(s); "
                             f"use a smaller --at")
        return None
    if r.outcome.status == Status.NO_STEPS or (not r.outcome and s.steps == 0):
        left = f"it wrote: {', '.join(wrote[:5])}" if wrote else "it wrote no file in its folder"
        return (f"the resumed run (with the resume arguments) ended {r.outcome.status} without a step{tail}: did the "
                f"interrupted run leave the checkpoint the resume arguments name? ({left})")
    if not r.outcome:
        return f"the resumed run ended {r.outcome.status} at its step {s.steps}{tail}"
    return None
