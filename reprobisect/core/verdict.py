"""Judging a probe: ``classify`` turns a probe's result into a ``Verdict`` (good / bad / skip).

A search asks one of three predicates of each point (``CHECKS``): ``match`` (the trace
equals a reference), ``repro`` (two runs at the same point agree) or ``finite`` (no
NaN/Inf). An ending that is not evidence about the code (``Outcome.is_evidence`` false:
skip, no_steps, timeout, infra) is always ``skip``, and so is a comparison whose only
differences are unmeasured (``inconclusive``): ``bad`` needs a measured divergence. ``compare_results`` compares two
probes' traces; ``summarize`` names a comparison's first divergence in one line.

Core: NumPy records only, no ML framework, no executor. A result is anything with the
``ProbeResult`` fields ``classify`` reads (``Judged``): this module does not import
``reprobisect.core.probe``, so that module can alias these names while callers move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from reprobisect.core.compare import Tolerance, compare_paths
from reprobisect.core.outcome import Outcome, Status, VerdictKind
from reprobisect.errors import ProbeError, UsageError
from reprobisect.trace.ranks import open_ranks
from reprobisect.trace.reader import Trace

__all__ = [
    "CHECKS",
    "VerdictKind",
    "Verdict",
    "Judged",
    "classify",
    "compare_results",
    "as_tolerance",
    "summarize",
    "nonfinite_in",
]

CHECKS = ("match", "repro", "finite")


@dataclass(frozen=True)
class Verdict:
    """What a probe says about the predicate: good, bad or skip, and why."""

    verdict: VerdictKind
    reason: str
    comparison: Any = None
    """The ``reprobisect.core.compare`` result when one was made."""
    check: str = ""

    def __post_init__(self) -> None:
        try:
            kind = VerdictKind(self.verdict)
        except ValueError:
            raise ValueError(
                f"unknown verdict '{self.verdict}' (one of {', '.join(v.value for v in VerdictKind)})"
            ) from None
        object.__setattr__(self, "verdict", kind)

    def __bool__(self) -> bool:
        return self.verdict is VerdictKind.GOOD

    def __str__(self) -> str:
        return f"{self.verdict}: {self.reason}"

    @property
    def exit_code(self) -> int:
        """git bisect run's convention: 0 good, 1 bad, 125 skip."""
        return {VerdictKind.GOOD: 0, VerdictKind.BAD: 1, VerdictKind.SKIP: 125}[self.verdict]

    def to_json(self) -> dict[str, Any]:
        comp = self.comparison
        if comp is not None and hasattr(comp, "to_json"):
            comp = comp.to_json()
        elif comp is not None:
            comp = str(comp)
        return {"verdict": self.verdict.value, "reason": self.reason, "check": self.check, "comparison": comp}


class Judged(Protocol):
    """What ``classify`` reads of a probe's result (``reprobisect.core.probe.ProbeResult``)."""

    @property
    def outcome(self) -> Outcome: ...

    @property
    def trace_dir(self) -> str | None: ...

    @property
    def spec(self) -> Any: ...


def _trace_path(x: Any) -> str | None:
    if x is None:
        return None
    if hasattr(x, "outcome") and hasattr(x, "trace_dir"):  # a probe's result
        return x.trace_dir
    if hasattr(x, "path") and hasattr(x, "manifest"):  # a Trace
        return str(x.path)
    return str(x)


def as_tolerance(tolerance: Any) -> Tolerance | None:
    """A ``reprobisect.core.compare.Tolerance`` from None (auto), 'bitwise', 'default',
    {'atol', 'rtol'} (explicit) or a ``Tolerance`` itself."""
    if tolerance is None or isinstance(tolerance, Tolerance):
        return tolerance
    if isinstance(tolerance, str):
        return Tolerance(mode=tolerance)
    if isinstance(tolerance, dict):
        return Tolerance(mode="explicit", atol=tolerance.get("atol"), rtol=tolerance.get("rtol"))
    raise UsageError(f"tolerance {tolerance!r} is not 'bitwise', 'default' or atol/rtol")


def compare_results(a: Any, b: Any, tolerance: Any = None) -> Any:
    """Compare two probes' traces (paths, ``Trace`` objects or ``ProbeResult``s): a ``Comparison``.

    ``tolerance`` as ``as_tolerance`` takes it. Incomplete traces are read up to their
    last whole step (a probe stopped at its step limit is complete; one that crashed is
    compared as far as it got).
    """
    pa, pb = _trace_path(a), _trace_path(b)
    if pa is None or pb is None:
        raise ProbeError("a probe left no trace to compare")
    return compare_paths(pa, pb, tolerance=as_tolerance(tolerance), allow_incomplete=True)


def nonfinite_in(trace_dir: str) -> str | None:
    """Name the first record or scalar holding NaN/Inf in a sealed trace, or None."""
    traces = open_ranks(trace_dir, allow_incomplete=True)
    found = []
    for rank, tr in traces.items():
        said = _nonfinite_in(tr)
        if said is not None:
            found.append((said[0], rank, said[1]))
    if not found:
        return None
    step, rank, said = min(found)
    return f"{said} (rank {rank})" if len(traces) > 1 else said


