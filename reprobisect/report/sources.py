"""What ``bisect report`` can be pointed at, and the ``Page`` each one makes.

Accepted sources (``ACCEPTED``):

- **two trace folders** ``A B`` (a tuple/list of two paths), or **a folder holding two
  traces** (``a``/``b``, ``a.trace``/``b.trace``, else the two in name order): compared
  with ``reprobisect.core.compare`` (tolerance ``auto`` unless one is given);
- **a ``bisect compare --json`` document** (a file): it names both traces (``a``, ``b``),
  its tolerance is reused, and its ``zoom`` (``--zoom``) gives the op-zoom table;
- **a ``bisect runs`` session**: its session log (``<git dir>/reprobisect/sessions/ID.jsonl``)
  or the folder holding ``sessions/`` (the newest log is taken); the culprit is the
  commit its re-check probed bad, compared with the parent it probed good, from the traces
  the result cache keeps (``cache/traces``) -- bitwise, as ``runs`` judges by default;
- **a ``bisect audit --json`` document** (a file, or the loaded dict: ``kind`` is
  ``audit``, or ``reprobisect.audit`` in documents written before the shared JSON envelope; ``/work/wt/audit_contract.md`` of issue 17): its checks, their
  traces in detail where a check did not pass bitwise, and its history.

Anything else is one ``UsageError`` naming the path and what is accepted. A document of a
version this reprobisect does not read (an audit document's ``version`` other than
``AUDIT_VERSIONS``, a compare document's ``schema_version`` or ``version`` other than
``COMPARE_VERSIONS``, a session log newer than ``SESSION_VERSION``) is refused the same
way, naming the version found and those read: its fields may mean something else, so a
page drawn from it could say the wrong thing. A document without a version is read as the
first one (documents written before versions were stamped, or by hand).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from reprobisect.core.compare import Comparison, Tolerance, compare_paths, compare_traces
from reprobisect.core.session import SessionLog
from reprobisect.errors import ReproError, TraceError, UsageError
from reprobisect.render.comparison import render_divergence
from reprobisect.report.page import Page, Verdict, View
from reprobisect.report.stages import stage_differences
from reprobisect.trace import ranks
from reprobisect.trace.jsonsafe import loads_bounded
from reprobisect.trace.outdir import is_trace_dir
from reprobisect.trace.reader import Trace, read_trace

__all__ = ["ACCEPTED", "AUDIT_KIND", "AUDIT_VERSIONS", "COMPARE_VERSIONS", "load_page", "pick_session", "session_logs",
           "trace_view"]

ACCEPTED = ("two trace folders (A B), a folder holding two traces, a 'bisect compare --json' file, "
            "a 'bisect runs' session log (sessions/ID.jsonl, or the folder holding sessions/), "
            "or a 'bisect audit --json' file")
AUDIT_KIND = "audit"
AUDIT_KINDS = (AUDIT_KIND, "reprobisect.audit")
"""``kind`` of an audit document: ``audit`` (the shared JSON envelope), ``reprobisect.audit`` before it."""
AUDIT_VERSIONS = (1,)
"""The audit document ``version`` values this reader knows (``render.audit.audit_json`` writes 1)."""
COMPARE_VERSIONS = (1,)
"""The ``bisect compare --json`` ``schema_version``/``version`` values this reader knows (today's documents carry
none: they are read as 1)."""
MAX_JSON_BYTES = 64 * 2**20
MAX_VIEWS = 8
"""Audit checks shown in detail at most (the page stays small)."""
_ZOOM_SEPARATOR = "::"  # reprobisect.workflows.zoom.SEPARATOR (not imported: it pulls in the executors)


def _bad(path: Any, why: str) -> UsageError:
    return UsageError(f"cannot report on '{path}': {why}; bisect report takes {ACCEPTED}")


def _known_version(doc: Mapping[str, Any], origin: Any, what: str, key: str, known: tuple[int, ...]) -> None:
    """Refuse ``doc`` when its ``key`` is present and not one of ``known`` (one line naming both)."""
    if key not in doc:
        return
    v = doc[key]
    if type(v) is not int or v not in known:
        reads = " or ".join(map(str, known))
        raise UsageError(f"cannot report on '{origin}': {what} {key} {v!r}, and this reprobisect reads {key} {reads}; "
                         "write it again with this reprobisect, or report on it with the reprobisect that wrote it")


def load_page(source: Any, *, tolerance: Tolerance | None = None) -> Page:
    """The page for ``source``: a path, a pair of paths, or a loaded audit document."""
    if isinstance(source, Mapping):
        if source.get("kind") not in AUDIT_KINDS:
            raise _bad("<document>", f"a document without kind '{AUDIT_KIND}'")
        _known_version(source, "<audit document>", "an audit document of", "version", AUDIT_VERSIONS)
        return audit_page(source, "<audit document>", tolerance)
    if isinstance(source, (list, tuple)):
        if len(source) != 2:
            raise _bad(" ".join(map(str, source)), f"{len(source)} paths given, not one or two")
        return comparison_page(str(source[0]), str(source[1]), tolerance)
    p = Path(source)
    if not p.exists():
        raise _bad(p, "no such file or folder")
    if p.is_dir():
        return _folder_page(p, tolerance)
    if p.suffix == ".jsonl":
        return runs_page(_session_log(p), tolerance)
    doc = _read_json(p)
    if isinstance(doc, dict) and doc.get("kind") in AUDIT_KINDS:
        _known_version(doc, p, "an audit document of", "version", AUDIT_VERSIONS)
        return audit_page(doc, str(p), tolerance)
    if isinstance(doc, dict) and isinstance(doc.get("a"), str) and isinstance(doc.get("b"), str) and "per_step" in doc:
        for key in ("schema_version", "version"):
            _known_version(doc, p, "a compare document of", key, COMPARE_VERSIONS)
        a, b = (_near(p, doc[k]) for k in ("a", "b"))
        return comparison_page(a, b, tolerance or _doc_tolerance(doc), zoom=doc.get("zoom"), origin=str(p))
    raise _bad(p, "a JSON file that is neither an audit result nor a compare document")


def _near(doc: Path, path: str) -> str:
    """A trace path a document names: as written, else relative to the document's folder."""
    if Path(path).is_absolute() or Path(path).exists() or not (doc.parent / path).exists():
        return path
    return str(doc.parent / path)


