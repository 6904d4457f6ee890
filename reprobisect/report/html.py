"""The report as one self-contained HTML file: ``write_report(source, out_path)``.

One file, nothing fetched: inline CSS, plots as inline SVG (``reprobisect.report.plots``),
no script, no font, no external URL. Every string that comes from a trace, a log or a
document is escaped, its control characters shown as ``\\x1b`` text first
(``render.safe.printable_lines``). The file is written atomically (a temp file in the
same folder, fsynced, then renamed), so a reader never sees half a report and a failed
write leaves nothing behind; and only to a new path or over a page reprobisect wrote (its
``<meta name='generator' content='reprobisect ...'>``; ``reprobisect.trace.outfile``),
checked before the source is read.

This is the entry point ``bisect audit --html`` calls (``/work/wt/audit_contract.md``):
``source`` is a path (an audit result JSON, a folder holding two traces, a ``bisect runs``
session), a pair of trace paths, or an already-loaded audit document.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from reprobisect import __version__
from reprobisect.core.compare import Tolerance
from reprobisect.render.comparison import format_number, render_divergence
from reprobisect.render.safe import printable_lines
from reprobisect.report import plots
from reprobisect.report.page import Page, View
from reprobisect.report.sources import load_page
from reprobisect.trace.outfile import HTML_GENERATOR, atomic_write, check_output_file

__all__ = ["write_report", "render_page"]

MAX_ENV_ROWS = 200
MAX_TABLE_ROWS = 300

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1100px;padding:18px;color:#1d1d1f}
h1{font-size:20px;margin:0 0 10px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.verdict{border-radius:8px;padding:12px 16px;margin:10px 0 16px;border-left:8px solid}
.verdict .head{font-size:19px;font-weight:700}.verdict ul{margin:6px 0 0;padding-left:18px}
.pass{background:#e8f5e9;border-color:#2e7d32}.fail{background:#ffebee;border-color:#c62828}
.inconclusive{background:#fff8e1;border-color:#f9a825}
table{border-collapse:collapse;margin:6px 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.tag{display:inline-block;padding:0 6px;border-radius:4px;font-size:12px;font-weight:600}
.t-bitwise{background:#c8e6c9}.t-within-noise{background:#dcedc8}.t-diverged{background:#ffcdd2}.t-inconclusive{background:#ffe082}
.plot svg{max-width:100%;height:auto}.muted{color:#666;font-size:12px}
pre.resume{background:#f7f7f9;border:1px solid #ddd;border-radius:6px;padding:8px 10px;white-space:pre-wrap}
"""


def _e(x: Any) -> str:
    return html.escape(printable_lines("" if x is None else x), quote=True)


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], *, raw: Sequence[int] = ()) -> str:
    """An HTML table (no header row when ``head`` is empty); cells are escaped except the
    columns in ``raw`` (already HTML)."""
    out = ["<table>" + ("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" if head else "")]
    for n, row in enumerate(rows):
        if n == MAX_TABLE_ROWS:
            out.append(f"<tr><td colspan='{max(1, len(head))}' class='muted'>… more rows not shown</td></tr>")
            break
        out.append("<tr>" + "".join(f"<td>{c if i in raw else _e(c)}</td>" for i, c in enumerate(row)) + "</tr>")
    return "".join(out) + "</table>"


def _tag(verdict: Any) -> str:
    v = _e(verdict)
    return f"<span class='tag t-{v}'>{v}</span>"


def _verdict(page: Page) -> str:
    v = page.verdict
    items = "".join(f"<li>{_e(line)}</li>" for line in v.lines if line)
    return (f"<section class='verdict {_e(v.status)}' id='verdict'><div class='head'>{_e(v.headline)}</div>"
            f"{'<ul>' + items + '</ul>' if items else ''}</section>")


def _env(page: Page) -> str:
    if page.env:
        rows = list(page.env)[:MAX_ENV_ROWS]
        more = f"<p class='muted'>… and {len(page.env) - MAX_ENV_ROWS} more</p>" if len(page.env) > MAX_ENV_ROWS else ""
        return "<h2>Environment differences</h2>" + _table(("key", "A", "B", "kind"), rows) + more
    if page.env_lines:
        return "<h2>Environment differences</h2><ul>" + "".join(
            f"<li class='mono'>{_e(x)}</li>" for x in page.env_lines[:MAX_ENV_ROWS]) + "</ul>"
    if page.kind == "audit" or any(v.comparison is not None for v in page.views):
        return "<h2>Environment differences</h2><p>none</p>"
    return ""


