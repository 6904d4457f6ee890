"""How ``bisect doctor`` reads: its ``Diagnosis`` as text and as ``--json``.

Reads the ``Diagnosis`` and ``Finding`` values of ``reprobisect.workflows.doctor`` by their
attributes. Text: one summary line, then the top finding with all its evidence (what a
person needs to believe it) and the next step, then every other finding above ``info``
with its evidence, then the ``info`` findings one line each. JSON: ``{"findings": [...]}``
most important first (plus the checks run, the command, the steps and the folders kept).
"""

from __future__ import annotations

import math
from typing import Any

from reprobisect.render.safe import printable_lines

__all__ = ["doctor_json", "render_doctor"]

_LABEL = {"error": "ERROR", "warning": "WARNING", "info": "info"}
_MAX_ITEMS = 16


def doctor_json(d: Any) -> dict[str, Any]:
    """The ``--json`` document: ``{"findings": [{"check","severity","cause","evidence","next"}, ...], ...}``."""
    return d.to_json()


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else str(v)
    if isinstance(v, (list, tuple)):
        items = [_value(x) for x in v[:_MAX_ITEMS]]
        more = f", ... ({len(v)} in all)" if len(v) > _MAX_ITEMS else ""
        return "[" + ", ".join(items) + more + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_value(x)}" for k, x in v.items() if x is not None)
    return str(v)


def _history(h: dict[str, Any]) -> list[str]:
    """The steps before (and at) a finding as a small table."""
    steps = h.get("steps") or []
    rows = ["    step  " + "  ".join(f"{s:>10}" for s in steps)]
    for key in ("loss", "grad_norm", "lr"):
        vals = h.get(key) or []
        if any(v is not None for v in vals):
            rows.append(f"    {key:<5} " + "  ".join(f"{_value(v):>10}" for v in vals))
    return rows


def _table(t: dict[str, Any]) -> list[str]:
    """Columns (name -> values, the first being the step) as rows: the overfit check's table."""
    cols = [k for k, v in t.items() if isinstance(v, list)]
    if not cols:
        return []
    rows = ["    " + "  ".join(f"{c:>10}" for c in cols)]
    for i in range(max(len(t[c]) for c in cols)):
        cells = []
        for c in cols:
            v = t[c][i] if i < len(t[c]) else None
            cells.append(f"{'' if v is None else (f'{v:.0%}' if c == 'accuracy' else _value(v)):>10}")
        rows.append("    " + "  ".join(cells))
    return rows


def _evidence(ev: dict[str, Any]) -> list[str]:
    lines = []
    for k, v in ev.items():
        if v is None or v == [] or v == {}:
            continue
        if k == "history" and isinstance(v, dict):
            lines.append("  the steps up to it:")
            lines += _history(v)
        elif k == "table" and isinstance(v, dict):
            lines.append("  table:")
            lines += _table(v)
        elif k == "kept" and isinstance(v, dict):
            lines.append("  kept:")
            lines += [f"    {kk.replace('_', ' ')}: {_value(vv)}" for kk, vv in v.items() if vv is not None]
        else:
            lines.append(f"  {k.replace('_', ' ')}: {_value(v)}")
    return lines


def _finding(f: Any, full: bool) -> list[str]:
    head = f"{_LABEL.get(f.severity, f.severity)} [{f.check}] {f.cause}"
    if not full:
        return [head]
    lines = [head, *_evidence(f.evidence)]
    if f.next:
        lines.append(f"  next: {f.next}")
    return lines


def render_doctor(d: Any) -> str:
    """The diagnosis as text: the top finding first, with its evidence and next step."""
    counts = {s: sum(1 for f in d.findings if f.severity == s) for s in ("error", "warning", "info")}
    took = f"; {d.wall_s:.1f} s" if d.wall_s is not None else ""
    framework = getattr(d, "framework", None)
    skipped = getattr(d, "not_applicable", None) or {}
    on = f"; {framework}" + (f", where {', '.join(skipped)} do not apply" if skipped else "") if framework else ""
    lines = [f"doctor: {counts['error']} error(s), {counts['warning']} warning(s) "
             f"(checks: {', '.join(d.checks)}; {d.steps} step(s){on}{took})"]
    if d.healthy:
        lines.append("nothing above info: the checks that ran found no problem")
    for i, f in enumerate(d.findings):
        lines.append("")
        lines += _finding(f, full=i == 0 or f.severity != "info")
    if d.traces:
        lines.append("")
        lines += [f"{label}: {path}" for label, path in d.traces.items()]
    return printable_lines("\n".join(lines))