def _read_json(p: Path) -> Any:
    try:
        size = p.stat().st_size
        if size > MAX_JSON_BYTES:
            raise _bad(p, f"{size} bytes, more than a report source's {MAX_JSON_BYTES}")
        return loads_bounded(p.read_bytes())
    except (ValueError, TraceError):
        raise _bad(p, "not a JSON document") from None
    except OSError as e:
        raise _bad(p, f"cannot be read ({e.strerror or e})") from None


def _doc_tolerance(doc: Mapping[str, Any]) -> Tolerance | None:
    """The tolerance a ``compare --json`` document was judged under (None: auto)."""
    t = doc.get("tolerance")
    if not isinstance(t, dict) or t.get("mode") not in ("bitwise", "default", "explicit"):
        return None
    try:
        return Tolerance(mode=t["mode"], atol=t.get("atol"), rtol=t.get("rtol"), overrides=t.get("overrides") or {})
    except (ReproError, TypeError, ValueError):
        return None


def session_logs(folder: str | Path) -> list[Path]:
    """The session logs of a folder holding ``sessions/`` (``.git/reprobisect``), oldest first;
    empty when it holds none."""
    found = Path(folder) / "sessions"
    return sorted(found.glob("*.jsonl"), key=lambda f: (f.stat().st_mtime, f.name)) if found.is_dir() else []


def pick_session(folder: str | Path, session: str | None = None) -> Path:
    """The session log of ``folder`` that ``session`` names (its ID, or a prefix only one ID
    has), else the newest; a ``UsageError`` listing the IDs when none or several match."""
    p = Path(folder)
    logs = session_logs(p)
    if not logs:
        raise _bad(p, "its sessions/ folder holds no session log" if (p / "sessions").is_dir()
                   else "not a folder holding sessions/ (give --session only with .git/reprobisect or its like)")
    if session is None:
        return logs[-1]
    hits = [f for f in logs if f.stem == session] or [f for f in logs if f.stem.startswith(session)]
    if len(hits) != 1:
        ids = ", ".join(f.stem for f in reversed(logs[-10:]))
        how = "no session matches" if not hits else f"{len(hits)} sessions match"
        raise UsageError(f"--session {session}: {how} in {p / 'sessions'} (newest first: {ids}); "
                         "give one of these IDs")
    return hits[0]


