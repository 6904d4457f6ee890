"""How ``bisect envs`` reads: the environment diff first, then the first divergence.

Reads an ``EnvsResult`` (``reprobisect.workflows.envs``) and ``EnvChange`` values
(``reprobisect.core.envdiff``) by their attributes.
"""

from __future__ import annotations

from typing import Any, Iterable

from reprobisect.render.comparison import render_comparison
from reprobisect.render.repro import (cause_lines, escalation_json, escalation_lines, probe_result_json,
                                      without_answered_hints)
from reprobisect.render.safe import printable_lines

__all__ = ["envs_json", "format_changes", "render_envs"]


def format_changes(changes: Iterable[Any], *, include_info: bool = True) -> str:
    """``EnvChange`` values as a text block: numerics changes, then info changes; '' when none."""
    changes = list(changes)
    lines = []
    num = [c for c in changes if c.numerics]
    info = [c for c in changes if not c.numerics]
    if num:
        lines.append("environment differences that can change numerics:")
        lines += [f"  {c}" for c in num]
    if info and include_info:
        lines.append("other environment differences:")
        lines += [f"  {c}" for c in info]
    return printable_lines("\n".join(lines))


def render_envs(r: Any) -> str:
    """Text for ``bisect envs``: the environment diff first, then the first divergence."""
    lines = [f"side a: {r.a.text}", f"side b: {r.b.text}"]
    text = render_comparison(without_answered_hints(r.comparison, r))
    if "environment" not in text:  # the comparison shows the environment diff itself
        env = format_changes(r.env_changes)
        lines.append(env if env else "environments: no recorded difference")
    lines.append(text)
    lines += escalation_lines(getattr(r, "escalation", None))
    confirmations = getattr(r, "confirmations", ()) or ()
    lines += cause_lines(confirmations)
    if any(confirmations):
        lines.append("so the environment difference is not what makes the sides differ here: with the cause held "
                     "fixed they agree under both environments")
    return printable_lines("\n".join(lines))


def envs_json(r: Any) -> dict[str, Any]:
    """What ``bisect envs --json`` prints."""
    c = r.comparison
    return {
        "agree": bool(r),
        "a": r.a.to_json(),
        "b": r.b.to_json(),
        "environment": [e.to_json() for e in r.env_changes],
        "comparison": c.to_json() if hasattr(c, "to_json") else str(c),
        "runs": [probe_result_json(x) for x in r.runs],
        "causes": [x.to_json() for x in getattr(r, "confirmations", ()) or ()],
        **escalation_json(getattr(r, "escalation", None)),
    }