def _zoom(view: View) -> str:
    z = view.zoom
    if not z:
        return ""
    keys = ("verdict", "contradiction", "module", "step", "op", "occurrence", "record", "inner_module",
            "first_differing", "ops_a", "ops_b", "detail", "reruns")  # the zoom's disagreement with the banner: said
    rows = [(k, "; ".join(map(str, v)) if isinstance(v, list) else v) for k in keys if (v := z.get(k)) not in (None, "", [])]
    out = "<h3>Op zoom</h3>" + _table(("field", "value"), rows)
    if view.zoom_ops:
        rows = [(r["index"], r["record"], r["op"], "yes" if r["inputs_agree"] else "no",
                 "yes" if r["output_agrees"] else "no", format_number(r["norm_a"]), format_number(r["norm_b"]))
                for r in view.zoom_ops]
        out += _table(("#", "record", "op", "inputs agree", "output agrees", "norm A", "norm B"), rows)
    return out


def _outlined(g: Any, c: Any) -> str:
    """The caption's words on the outlined cell (the first broken link), or why none is."""
    if g.first is None or c is None or c.first is None:
        return ""
    i, _ = g.first
    return f" Outlined in red: the first broken link, {c.first.kind} '{c.first.name}' in {g.label(i)}."


def _view(view: View, n: int = 0) -> str:
    out = [f"<h2>{_e(view.title)}</h2>"]
    if view.problem:
        return out[0] + f"<p class='muted'>{_e(view.problem)}</p>"
    c = view.comparison
    if c is not None and c.first is not None:
        out.append(f"<p class='mono'>{_e(render_divergence(c.first, with_localization=True))}</p>")
    s = view.series
    if s is not None:
        first = c.first.step if c is not None and c.first is not None else None
        out.append("<h3>Largest relative difference per stage, per step</h3>")
        out.append(f"<div class='plot' data-plot='stages'>{plots.stage_plot(s, first_step=first, salt=f's{n}')}</div>")
        said = (f"{s.records} record pair(s): {s.measured} measured from full tensors, {s.estimated} sized from stats "
                f"(lower bounds), {s.unsized} differ without a size. Relative difference = max |a−b| / max |b|; "
                "gaps are bit-identical steps.")
        out.append(f"<p class='muted'>{_e(said)}{(' ' + _e(s.note)) if s.note else ''}</p>")
    g = view.grid
    if g is not None:
        out.append(f"<h3>Per-module differences at step {g.step}</h3>")
        out.append(f"<div class='plot' data-plot='modules'>{plots.module_heatmap(g, salt=f'm{n}')}</div>")
        hidden = f" {g.hidden} module(s) with smaller differences not shown." if g.hidden else ""
        out.append("<p class='muted'>rows: modules in chain order, labelled path (class) where the trace records "
                   "the class; grey: bit-identical; blank: no record; hatched: bits differ, not sized."
                   f"{_e(_outlined(g, c))}{_e(hidden)}</p>")
    out.append(_zoom(view))
    if c is not None and c.next:
        out.append("<h3>Next divergences</h3><ul>" + "".join(
            f"<li class='mono'>{_e(render_divergence(d))}</li>" for d in c.next) + "</ul>")
    return "".join(out)


def _checks(page: Page) -> str:
    if not page.checks:
        return ""
    rows = []
    for c in page.checks:
        culprit = c.get("culprit") if isinstance(c.get("culprit"), dict) else {}
        hist = c.get("history") if isinstance(c.get("history"), dict) else {}
        fd = c.get("first_divergence") if isinstance(c.get("first_divergence"), dict) else None
        where = " · ".join(str(fd.get(k)) for k in ("step", "stage", "tensor") if fd.get(k) is not None) if fd else ""
        if fd and fd.get("rank") is not None:
            where += f" (rank {fd.get('rank')})"
        summary = _str(c.get("line") or c.get("reason"))
        noise = c.get("noise") if isinstance(c.get("noise"), dict) else None
        if noise is not None and not _said(noise, summary):
            summary += f" ({_noise(noise)})"
        rows.append((_e(c.get("name")), _e(c.get("check")), _tag(c.get("verdict")), _e(summary),
                     _e(where), _e(culprit.get("line") or culprit.get("commit") or ""),
                     _e(hist.get("failing_nights", "")), _e(hist.get("last_pass") or ""),
                     _e(format_number(c["wall_s"]) if _number(c.get("wall_s")) else "")))
    head = ("check", "kind", "verdict", "summary", "first divergence", "culprit commit", "failing nights", "last pass",
            "wall s")
    return "<h2>Checks</h2>" + _table(head, rows, raw=range(len(head)))


def _noise(noise: dict[str, Any]) -> str:
    """What a check's ``noise`` says, from the keys it holds: a golden's band (``tensors``,
    ``max_rel``, ``runs``) or the tolerance a check agreed within; an absent figure reads
    "not recorded", never a placeholder."""
    if "tensors" in noise or "max_rel" in noise:
        n = noise.get("tensors")
        runs = noise.get("runs")
        src = f"{n} tensor(s)" if _count(n) else "tensors not recorded"
        src += f" of {runs} run(s)" if _count(runs) else ""
        rel = format_number(noise["max_rel"]) if _number(noise.get("max_rel")) else "not recorded"
        return f"noise band from {src}, max rel {rel}"
    if noise.get("tolerance"):
        return f"within tolerance: {_str(noise['tolerance'])}"
    return "noise band not recorded"