def _folder_page(p: Path, tolerance: Tolerance | None) -> Page:
    if (p / "sessions").is_dir():
        return runs_page(_session_log(pick_session(p)), tolerance)
    if is_trace_dir(p) or ranks.is_multi_rank(p):
        raise _bad(p, "one trace; give the second one too (bisect report A B --html out.html)")
    traces = sorted(c for c in p.iterdir() if c.is_dir() and (is_trace_dir(c) or ranks.is_multi_rank(c)))
    names = {c.name: c for c in traces}
    for a, b in (("a", "b"), ("a.trace", "b.trace")):
        if a in names and b in names:
            return comparison_page(str(names[a]), str(names[b]), tolerance)
    if len(traces) != 2:
        raise _bad(p, f"a folder holding {len(traces)} trace(s), not two")
    return comparison_page(str(traces[0]), str(traces[1]), tolerance)


# ------------------------------------------------------------------------------ two traces


def _open(path: str) -> dict[int, Trace]:
    if ranks.is_multi_rank(path):
        return ranks.open_ranks(path, allow_incomplete=True)
    return {0: read_trace(path, allow_incomplete=True)}


def trace_view(title: str, a: str, b: str, tolerance: Tolerance | None, *, zoom: Any = None) -> View:
    """Compare traces ``a`` and ``b`` and size their differences (``TraceError`` when unreadable)."""
    ta, tb = _open(a), _open(b)
    if len(ta) == 1 and len(tb) == 1 and 0 in ta and 0 in tb and not ranks.is_multi_rank(a) and not ranks.is_multi_rank(b):
        comp = compare_traces(ta[0], tb[0], tolerance)
        rank = 0
    else:
        comp = compare_paths(a, b, tolerance=tolerance, allow_incomplete=True)
        rank = comp.first.rank if comp.first is not None and comp.first.rank in ta and comp.first.rank in tb \
            else min(set(ta) & set(tb), default=min(ta))
    series, grid = (None, None)
    if rank in ta and rank in tb:
        first = (comp.first.kind, comp.first.name) if comp.first is not None else None
        series, grid = stage_differences(ta[rank], tb[rank], focus_step=comp.first.step if comp.first else None,
                                         first=first)
    zoom = zoom if isinstance(zoom, dict) else None
    return View(title, comp, series, grid, zoom, _zoom_ops(zoom) if zoom else ())


