"""What the explicit recording APIs share (``reprobisect.torch.record``,
``reprobisect.tensorflow.record``): the trace writer they open, the revision of the running
script for the manifest, the outcome of the block, and sealing the trace with the
environment and what the recorder noted.

Sealing never fails because the environment record failed: the trace says why instead.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Sequence

from reprobisect.core.outcome import Outcome

__all__ = ["revision", "open_writer", "crashed", "finished", "seal"]


def revision() -> dict[str, Any] | None:
    """The git revision of the running script's repository (or the cwd's), for the manifest."""
    try:
        from reprobisect.runners.environment import revision_of

        return revision_of(sys.argv[0] if sys.argv and sys.argv[0] else None)
    except Exception:
        return None


def open_writer(trace: str | os.PathLike, policy: Any, *, command: Sequence[str] | None, seed: Any, api: str) -> Any:
    """The ``TraceWriter`` of an explicit recording (``api``: the function the user called)."""
    from reprobisect.trace.writer import TraceWriter

    return TraceWriter(trace, command=list(command if command is not None else sys.argv), policy=policy.to_json(),
                       seed=seed, revision=revision(), recorder={"api": api})


def crashed(e: BaseException, writer: Any, trace: str | os.PathLike) -> Outcome:
    """The outcome of a block that raised ``e`` (the user's exception: raised on after sealing)."""
    return Outcome("crashed", detail=f"{type(e).__name__}: {e}", step=writer.steps_written,
                   traceback="".join(traceback.format_exception(type(e), e, e.__traceback__))[-20000:],
                   trace=os.path.abspath(trace))


def finished(writer: Any, rec: Any, trace: str | os.PathLike, *, api: str, no_steps: Any,
             failed: str | None = None) -> Outcome:
    """The outcome of a block that ended: nonfinite, the recorder's own ``failed`` (``infra``),
    no step (``no_steps()`` says why), or ok; with the trace's path."""
    if rec.stop is not None and rec.stop.reason == "nonfinite":
        outcome = Outcome("nonfinite", detail=rec.stop.detail, step=rec.stop.step)
    elif failed is not None:
        outcome = Outcome("infra", detail=rec.stop.detail if rec.stop else failed)
    elif writer.steps_written == 0:
        outcome = Outcome("no_steps", detail=f"no step ran inside {api}(): " + no_steps())
    else:
        outcome = Outcome("ok", detail=f"recorded {writer.steps_written} step(s)")
    return Outcome(**{**outcome.to_json(), "trace": os.path.abspath(trace)})


def seal(writer: Any, rec: Any, outcome: Outcome) -> None:
    """Close ``writer`` as complete (``ok``/``nonfinite``) or failed, with the environment and
    the recorder's extra (its ``manifest_extra``, notes, first non-finite record, evaluation
    after the last step)."""
    try:
        from reprobisect.runners.environment import collect_environment

        env = collect_environment()
    except Exception as e:
        env = {"error": f"environment record failed: {type(e).__name__}: {e}"}
    extra: dict[str, Any] = dict(getattr(rec, "manifest_extra", None) or {})
    if rec.notes:
        extra["notes"] = list(rec.notes)
    if rec.first_nonfinite is not None:
        extra["first_nonfinite"] = {"step": rec.first_nonfinite[0], "record": rec.first_nonfinite[1]}
    tail = rec.evaluation_after_last_step() if hasattr(rec, "evaluation_after_last_step") else None
    if tail:
        extra["eval_after_last_step"] = tail
    status = "complete" if outcome.status in ("ok", "nonfinite") else "failed"
    writer.close(status, outcome=outcome.to_json(), error=None if status == "complete" else str(outcome),
                 environment=env, extra=extra)
