"""The text and JSON of ``bisect runs``: its answer, the lines it prints while it searches,
and where a comparison first diverges.

The workflow (``reprobisect.workflows.runs``) returns data (``RunsResult``); this module
turns it into what the user reads. It reads the result's fields and imports nothing of
the package but the rest of ``reprobisect.render`` (a leaf: the workflow imports it, never
the other way round).
"""

from __future__ import annotations

from typing import Any

from reprobisect.render import render_divergence
from reprobisect.render.comparison import init_lines
from reprobisect.render.safe import printable_lines

__all__ = [
    "render_result",
    "result_json",
    "commit_json",
    "divergence_place",
    "place_text",
    "divergence_text",
    "escalation_text",
    "verdict_reason",
    "probe_line",
    "output_lines",
    "named",
    "short",
    "clip",
]


# --------------------------------------------------------------------------- small pieces


def short(commit: str) -> str:
    """A commit hash as the answer shows it (10 characters)."""
    return commit[:10]


def named(commit: str, typed: str) -> str:
    """A commit as the user named it, with the hash beside it (``HEAD~2 (1a2b3c4d5e)``)."""
    if not typed or commit.startswith(typed.lower()):
        return short(commit)
    return f"{typed} ({short(commit)})"


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, with an ellipsis when something was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- where a comparison diverges


def place_text(step: Any, kind: Any, name: Any) -> str:
    """``step S · kind · name``: a place in a trace."""
    return f"step {step} · {kind} · {name}"


def divergence_place(comp: Any, *, structure_only: str | None) -> str | None:
    """``step S · kind · name`` of a comparison's first divergence; None when it agrees.

    ``structure_only`` is what a difference with no diverging tensor (the traces differ
    in structure only: steps or records missing) gives, and every caller says it:
    ``bisect runs`` passes None, because it compares places between runs to tell a
    verdict resting on noise, and a structural difference has no place to compare;
    ``bisect repro`` passes ``"structure"``, because it shows each run's place.
    """
    if comp is None or bool(comp):
        return None
    d = getattr(comp, "first", None)
    if d is None:
        return structure_only
    return place_text(d.step, d.kind, d.name)