def _said(noise: dict[str, Any], summary: str) -> bool:
    """Whether the check's line already says its noise (``agree within tolerance (default)``)."""
    tol = noise.get("tolerance")
    return "tensors" not in noise and "max_rel" not in noise and bool(tol) and f"({tol})" in summary


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _str(x: Any) -> str:
    return "" if x is None else str(x)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _history(page: Page) -> str:
    if page.kind != "audit":
        return ""
    if not page.history:
        return "<h2>History</h2><p class='muted'>no earlier nights recorded</p>"
    nights = len({plots.night_key(h) for h in page.history})
    return (f"<h2>History ({nights} night(s))</h2>"
            f"<div class='plot' data-plot='history'>{plots.history_plot(page.history)}</div>")


def _resume_lines(c: dict[str, Any]) -> list[str]:
    """A ``resume`` check's verdict as ``bisect resume`` says it, from what the audit document
    holds: where and what differs (``first_divergence``; ``finding``'s why/also when the
    document carries one), the note, and the three runs' traces by role."""
    fd = c.get("first_divergence") if isinstance(c.get("first_divergence"), dict) else {}
    found = c.get("finding") if isinstance(c.get("finding"), dict) else {}
    lines = [_str(c.get("line") or c.get("reason")) or f"resume {_str(c.get('verdict'))}"]
    if fd.get("step") is not None:
        lines.append(f"resume differs at step {_str(fd.get('step'))}: {_str(fd.get('stage')) or 'component not recorded'}")
        lines.append(f"  what:  {_str(found.get('what') or fd.get('tensor')) or 'not recorded'}")
    if found.get("why"):
        lines.append(f"  why:   {_str(found['why'])}")
    if isinstance(found.get("also"), list) and found["also"]:
        lines.append("  also:  " + "; ".join(map(_str, found["also"])))
    if c.get("reason") and c.get("line"):
        lines.append(f"  note:  {_str(c['reason'])}")
    traces = c.get("traces") if isinstance(c.get("traces"), dict) else {}
    lines.append("runs:" if traces else "runs: no trace kept")
    lines += [f"  {_str(role):<13} {_str(path)}" for role, path in traces.items()]
    return lines


def _details(page: Page) -> str:
    """A section per ``resume`` check that did not pass: its verdict's lines (its three runs
    are not one pair of traces, so it has no plots)."""
    out = []
    for n, c in enumerate(page.checks):
        if _str(c.get("check")) != "resume" or c.get("passed") is True:
            continue
        out.append(f"<h2 id='check-{n}'>check '{_e(c.get('name'))}' (resume): {_e(c.get('verdict'))}</h2>"
                   f"<pre class='mono resume'>{_e(chr(10).join(_resume_lines(c)))}</pre>")
    return "".join(out)


def _probes(page: Page) -> str:
    if not page.probes:
        return ""
    rows = [(p["point"], p["role"], p["verdict"], p["reason"], format_number(p["wall_s"]) if _number(p["wall_s"]) else "",
             "yes" if p["cached"] else "") for p in page.probes]
    return "<h2>Probes</h2>" + _table(("commit", "role", "verdict", "reason", "wall s", "cached"), rows)


def render_page(page: Page) -> str:
    """The whole page as HTML text."""
    facts = _table((), page.facts) if page.facts else ""
    notes = "".join(f"<p class='muted'>{_e(n)}</p>" for n in page.notes)
    body = "".join([
        f"<h1>reprobisect report: {_e(page.title)}</h1>",
        _verdict(page),
        f"<p class='muted'>source: <span class='mono'>{_e(page.source)}</span></p>",
        facts, notes, _env(page), _checks(page), _history(page),
        "".join(_view(v, i) for i, v in enumerate(page.views)), _details(page), _probes(page),
    ])
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='generator' content='{HTML_GENERATOR} {_e(__version__)}'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{_e(page.verdict.headline)} · reprobisect</title><style>{_CSS}</style></head>"
            f"<body>{body}</body></html>\n")


def write_report(source: Any, out_path: str | os.PathLike, *, tolerance: Tolerance | None = None) -> Path:
    """Write the HTML report of ``source`` to ``out_path`` atomically; returns the path.

    ``source``: an audit result JSON file or dict, a ``compare --json`` file, a folder
    holding two traces, a pair of trace paths, or a ``bisect runs`` session (log or
    folder); ``reprobisect.report.sources``. Bad sources raise ``UsageError`` before
    anything is written."""
    out = check_output_file(out_path, "html", option="--html")  # before the source is read
    text = render_page(load_page(source, tolerance=tolerance))
    return atomic_write(out, lambda tmp: tmp.write_text(text, encoding="utf-8"), kind="html", option="--html")
