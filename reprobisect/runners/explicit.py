"""What the explicit recording APIs share (``reprobisect.torch.record``,
``reprobisect.tensorflow.record``): the revision of the running script for the manifest,
and sealing the trace with the environment and what the recorder noted.

Sealing never fails because the environment record failed: the trace says why instead.
"""

from __future__ import annotations

import sys
from typing import Any

from reprobisect.core.outcome import Outcome

__all__ = ["revision", "seal"]


def revision() -> dict[str, Any] | None:
    """The git revision of the running script's repository (or the cwd's), for the manifest."""
    try:
        from reprobisect.runners.environment import revision_of

        return revision_of(sys.argv[0] if sys.argv and sys.argv[0] else None)
    except Exception:
        return None


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
