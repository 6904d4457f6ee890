"""The envelope every ``--json`` document starts with, and the one verdict vocabulary.

Each command answers its own question (a comparison agrees, a search names a commit, a
diagnosis finds a problem), but a script reading several commands' JSON should not need
one parser per command. So every document begins with the same four keys::

    {"kind": "compare", "schema_version": 1, "verdict": "diverged", "exit_code": 1, ...}

``kind`` is the command, ``schema_version`` the version of that kind's schema
(``docs/schemas/<kind>.schema.json``), ``verdict`` one word of ``VERDICTS`` and ``exit_code``
the status the process exits with; the command's own fields follow. ``KIND_VERDICTS`` says
which words each kind can give; the ``*_verdict`` functions map each command's own answer
onto them (read by attribute, like the rest of this package). The CLI passes the exit code
it returns, so the document and the process cannot disagree; an error (bad input, an
internal error) is ``error_document``.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = [
    "SCHEMA_VERSION",
    "VERDICTS",
    "KIND_VERDICTS",
    "document",
    "dumps",
    "error_document",
    "audit_verdict",
    "capture_verdict",
    "comparison_verdict",
    "demo_verdict",
    "doctor_verdict",
    "probe_verdict",
    "repro_verdict",
    "resume_verdict",
    "runs_verdict",
    "seeds_verdict",
]

SCHEMA_VERSION = 1
"""The version of every kind's schema; raised when a key is removed or changes meaning."""

VERDICTS = ("agree", "diverged", "within-noise", "inconclusive", "found", "not-found", "error")
"""Every word a document's ``verdict`` can be, whatever the command."""

KIND_VERDICTS: dict[str, tuple[str, ...]] = {
    "capture": ("agree", "diverged", "inconclusive", "error"),
    "compare": ("agree", "diverged", "inconclusive", "error"),
    "probe": ("agree", "diverged", "inconclusive", "error"),
    "repro": ("agree", "diverged", "inconclusive", "error"),
    "envs": ("agree", "diverged", "inconclusive", "error"),
    "seeds": ("agree", "diverged", "error"),
    "resume": ("agree", "diverged", "inconclusive", "error"),
    "doctor": ("agree", "diverged", "error"),
    "runs": ("found", "not-found", "inconclusive", "error"),
    "demo": ("found", "not-found", "error"),
    "audit": ("agree", "within-noise", "diverged", "inconclusive", "error"),
}
"""The verdicts each kind can give (its schema's enum): a subset of ``VERDICTS``."""

_ENVELOPE = ("kind", "schema_version", "verdict", "exit_code")


def document(kind: str, verdict: str, exit_code: int, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` (the command's own fields) behind the envelope.

    A body key that the envelope also holds must say the same thing (``compare``'s own
    ``verdict``, ``capture``'s ``exit_code``): a different value is a bug, not a choice.
    """
    if verdict not in KIND_VERDICTS.get(kind, ()):
        raise ValueError(f"verdict {verdict!r} is not one '{kind}' gives ({', '.join(KIND_VERDICTS.get(kind, ()))})")
    head = {"kind": kind, "schema_version": SCHEMA_VERSION, "verdict": verdict, "exit_code": int(exit_code)}
    for key in _ENVELOPE:
        if key in body and body[key] != head[key]:
            raise ValueError(f"'{kind}' document: its own {key!r} {body[key]!r} contradicts the envelope's {head[key]!r}")
    return {**head, **{k: v for k, v in body.items() if k not in head}}


def error_document(kind: str, exit_code: int, message: str) -> dict[str, Any]:
    """What a command given ``--json`` prints when it ends in an error: the envelope with
    ``verdict: error`` and the one line also printed on stderr."""
    return {"kind": kind, "schema_version": SCHEMA_VERSION, "verdict": "error", "exit_code": int(exit_code),
            "error": message}


def dumps(doc: Mapping[str, Any], indent: int = 2) -> str:
    """A document as the CLI prints it (indented: ``compare`` keeps its 1, the rest 2)."""
    return json.dumps(doc, indent=indent)


# --------------------------------------------------------------------------- each command's answer


def comparison_verdict(comparison: Any) -> str:
    """``compare``/``envs``: the comparison's own measured verdict (agree, diverged, inconclusive)."""
    return str(comparison.verdict)


def probe_verdict(verdict: Any) -> str:
    """``probe``: good → agree (the checkout passes the check), bad → diverged, skip → inconclusive."""
    return {"good": "agree", "bad": "diverged", "skip": "inconclusive"}[str(getattr(verdict.verdict, "value", verdict.verdict))]


def capture_verdict(exit_code: int) -> str:
    """``capture``, by its exit status (git bisect's convention, as ``probe --check finite``):
    0 the trace is complete → agree; 1 the command itself failed (crashed, NaN/Inf, never
    stepped an optimizer) → diverged; 125 it could not be tested (import failure, timeout,
    infra) → inconclusive."""
    return {0: "agree", 1: "diverged"}.get(int(exit_code), "inconclusive")


def repro_verdict(result: Any) -> str:
    """``repro``: every run agrees → agree; a measured difference → diverged; runs whose bits
    differ by an amount nothing measured → inconclusive."""
    if result:
        return "agree"
    said = {getattr(c, "verdict", "diverged") for c in result.comparisons if not c}
    return "diverged" if "diverged" in said or not said else "inconclusive"


def seeds_verdict(seed_map: Any) -> str:
    """``seeds``: nothing flagged → agree; a component that contradicts what it should do
    with the seed (or a seed's run that does not repeat) → diverged."""
    return "agree" if seed_map else "diverged"


def resume_verdict(result: Any) -> str:
    """``resume``: bitwise → agree; diverged → diverged; inconclusive → inconclusive."""
    return {"bitwise": "agree", "diverged": "diverged"}.get(result.verdict, "inconclusive")


def doctor_verdict(diagnosis: Any) -> str:
    """``doctor``: no finding above ``info`` → agree (no check failed: an ``info`` finding
    may still say a check could not decide); a warning or an error → diverged."""
    return "agree" if diagnosis.healthy else "diverged"


def runs_verdict(result: Any) -> str:
    """``runs``: one first bad commit named and re-checked → found; a culprit whose re-check
    disagreed, or a range it could be any of → inconclusive; nothing named → not-found."""
    if result:
        return "found"
    if result.first_bad is not None or result.candidates:
        return "inconclusive"
    return "not-found"


def demo_verdict(found_planted: bool) -> str:
    """``demo``: the search named the commit the demo planted → found, else not-found."""
    return "found" if found_planted else "not-found"


def audit_verdict(result: Any) -> str:
    """``audit``: every check passed → agree (all bitwise) or within-noise (one or more only
    within the noise band); else diverged when a check diverged, inconclusive when none did."""
    verdicts = {c.verdict for c in result.checks}
    if result:
        return "within-noise" if "within-noise" in verdicts else "agree"
    return "diverged" if "diverged" in verdicts else "inconclusive"