def _zoom_ops(zoom: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """The zoomed module's ops side by side, from the zoom traces when they were kept."""
    pa, pb, module, step = zoom.get("trace_a"), zoom.get("trace_b"), zoom.get("module"), zoom.get("step")
    if not (isinstance(pa, str) and isinstance(pb, str) and isinstance(module, str) and isinstance(step, int)):
        return ()
    try:
        za, zb = read_trace(pa, allow_incomplete=True), read_trace(pb, allow_incomplete=True)
    except ReproError:
        return ()

    def ops(t: Trace) -> list[Any]:
        s = t.step(step)
        return [r for r in (s.records if s else ()) if r.name.startswith(module + _ZOOM_SEPARATOR)
                and r.meta and r.meta.get("zoom") and "ran" not in r.meta]

    rows = []
    for i, (ra, rb) in enumerate(zip(ops(za), ops(zb))):
        rows.append({"index": i, "record": ra.name, "op": (ra.meta or {}).get("op"),
                     "inputs_agree": tuple(ra.inputs or ()) == tuple(rb.inputs or ()) and ra.name == rb.name,
                     "output_agrees": ra.fingerprint == rb.fingerprint,
                     "norm_a": ra.stat("norm"), "norm_b": rb.stat("norm")})
    first = next((r["index"] for r in rows if not r["output_agrees"]), 0)
    return tuple(rows[max(0, first - 5): first + 25])


def _env_rows(comp: Comparison) -> tuple[tuple[str, str, str, str], ...]:
    return tuple((c.path, _show(c.a), _show(c.b), c.category) for c in comp.env)


def _show(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= 300 else s[:299] + "…"


def _comparison_verdict(comp: Comparison) -> Verdict:
    tol = f"tolerance: {comp.tolerance.describe()} ({comp.tolerance_reason})"
    partial = [f"trace {side} is {st}" for side, st in (("A", comp.status_a), ("B", comp.status_b)) if st != "complete"]
    if comp and partial:
        return Verdict("inconclusive", f"NO DIFFERENCE in the {comp.steps_compared} step(s) both hold, but "
                       + " and ".join(partial), (tol, "a run that did not finish cannot show that the rest agrees"))
    if comp:
        closes = sum(s.close for s in comp.per_step)
        extra = (f"{closes} record(s) differ in bits but are within tolerance",) if closes else ()
        return Verdict("pass", f"AGREE over {comp.steps_compared} step(s), {comp.records_compared} record(s)",
                       (tol, *extra))
    if comp.first is None:
        return Verdict("fail", "DIVERGED (structure)", (comp.structure, tol))
    lines = [render_divergence(comp.first, with_localization=True), tol]
    if comp.explanation:
        lines.append(f"likely explanation: {comp.explanation}")
    lines += [f"hint: {h}" for h in comp.hints]
    where = f"{comp.first.kind} '{comp.first.name}'"
    return Verdict("fail", f"DIVERGED at step {comp.first.step} · {where}", tuple(lines))


def comparison_page(a: str, b: str, tolerance: Tolerance | None, *, zoom: Any = None, origin: str = "") -> Page:
    """The page of one pair of traces."""
    for p in (a, b):
        if not Path(p).is_dir():
            raise _bad(p, "no trace folder there" + (f" (named by {origin})" if origin else ""))
    view = trace_view("A against B", a, b, tolerance, zoom=zoom)
    comp = view.comparison
    assert comp is not None
    facts = (("A", f"{comp.a} ({comp.status_a}, {len(comp.steps_a)} steps)"),
             ("B", f"{comp.b} ({comp.status_b}, {len(comp.steps_b)} steps)"),
             ("compared", f"{comp.steps_compared} step(s), {comp.records_compared} record(s), "
                          f"{comp.divergences} differing"))
    notes = tuple(x for x in (comp.note, comp.structure and f"structure: {comp.structure}") if x)
    return Page("comparison", "trace comparison", origin or f"{a} vs {b}", _comparison_verdict(comp), facts,
                _env_rows(comp), (), (view,), notes=notes)


# ------------------------------------------------------------------------------ runs


def _session_log(p: Path) -> SessionLog:
    try:
        return SessionLog.load(p)
    except UsageError as e:
        raise _bad(p, f"not a readable bisect runs session log ({str(e).split(';')[0]})") from None


def _cached_trace(cache: Path, commit: str) -> str | None:
    """The newest trace the result cache keeps for ``commit`` (re-checks are written last)."""
    found = []
    for f in (cache / "results").glob("*.json") if (cache / "results").is_dir() else ():
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        t = cache / "traces" / f.stem
        if isinstance(d, dict) and d.get("commit") == commit and d.get("trace") and (t / "manifest.json").is_file():
            found.append((f.stat().st_mtime, str(t)))
    return max(found)[1] if found else None


def _subject(repo: Any, commit: str) -> str:
    if not isinstance(repo, str) or not Path(repo).is_dir():
        return ""
    try:
        r = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%s", commit], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def runs_page(log: SessionLog, tolerance: Tolerance | None) -> Page:
    """The page of a ``bisect runs`` session: its culprit, its probes, the culprit against its parent."""
    h = log.header
    terms = h.get("terms") if isinstance(h.get("terms"), list) and len(h["terms"]) == 2 else ["good", "bad"]
    rechecks = {str(e.verdict): e.point for e in log.events if e.role == "recheck"}
    culprit, parent = rechecks.get("bad"), rechecks.get("good")
    probes = tuple({"point": e.point[:10], "role": e.role, "verdict": terms[0] if str(e.verdict) == "good" else
                    terms[1] if str(e.verdict) == "bad" else "skip", "reason": e.reason, "wall_s": e.wall_s,
                    "cached": e.cached} for e in log.events)
    facts = (("good", str(h.get("good", ""))), ("bad", str(h.get("bad", ""))),
             ("command", " ".join(map(str, h.get("command") or []))), ("check", str(h.get("check", ""))),
             ("steps", str(h.get("steps", ""))), ("session log", str(log.path)), ("probes", str(len(log.events))))
    if not (culprit and parent):
        why = "no re-check in this log: the session did not finish, found no single commit, or ran without re-check"
        return Page("runs", "bisect runs session", str(log.path), Verdict("inconclusive", "NO CULPRIT NAMED", (why,)),
                    facts, probes=probes)
    subject = _subject(h.get("repo"), culprit)
    headline = f"first {terms[1]} commit {culprit[:10]}" + (f" — {subject}" if subject else "")
    lines = [f"re-check: {parent[:10]} probed {terms[0]}, {culprit[:10]} probed {terms[1]}"]
    tol = tolerance or Tolerance(mode="bitwise")
    cache = log.path.parent.parent / "cache"
    ta, tb = _cached_trace(cache, parent), _cached_trace(cache, culprit)
    title = f"parent {parent[:10]} against culprit {culprit[:10]}"
    if ta is None or tb is None:
        view = View(title, None, problem=f"the result cache ({cache}) keeps no trace of "
                    f"{'the parent' if ta is None else 'the culprit'}: nothing to compare")
    else:
        try:
            view = trace_view(title, ta, tb, tol)
        except ReproError as e:
            view = View(title, None, problem=str(e))
    env: tuple[tuple[str, str, str, str], ...] = ()
    if view.comparison is not None:
        env = _env_rows(view.comparison)
        if view.comparison.first is not None:
            lines.append("first divergence inside the culprit: " + render_divergence(view.comparison.first))
    if tolerance is None:
        lines.append("compared bitwise, as bisect runs judges by default (the session log does not record a "
                     "tolerance: pass --tolerance to change it)")
    return Page("runs", "bisect runs session", str(log.path), Verdict("fail", headline, tuple(lines)), facts, env,
                views=(view,), probes=probes)


# ------------------------------------------------------------------------------ audit


def _str(x: Any) -> str:
    return "" if x is None else str(x)


def _audit_verdict(checks: Sequence[Mapping[str, Any]], doc: Mapping[str, Any]) -> Verdict:
    n = len(checks)
    counts: dict[str, int] = {}
    for c in checks:
        counts[_str(c.get("verdict")) or "inconclusive"] = counts.get(_str(c.get("verdict")) or "inconclusive", 0) + 1
    tally = ", ".join(f"{v} {k}" for k, v in counts.items())
    failed = [c for c in checks if not c.get("passed")]
    lines = [f"{_str(c.get('name'))}: {_str(c.get('verdict'))} — {_str(c.get('line') or c.get('reason'))}"
             for c in failed[:10]]
    if doc.get("passed") is True and not failed:
        return Verdict("pass", f"PASSED: all {n} check(s) bitwise or within noise", (tally,))
    status = "fail" if any(_str(c.get("verdict")) == "diverged" for c in failed) or not failed else "inconclusive"
    return Verdict(status, f"FAILED: {len(failed)} of {n} check(s) did not pass", (tally, *lines))


def _checks(doc: Mapping[str, Any], origin: str) -> list[Mapping[str, Any]]:
    checks = doc.get("checks")
    if not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
        raise _bad(origin, "an audit document whose 'checks' is not a list of objects")
    return checks


def audit_page(doc: Mapping[str, Any], origin: str, tolerance: Tolerance | None) -> Page:
    """The page of an audit result: the verdict, per-check table, details of failing checks, history."""
    checks = _checks(doc, origin)
    facts = tuple((k, _str(doc.get(k))) for k in ("name", "config", "started", "wall_s", "exit_code") if k in doc)
    env_lines = tuple(f"{_str(c.get('name'))}: {line}" for c in checks for line in (c.get("envdiff") or [])
                      if isinstance(line, str))
    views = []
    for c in checks:
        tr = c.get("traces") if isinstance(c.get("traces"), dict) else {}
        if _str(c.get("verdict")) not in ("diverged", "within-noise") or not tr.get("a") or not tr.get("b"):
            continue
        if len(views) == MAX_VIEWS:
            break
        title = f"check '{_str(c.get('name'))}' ({_str(c.get('check'))}): {_str(c.get('verdict'))}"
        try:
            views.append(trace_view(title, str(tr["a"]), str(tr["b"]), tolerance, zoom=c.get("zoom")))
        except ReproError as e:
            views.append(View(title, None, problem=str(e)))
    history = doc.get("history") if isinstance(doc.get("history"), list) else []
    return Page("audit", f"audit {_str(doc.get('name'))}".strip(), origin, _audit_verdict(checks, doc), facts,
                env_lines=env_lines, views=tuple(views), checks=tuple(checks),
                history=tuple(h for h in history if isinstance(h, dict)))

