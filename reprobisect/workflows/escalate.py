"""Escalation of ``--detail sentinel``: the full chain at the step where two sides first differ.

A sentinel trace says *which step* first differs and which sentinel showed it (loss, a
parameter after the step, ...), not the first broken link inside that step. When two
sentinel traces diverge at step ``t``, ``escalate`` re-runs both sides with full detail
through steps ``.. t``: from the last complete state both traces hold before ``t``
(``--replay-from``, ``reprobisect.workflows.replay``) that leaves at least one step before
``t`` to replay, or from the start when they hold none, and compares the two full
recordings. Each replay's steps before ``t`` are first checked against its own side's
sentinels (``verify_replay``): a replay that refused, failed or disagrees with the run it
replays is not evidence, and the escalation is then *inconclusive*, with why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from reprobisect.core.compare import Comparison, Tolerance
from reprobisect.core.distributed import rerun_unsupported
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.core.verdict import compare_results
from reprobisect.errors import ReproError
from reprobisect.executors import submit_all
from reprobisect.executors.base import Executor
from reprobisect.executors.retry import retry
from reprobisect.trace.reader import read_trace
from reprobisect.workflows.replay import replay_info, verify_replay

__all__ = ["Escalation", "escalate", "escalate_or_why", "not_replayable", "replay_spec"]


@dataclass(frozen=True)
class Escalation:
    """The full-detail answer behind a sentinel divergence; falsy when inconclusive."""

    step: int
    """The step where the sentinel traces first differ."""
    from_step: int
    """The first step the replays recorded (0: recorded from the start, no state before ``step``)."""
    comparison: Comparison | None
    """The two full-detail recordings compared; None when inconclusive."""
    reason: str = ""
    """Where the full detail came from, or why there is none."""
    traces: tuple[str | None, str | None] = (None, None)

    def __bool__(self) -> bool:
        return self.comparison is not None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "from_step": self.from_step, "conclusive": bool(self), "reason": self.reason,
                "comparison": self.comparison.to_json() if self.comparison is not None else None,
                "traces": list(self.traces)}


def replay_spec(side: ProbeResult, step: int, state_step: int | None) -> ProbeSpec:
    """``side``'s probe again, recording steps ``state_step + 1 .. step`` with full detail from
    its own trace's state (or ``0 .. step`` from the start when ``state_step`` is None)."""
    start = 0 if state_step is None else state_step + 1
    extra = () if state_step is None else ("--replay-from", str(side.trace_dir), "--replay-step", str(start))
    spec = side.spec
    return replace(spec, key=f"{spec.key}-full{start}", steps=step - start + 1, detail="full", state_every=None,
                   state_steps=(), full_steps=(), attempt=0, trace_dir=None, echo=False,
                   extra_launch_args=(*spec.extra_launch_args, *extra))


def escalate(comp: Comparison, a: ProbeResult, b: ProbeResult, executor: Executor,
             tolerance: Tolerance | None = None) -> Escalation | None:
    """Full detail at the first divergence of two sentinel traces (None: nothing to escalate:
    they agree, or neither side is a sentinel trace)."""
    if comp is None or bool(comp) or not comp.sentinel or comp.first is None:
        return None
    t = comp.first.step
    unsupported = rerun_unsupported("replay", a.trace_dir, b.trace_dir)  # multi-rank: no replay yet (issue 13)
    if unsupported:
        return Escalation(t, 0, None, f"full detail at step {t} is {unsupported}", (a.trace_dir, b.trace_dir))
    # the last state both hold that leaves at least one replayed step before t to check the
    # replay against its run (step t itself may differ run to run: that is the question)
    k = max((s for s in comp.state_steps if s < t - 1), default=None)
    start = 0 if k is None else k + 1
    where = f"replayed steps {start}..{t} from the state after step {k}" if k is not None else \
        f"recorded steps 0..{t} again (no state before step {t})"
    futures = submit_all(executor, [replay_spec(a, t, k), replay_spec(b, t, k)])
    sides = [retry(executor, f.result()) for f in futures]
    for label, side, orig in zip("AB", sides, (a, b)):
        problem = _not_evidence(side, orig, t)
        if problem:
            return Escalation(t, start, None, f"full detail at step {t} is inconclusive: side {label} {problem}",
                              (sides[0].trace_dir, sides[1].trace_dir))
    full = compare_results(sides[0], sides[1], tolerance)
    if k is not None and any((replay_info(read_trace(s.trace_dir, allow_incomplete=True)) or {}).get("mode") == "rerun"
                             for s in sides):  # runners.replay_tf: no state loaded
        where = f"replayed steps {start}..{t} by re-running from the start, unrecorded before step {start} (TensorFlow)"
    return Escalation(t, start, full, f"full detail: {where} with full detail on both sides",
                      (sides[0].trace_dir, sides[1].trace_dir))


def escalate_or_why(comp: Comparison | None, a: ProbeResult, b: ProbeResult, executor: Executor,
                    tolerance: Tolerance | None = None) -> Escalation | None:
    """``escalate``, with a replay that cannot even be started (a ``ReproError``: a state that
    cannot be read, an executor that refuses) turned into an inconclusive answer saying why:
    the probing command's own verdict stands either way."""
    try:
        return escalate(comp, a, b, executor, tolerance)
    except ReproError as e:
        return not_replayable(comp, str(e))


def not_replayable(comp: Comparison | None, why: str) -> Escalation | None:
    """The inconclusive escalation of a sentinel divergence whose sides cannot be replayed
    (``why``); None when there is nothing to escalate, as ``escalate`` has it."""
    if comp is None or bool(comp) or not comp.sentinel or comp.first is None:
        return None
    t = comp.first.step
    return Escalation(t, t, None, f"full detail at step {t} is inconclusive: {why}")


def _not_evidence(side: ProbeResult, original: ProbeResult, step: int) -> str:
    """Why a replay says nothing ('' when its steps before ``step`` are its run's)."""
    if not side.outcome or side.trace_dir is None:
        return f"could not be replayed ({side.outcome})"
    problem, checked = verify_replay(read_trace(side.trace_dir, allow_incomplete=True),
                                     read_trace(str(original.trace_dir), allow_incomplete=True), before=step)
    if problem:
        return f"is not faithful to its run ({problem})"
    return "" if checked or step == 0 else "left no step before the divergence to check against its run"