def verdict_reason(v: Any) -> str:
    """A verdict's reason on one line (a comparison becomes its first divergence)."""
    comp = getattr(v, "comparison", None)
    if comp is not None and not bool(comp) and getattr(comp, "first", None) is not None:
        d = comp.first
        where = place_text(d.step, d.kind, d.name) + (f" ({d.module})" if d.module else "")
        return f"differs from the good commit's trace at {where}"
    if comp is not None and not bool(comp) and getattr(comp, "structure", ""):
        return f"differs from the good commit's trace: {comp.structure}"
    lines = [ln for ln in str(v.reason).splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def divergence_text(comp: Any) -> str:
    """The first divergence of a comparison that does not agree, as the answer shows it:
    the diverging tensor with its localization, the likely explanation, hints, the origin."""
    first = comp.first
    if first is None:
        return f"structure changed: {comp.structure}"
    text = "\n".join([render_divergence(first, with_localization=True), *init_lines(comp)])
    if getattr(comp, "explanation", ""):
        text += f"\n    ↳ likely explanation: {comp.explanation}"
    for h in list(getattr(comp, "hints", None) or ()):
        text += f"\n    hint: {h}"
    origin = comp.origin
    if origin is not None and origin is not first:
        text += "\n  origin (inputs agree, output differs): " + render_divergence(origin)
    return text


# --------------------------------------------------------------------------- while it searches


def probe_line(commit: str, verdict: str, terms: tuple[str, str], reason: str) -> str:
    """The line printed when a probe of the search is judged (``verdict`` in good/bad/skip)."""
    term = terms[0] if verdict == "good" else terms[1] if verdict == "bad" else "skip"
    return clip(f"  {short(commit)}  {term}  {reason}", 200)


def output_lines(tail: str) -> str:
    """The last lines a crashed command printed, indented under its probe line."""
    return "\n".join(f"      | {ln}" for ln in tail.splitlines())


# --------------------------------------------------------------------------- the answer


def commit_json(c: Any) -> dict[str, Any]:
    """A ``CommitSummary`` as JSON."""
    return {"hash": c.hash, "subject": c.subject, "author": c.author, "date": c.date, "diffstat": c.diffstat}


def result_json(r: Any) -> dict[str, Any]:
    """A ``RunsResult`` as the JSON ``bisect runs --json`` prints."""
    return {
        "found": bool(r),
        "inconclusive": r.inconclusive,
        "first_bad": commit_json(r.first_bad) if r.first_bad else None,
        "last_good": commit_json(r.last_good) if r.last_good else None,
        "candidates": [commit_json(c) for c in r.candidates],
        "skipped": [{"commit": c, "reason": why} for c, why in r.skipped],
        "divergence": r.divergence,
        "divergence_text": r.divergence_text,
        "reason": r.reason,
        "check": r.check,
        "terms": list(r.terms),
        "command": list(r.command),
        "range_size": r.range_size,
        "probes": r.probes,
        "runs": r.runs,
        "cached": r.cached,
        "rounds": r.rounds,
        "wall_s": r.wall_s,
        "recheck": r.recheck,
        "session_log": r.session_log,
        "resumed": r.resumed,
        "good": {"rev": r.good_rev, "hash": r.range_good},
        "bad": {"rev": r.bad_rev, "hash": r.range_bad},
        "replayed": r.replayed,
    }


def render_result(r: Any) -> str:
    """A ``RunsResult`` as text: the culprit (or candidates, or why it is inconclusive),
    the first divergence, the cost."""
    lines = _verdict_lines(r)
    if r.range_good and r.range_bad:
        lines.append(f"searched --good {named(r.range_good, r.good_rev)} .. --bad {named(r.range_bad, r.bad_rev)}")
    rounds = f"{r.rounds} rounds"
    if r.resumed:
        rounds += f" (resumed: {r.replayed} replayed from the session log)"
    recheck = "disagreed (inconclusive)" if r.recheck.startswith("disagreed") else r.recheck
    lines.append(
        f"{r.probes} commits judged of {r.range_size} in range, {rounds}, {r.runs} probe runs"
        f" ({r.cached} from cache), {r.wall_s:.1f} s; re-check {recheck}"
    )
    return printable_lines("\n".join(lines))


def _verdict_lines(r: Any) -> list[str]:
    """The head of the answer: the culprit, why it is inconclusive, or the candidates."""
    old, new = r.terms
    fb = r.first_bad
    if fb is not None and r.inconclusive is not None:
        return [f"inconclusive: {r.inconclusive}",
                f"    the search pointed at {fb.short} {fb.subject} (not confirmed: no culprit is named)"]
    if fb is not None:
        lines = [f"first {new} commit: {fb.hash}", f"    {fb.subject}"]
        if fb.author or fb.date:
            lines.append(f"    {fb.author}  {fb.date}".rstrip())
        lines += [f"    {ln.strip()}" for ln in fb.diffstat.splitlines()]
        if r.reason:
            lines.append(f"why {new}: {r.reason}")
        if r.last_good is not None:
            lg = named(r.last_good.hash, r.good_rev) if r.last_good.hash == r.range_good else r.last_good.short
            lines.append(f"first divergence against the last {old} commit {lg}: {r.divergence_text}")
        return lines
    if r.candidates:
        skipped = dict(r.skipped)
        return [f"the first {new} commit could be any of ({len(r.candidates)}; skipped commits border it):"] + [
            f"    {c.short} {c.subject}" + (f"  [skipped: {skipped[c.hash]}]" if c.hash in skipped else "")
            for c in r.candidates
        ]
    return [f"no first {new} commit found"]


def escalation_text(esc: Any) -> str:
    """The full-detail answer behind a sentinel divergence (``workflows.escalate``), or why none."""
    if esc.comparison is None:
        return esc.reason
    if bool(esc.comparison):
        return f"{esc.reason}: the replays agree (the sentinel difference did not reproduce with full detail)"
    return f"{esc.reason}:\n{divergence_text(esc.comparison)}"
