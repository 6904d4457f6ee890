"""How ``bisect repro`` and ``bisect probe`` read: their results as text and as ``--json``.

Reads ``ReproResult``, ``ProbeReport`` and ``ProbeResult`` values
(``reprobisect.workflows.repro``, ``reprobisect.executors.base``) by their attributes; the
comparison inside is rendered by ``reprobisect.render.comparison``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from reprobisect.render.comparison import render_comparison
from reprobisect.render.safe import printable_lines

__all__ = ["cause_lines", "escalation_json", "escalation_lines", "probe_report_json", "probe_result_json", "render_probe_report",
           "render_repro", "repro_json", "without_answered_hints"]


def probe_result_json(r: Any) -> dict[str, Any]:
    """A ``ProbeResult`` as JSON (spec key + argv, outcome, trace, commit, host)."""
    return {
        "key": r.spec.key,
        "argv": list(r.spec.argv),
        "env": dict(r.spec.env),
        "python": r.spec.python,
        "outcome": r.outcome.to_json(),
        "trace": r.trace_dir,
        "commit": r.commit_ran,
        "host": r.host,
    }


# --------------------------------------------------------------------------- probe


def render_probe_report(report: Any) -> str:
    """Text for ``bisect probe``: the verdict where it ran, and the comparison when it is bad."""
    r = report.result
    where = f" at {r.commit_ran[:12]}" if r.commit_ran else ""
    lines = [f"{report.verdict.verdict}{where}: {report.verdict.reason}"]
    if report.verdict.verdict == "bad" and report.verdict.comparison is not None:
        lines.append(render_comparison(report.verdict.comparison))
        lines += escalation_lines(getattr(report, "escalation", None))
    return printable_lines("\n".join(lines))


def probe_report_json(report: Any) -> dict[str, Any]:
    """What ``bisect probe --json`` prints after the envelope (``render.envelope``): the probe's own
    verdict (good/bad/skip, its reason and comparison), the probe and the reference."""
    return {"probe_verdict": report.verdict.to_json(), "probe": probe_result_json(report.result), "reference": report.reference,
            **escalation_json(getattr(report, "escalation", None))}


# --------------------------------------------------------------------------- repro


def render_repro(result: Any) -> str:
    """Text for ``bisect repro``: the verdict, what the environment set, the first difference."""
    n = len(result.runs)
    lines = _environment_lines(result)
    first = result.first_difference
    if first is None:
        steps = result.runs[0].spec.steps
        lines.append(f"deterministic: {n} runs identical over {steps} step(s) ({_tol_text(result.tolerance)})")
    else:
        i, comp = first
        lines.append(f"NOT deterministic: run {i} differs from run 0 ({_tol_text(result.tolerance)})")
        lines.append(render_comparison(without_answered_hints(comp, result)))
        lines += escalation_lines(getattr(result, "escalation", None))
        lines += cause_lines(getattr(result, "confirmations", ()))
        if result.flakiness and getattr(result, "confirmed", None) is not None:
            lines.append("note: the difference did not show in every run, so one agreeing pair of re-runs is weak "
                         f"evidence; to be sure: {result.confirmed.check.replace('--runs 2', '--runs 5')}")
        if result.flakiness:
            lines.append(f"note: {result.flakiness}")
        # hint: lines come with the comparison (reprobisect.core.hints: only what the evidence supports)
        if not all(r.trace_dir and Path(r.trace_dir).exists() for r in result.runs):
            lines.append("(the traces were temporary; pass --keep or -o DIR to keep them for bisect compare)")
    return printable_lines("\n".join(lines))


def cause_lines(confirmations: Any) -> list[str]:
    """One line per candidate cause (``workflows.confirm.Confirmation``): ``confirmed: ...`` and
    ``not this: ...`` as they are, an untested one as a ``hint:`` question with its check."""
    return [c.text if c.agreed is not None else f"hint: {c.text}" for c in confirmations or ()]


def without_answered_hints(comp: Any, result: Any) -> Any:
    """``comp`` without the hints its confirmations answer (they are shown in their place), nor
    those whose candidate a confirmed cause left untried (``superseded_hints``)."""
    answered = {c.hint for c in getattr(result, "confirmations", ()) or () if c.hint}
    answered |= set(getattr(result, "superseded_hints", ()) or ())
    hints = tuple(getattr(comp, "hints", ()) or ())
    if not answered or not dataclasses.is_dataclass(comp) or not any(h in answered for h in hints):
        return comp
    return dataclasses.replace(comp, hints=tuple(h for h in hints if h not in answered))


def escalation_lines(esc: Any) -> list[str]:
    """The full-detail answer behind a sentinel divergence (``workflows.escalate.Escalation``):
    where it came from (replays, from which step) and the full chain's first broken link, or
    why there is none ("... is inconclusive: ..."); [] without one."""
    if esc is None:
        return []
    if esc.comparison is None:
        return [esc.reason]
    if bool(esc.comparison):
        return [f"{esc.reason}: the replays agree (the sentinel difference did not reproduce with full detail)"]
    return [f"{esc.reason}:", render_comparison(esc.comparison)]


def escalation_json(esc: Any) -> dict[str, Any]:
    """``{"escalation": ...}`` for a result's ``--json`` when it has one (else nothing: full
    detail prints as before)."""
    return {"escalation": esc.to_json()} if esc is not None else {}


def _environment_lines(result: Any) -> list[str]:
    """What the runs' environment set: hash seeds, variables, threads, determinism flags."""
    lines: list[str] = []
    seeds = [s for s in result.hashseeds if s is not None]
    if seeds:
        lines.append(f"PYTHONHASHSEED per run: {', '.join(seeds)}")
    env_vars = result.environment_set.get("env_vars") or {}
    if env_vars:
        lines.append("environment set: " + ", ".join(f"{k}={v}" for k, v in sorted(env_vars.items())))
    if "PYTHONHASHSEED" not in env_vars:
        lines.append("PYTHONHASHSEED: unset (string hashing, and so set order, is randomised per run)")
    threads = result.environment_set.get("threads") or {}
    if threads:
        lines.append("threads: " + ", ".join(f"{k}={v}" for k, v in sorted(threads.items())))
    det = result.environment_set.get("determinism") or {}
    if det:
        lines.append("determinism: " + ", ".join(f"{k}={v}" for k, v in sorted(det.items()) if not isinstance(v, dict)))
    return lines


def _tol_text(t: Any) -> str:
    """'bitwise', 'default', 'atol A, rtol R', or the whole description when overrides apply."""
    c = t.canonical() if hasattr(t, "canonical") else t  # a ``Tolerance`` (or its JSON form)
    if isinstance(c, dict) and "mode" in c:
        return t.describe()
    if isinstance(c, dict):
        return f"atol {c.get('atol', 0):g}, rtol {c.get('rtol', 0):g}"
    return str(c)


def repro_json(result: Any) -> dict[str, Any]:
    """What ``bisect repro --json`` prints."""
    return {
        "deterministic": result.deterministic,
        "tolerance": result.tolerance.canonical() if hasattr(result.tolerance, "canonical") else result.tolerance,
        "runs": [probe_result_json(r) for r in result.runs],
        "hashseeds": list(result.hashseeds),
        "environment_set": result.environment_set,
        "comparisons": [c.to_json() if hasattr(c, "to_json") else str(c) for c in result.comparisons],
        "places": list(result.places),
        "flakiness": result.flakiness or None,
        "causes": [c.to_json() for c in getattr(result, "confirmations", ()) or ()],
        **escalation_json(getattr(result, "escalation", None)),
    }
