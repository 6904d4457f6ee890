"""Replay a training command from a recorded complete state, and check the replay is faithful.

``replay(argv, state_trace, step, out)`` runs the user's unmodified command under the
launcher with ``--replay-from state_trace --replay-step step``: the run loads the state
``state_trace`` captured after step ``step - 1`` at the point where step ``step`` began
and records steps ``step ..`` with full detail into ``out``
(``reprobisect.runners.replay_torch`` says how, and when it refuses). The escalation of
``--detail sentinel`` uses it to get the full chain at a late step without recording the
whole run.

A replay can only see from inside what the state holds. What it cannot see (the loop's
own variables: an iteration counter that sets the learning rate, a batch drawn ahead of
the step, an iterator the script built itself) shows as replayed steps that disagree with
the steps the original run recorded. ``verify_replay`` compares every step both traces
hold: batch IDs, every record both recorded (fingerprints), learning rates, loss and
GradScaler scale. A replay whose steps disagree is not evidence: ``ReplayResult.faithful``
is False and ``detail`` says where (a divergence that replays reproduce is compared by the
caller on the replays, never on a replay against an original).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from reprobisect.core.outcome import Outcome, Status
from reprobisect.errors import UsageError
from reprobisect.trace.reader import Trace, read_trace
from reprobisect.executors.local import LocalExecutor
from reprobisect.trace.outdir import check_trace_target
from reprobisect.workflows.capture import CaptureConfig

__all__ = ["ReplayResult", "replay", "replay_through", "verify_replay", "last_state_before", "replay_info"]

_SCALARS = ("lr", "loss", "scaler_scale")


@dataclass(frozen=True)
class ReplayResult:
    """How the replay ended, where its trace is, and whether it agrees with the original."""

    outcome: Outcome
    trace: str
    first_step: int
    state_trace: str
    faithful: bool | None
    """True: every step both traces hold agrees; False: one does not (``detail``); None: no
    step to check (the original did not record the replayed steps) or the replay failed."""
    detail: str = ""
    steps_checked: int = 0

    def __bool__(self) -> bool:
        return bool(self.outcome) and self.faithful is not False


def last_state_before(trace: Trace | str | os.PathLike, step: int) -> int | None:
    """The last step ``k < step`` after which ``trace`` captured complete state (so a replay
    from ``k + 1 <= step`` reaches ``step``), or None."""
    t = trace if isinstance(trace, Trace) else read_trace(trace, allow_incomplete=True)
    folder = t.path / "state"
    have = []
    if folder.is_dir():
        for p in folder.glob("step-*"):
            try:
                k = int(p.name[len("step-"):])
            except ValueError:
                continue
            if k < step and (p / "rng.json").is_file():
                have.append(k)
    return max(have) if have else None


def replay_info(trace: Trace) -> dict[str, Any] | None:
    """The manifest's note that ``trace`` is a replay (``from``, ``step``, ``mode``...), or None."""
    info = trace.manifest.extra.get("replay") if isinstance(trace.manifest.extra, dict) else None
    return dict(info) if isinstance(info, dict) else None


def verify_replay(replayed: Trace, original: Trace, before: int | None = None) -> tuple[str | None, int]:
    """(The first disagreement between the steps both traces hold, or None; steps checked).

    ``before``: check only the steps before it (a divergence between runs of one commit at
    step ``before`` is nondeterminism, which a replay of that step need not reproduce)."""
    by_step = {s.step: s for s in original.steps}
    checked = 0
    for s in replayed.steps:
        o = by_step.get(s.step)
        if o is None or (before is not None and s.step >= before):
            continue
        checked += 1
        if s.batch_ids is not None and o.batch_ids is not None and list(s.batch_ids) != list(o.batch_ids):
            return f"step {s.step}: the replay drew other batches than the original run", checked
        theirs = {r.key: r for r in o.records}
        for r in s.records:
            t = theirs.get(r.key)
            if t is not None and r.fingerprint != t.fingerprint:
                return f"step {s.step}: {r.kind} '{r.name}' differs from the original run's", checked
        for k in _SCALARS:
            if k in s.scalars and k in o.scalars and s.scalars[k] != o.scalars[k]:
                return f"step {s.step}: scalar '{k}' differs from the original run's", checked
    return None, checked