def _nonfinite_in(tr: Trace) -> tuple[int, str] | None:
    for st in tr.steps:
        for r in st.records:
            if (r.stat("nan") or 0) > 0 or (r.stat("inf") or 0) > 0:
                return st.step, f"{r.kind} '{r.name}' at step {st.step} holds NaN/Inf"
        for k, v in (st.scalars or {}).items():
            try:
                if isinstance(v, (int, float, str)) and not isinstance(v, bool) and not math.isfinite(float(v)):
                    return st.step, f"scalar '{k}' at step {st.step} is {v}"
            except ValueError:
                continue
    return None


_FAILED = (Status.CRASHED, Status.NONFINITE)


def classify(result: Judged, check: str, reference: Any = None, tolerance: Any = None) -> Verdict:
    """Judge one probe for ``check``.

    - ``finite``: good when the run stepped with no NaN/Inf in any record or scalar.
    - ``match``: good when the trace equals ``reference`` (a trace path, ``Trace`` or
      ``ProbeResult``) under ``tolerance``.
    - ``repro``: good when ``result`` and ``reference`` (a second result at the same
      commit) agree under ``tolerance``.

    An outcome that is not evidence (skip / timeout / infra / no_steps) gives ``skip`` (the
    caller retries the retryable ones: ``reprobisect.executors.retry``). ``crashed`` and
    ``nonfinite`` are ``bad`` for ``finite`` and ``match``: a crash is a behaviour change.
    For ``repro``, a crash on one side only is ``bad``; on both, ``skip`` (nothing to compare).
    """
    if check not in CHECKS:
        raise UsageError(f"unknown check '{check}'; use --check match, repro or finite")
    o = result.outcome
    if not o.is_evidence:
        return Verdict(VerdictKind.SKIP, f"probe could not test: {o}", check=check)
    if check == "finite":
        return _finite(result, check)
    if reference is None:
        need = "--reference TRACE" if check == "match" else "a second run at the same commit"
        raise UsageError(f"--check {check} needs {need}")
    if check == "match":
        if o.status in _FAILED:
            return Verdict(VerdictKind.BAD, f"{o} (the reference ran)", check=check)
        comp = compare_results(reference, result, tolerance)
        return _from_comparison(comp, check, "matches the reference", "differs from the reference")
    return _repro(result, reference, tolerance, check)


def _finite(result: Judged, check: str) -> Verdict:
    o = result.outcome
    if o.status in _FAILED:
        return Verdict(VerdictKind.BAD, str(o), check=check)
    where = nonfinite_in(result.trace_dir) if result.trace_dir else None
    if where:
        return Verdict(VerdictKind.BAD, where, check=check)
    return Verdict(VerdictKind.GOOD, f"no NaN/Inf in {result.spec.steps} step(s)", check=check)


def _repro(result: Judged, reference: Any, tolerance: Any, check: str) -> Verdict:
    o = result.outcome
    ro = reference.outcome if hasattr(reference, "outcome") else Outcome(Status.OK)
    if not ro.is_evidence:
        return Verdict(VerdictKind.SKIP, f"second run could not test: {ro}", check=check)
    if o.status is not Status.OK or ro.status is not Status.OK:
        if o.status == ro.status:
            return Verdict(VerdictKind.SKIP, f"both runs ended {o.status}; nothing to compare", check=check)
        return Verdict(VerdictKind.BAD, f"runs ended differently: {o} vs {ro}", check=check)
    comp = compare_results(reference, result, tolerance)
    return _from_comparison(comp, check, "two runs agree", "two runs differ")


def _from_comparison(comp: Any, check: str, good: str, bad: str) -> Verdict:
    """Good when ``comp`` agrees; bad only for a measured divergence. Bits that differ by an
    unmeasured amount (``inconclusive``: no tensor stored, the stats prove nothing) are not
    evidence either way: ``skip`` (git bisect's 125) with the reason and how to measure."""
    if bool(comp):
        return Verdict(VerdictKind.GOOD, good, comparison=comp, check=check)
    if getattr(comp, "verdict", "") == "inconclusive":
        d = comp.first
        why = (f"inconclusive: {bad} in bits at step {d.step}, {d.kind} '{d.name}', by an amount nothing measured "
               f"(no tensor stored); re-run with --full-steps {d.step} or a bitwise tolerance")
        return Verdict(VerdictKind.SKIP, why, comparison=comp, check=check)
    return Verdict(VerdictKind.BAD, f"{bad}: {summarize(comp)}", comparison=comp, check=check)


def summarize(comp: Any) -> str:
    """One line naming a comparison's first divergence (step, kind, tensor, module)."""
    d = getattr(comp, "first", None)
    if d is None:
        structure = getattr(comp, "structure", "")
        return structure or ("agree" if comp else "differ")
    mod = f" ({d.module})" if getattr(d, "module", None) else ""
    return f"first divergence at step {d.step}, {d.kind} '{d.name}'{mod}: {d.verdict}"
