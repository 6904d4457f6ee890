"""``bisect audit``: the text summary and the audit result document (``--json``, the HTML's input).

The document's shape is the contract with ``bisect report`` (``version: 1``); keys may be
added, none removed or renamed. It starts with the envelope every ``--json`` document has
(``render.envelope``: ``kind: audit``, ``schema_version``, ``verdict``, ``exit_code``);
documents written before it say ``kind: reprobisect.audit`` and are still read. Reads results
by attribute only; imports nothing of reprobisect but ``render``: every name and line from the
config or a trace is printed with its control characters escaped (``printable``).
"""

from __future__ import annotations

from typing import Any

from reprobisect.render import envelope
from reprobisect.render.safe import printable, printable_lines

__all__ = ["audit_json", "render_audit"]

_MARK = {"bitwise": "PASS", "within-noise": "PASS", "diverged": "FAIL", "inconclusive": "INCONCLUSIVE"}


def _check_json(c: Any) -> dict[str, Any]:
    trend = c.trend.to_json() if c.trend is not None else {"last_pass": None, "failing_nights": 0, "nights": 0}
    return {
        "name": c.name, "check": c.check, "verdict": c.verdict, "passed": bool(c), "line": c.line,
        "first_divergence": c.first_divergence, "reason": c.reason, "command": list(c.command),
        "wall_s": round(c.wall_s, 3), "traces": dict(c.traces), "envdiff": list(c.envdiff),
        "culprit": c.culprit.to_json() if c.culprit is not None and c.culprit.commit else None,
        "bisect": c.culprit.line if c.culprit is not None else None,
        "noise": c.noise, "history": trend,
    }


def audit_json(result: Any) -> dict[str, Any]:
    """The audit result document (see ``/docs/audit.md`` and the report's contract); its
    ``exit_code`` is ``result.exit_code``, the status ``bisect audit`` exits with."""
    return envelope.document("audit", envelope.audit_verdict(result), result.exit_code, {
        "version": 1, "generator": "reprobisect", "config": result.config, "name": result.name,
        "started": result.started, "wall_s": round(result.wall_s, 3), "passed": bool(result),
        "revision": result.revision, "update_golden": result.updated,
        "results_dir": result.results_dir,
        "checks": [_check_json(c) for c in result.checks],
        "history": [{"night_id": n.night_id, "started": n.started, "check": n.check, "verdict": n.verdict,
                     "wall_s": round(n.wall_s, 3), "revision": n.revision, "line": n.line} for n in result.history],
    })


def render_audit(result: Any) -> str:
    """One line per check, then the culprits and the total."""
    lines = [f"audit '{printable(result.name)}'" + (" (recording goldens)" if result.updated else "")
             + (f" at {result.revision[:10]}" if result.revision else "")]
    for c in result.checks:
        lines.append(f"  {_MARK[c.verdict]:<12} {printable(c.name)} [{printable(c.check)}] {c.verdict}: "
                     f"{printable(c.line)} ({c.wall_s:.1f}s)")
        if c.culprit is not None:
            lines.append(f"               auto-bisect: {printable(c.culprit.line)}")
        if c.trend is not None and not bool(c):
            since = printable(c.trend.last_pass or "never")
            lines.append(f"               failing {c.trend.failing_nights} night(s); last passed: {since}")
    n = sum(1 for c in result.checks if c)
    lines.append(f"{n}/{len(result.checks)} passed in {result.wall_s:.1f}s")
    return printable_lines("\n".join(lines))