def replay(argv: Sequence[str], state_trace: str | os.PathLike, step: int, out: str | os.PathLike, *,
           steps: int = 1, config: CaptureConfig | None = None, cwd: str | os.PathLike | None = None,
           original: str | os.PathLike | None = None, executor: Any = None,
           launch_args: Sequence[str] = ()) -> ReplayResult:
    """Run ``argv`` from the state ``state_trace`` holds after step ``step - 1`` and record
    steps ``step .. step + steps - 1`` into ``out``; check them against ``original`` (default
    ``state_trace``: the run the state came from). ``config`` sets everything else a capture
    takes (timeout, full steps, environment...); its ``steps`` and ``state_steps`` are ignored.
    ``launch_args``: further launcher options (``--zoom-module M --zoom-step K``)."""
    if step < 1:
        raise UsageError(f"replay step {step}: a replay starts at step 1 or later (step 0 has no earlier state)")
    src = Path(state_trace).resolve()
    cfg = _config(config, steps)
    outcome, trace = _run(argv, out, cfg, cwd, executor,
                          (*launch_args, "--replay-from", str(src), "--replay-step", str(step)))
    return _checked(outcome, trace, step, src, original)


def replay_through(argv: Sequence[str], state_trace: str | os.PathLike, step: int, out: str | os.PathLike,
                   **kwargs: Any) -> ReplayResult:
    """Record ``step`` with full detail as cheaply as ``state_trace`` allows: replay from its
    last state before ``step`` (steps ``k+1 .. step``), or, with none, record from the start
    (steps ``0 .. step``, ``first_step`` 0); either way checked against the original. The
    escalation's call: a divergence first seen at ``step`` in a sentinel trace."""
    k = last_state_before(state_trace, step)
    if k is not None:
        return replay(argv, state_trace, k + 1, out, steps=step - k, **kwargs)
    cfg = _config(kwargs.get("config"), step + 1)
    src = Path(state_trace).resolve()
    outcome, trace = _run(argv, out, cfg, kwargs.get("cwd"), kwargs.get("executor"), tuple(kwargs.get("launch_args", ())))
    return _checked(outcome, trace, 0, src, kwargs.get("original"))


def _config(config: CaptureConfig | None, steps: int) -> CaptureConfig:
    """``config`` (default: quiet) recording ``steps`` steps and capturing no state."""
    base = config or CaptureConfig(quiet=True)
    return dataclasses.replace(base, steps=steps, state_steps=())


def _checked(outcome: Outcome, trace: str, step: int, src: Path, original: str | os.PathLike | None) -> ReplayResult:
    """The result of a run that recorded from ``step``, checked against the original's steps."""
    if outcome.status not in (Status.OK, Status.NONFINITE):
        return ReplayResult(outcome, trace, step, str(src), None, outcome.detail or "")
    mine = read_trace(trace, allow_incomplete=True)
    theirs = read_trace(original or src, allow_incomplete=True)
    problem, checked = verify_replay(mine, theirs)
    if problem is not None:
        detail = (f"the replay is not faithful ({problem}): the command's own loop state (an iteration counter, "
                  "a batch drawn ahead, an iterator it built) is not in the captured state; no verdict from it")
        return ReplayResult(outcome, trace, step, str(src), False, detail, checked)
    detail = (f"replayed from step {step} (state after step {step - 1} of {src})" if step else
              f"recorded from step 0 (no state of {src} before it)")
    return ReplayResult(outcome, trace, step, str(src), True if checked else None, detail, checked)


def _run(argv: Sequence[str], out: str | os.PathLike, cfg: CaptureConfig, cwd: str | os.PathLike | None,
         executor: Any, launch_args: tuple[str, ...]) -> tuple[Outcome, str]:
    """Run the launcher for ``argv`` with ``launch_args`` added, like ``capture`` does; (outcome, trace)."""
    if not argv:
        raise UsageError("give the training command to replay, e.g. ['python', 'train.py']")
    workdir = Path(cwd or os.getcwd()).resolve()
    trace = Path(out)
    if not trace.is_absolute():
        trace = workdir / trace
    check_trace_target(trace)
    spec = cfg.spec(argv, workdir, trace)
    spec = dataclasses.replace(spec, key="replay", extra_launch_args=(*spec.extra_launch_args, *launch_args))
    if executor is None:
        with LocalExecutor(jobs=1) as local:
            result = local.submit(spec).result()
    else:
        result = executor.submit(spec).result()
    return result.outcome, str(trace)
