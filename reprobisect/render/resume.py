"""How ``bisect resume`` reads: the verdict on a user's checkpoint/resume as text and as ``--json``.

Reads a ``ResumeResult`` (``reprobisect.workflows.resume``) by its attributes.
"""

from __future__ import annotations

from typing import Any

from reprobisect.render.safe import printable_lines

__all__ = ["render_resume", "resume_json"]


def render_resume(r: Any) -> str:
    """Text for ``bisect resume``: the verdict, the first difference and its component, the runs."""
    k = r.at
    if r.verdict == "bitwise":
        first, last = r.compared_steps
        head = f"resume OK: the run resumed after step {k - 1} continues the uninterrupted run bitwise (steps {first}..{last})"
        if first < k:
            head = (f"resume OK: the run resumed from its last checkpoint (after step {first - 1}, before the interruption "
                    f"after step {k - 1}) continues the uninterrupted run bitwise (steps {first}..{last})")
    elif r.verdict == "diverged":
        f = r.finding
        head = (f"resume differs at step {f.step}: {f.component}\n"
                f"  what:  {f.what}\n"
                f"  why:   {f.why}")
        if f.also:
            head += "\n  also:  " + "; ".join(f.also)
    else:
        head = f"resume inconclusive: {r.reason}"
    lines = [head]
    if r.verdict != "inconclusive" and r.reason:
        lines.append(f"  note:  {r.reason}")
    lines.append("runs:")
    for s in r.runs:
        lines.append(f"  {s.role:<13} {s.status:<9} {s.steps} step(s)  {' '.join(s.command)}")
    return printable_lines("\n".join(lines))


def resume_json(r: Any) -> dict[str, Any]:
    """The ``--json`` document of ``bisect resume`` after the envelope (``render.envelope``);
    ``resume_verdict`` is the resume's own word (bitwise, diverged, inconclusive)."""
    return {
        "resume_verdict": r.verdict,
        "at": r.at,
        "steps": r.steps,
        "compared_steps": list(r.compared_steps),
        "start": r.compared_steps[0],
        "compared": r.compared,
        "detail": r.detail,
        "finding": r.finding.to_json() if r.finding is not None else None,
        "reason": r.reason,
        "runs": [s.to_json() for s in r.runs],
        "exit_code": r.exit_code,
    }
