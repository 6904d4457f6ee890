"""The values the doctor returns: a ``Finding`` per thing a check saw, and the ``Diagnosis``.

Severities rank ``error`` > ``warning`` > ``info``; within one severity the checks rank
in ``CHECKS`` order, the order of the training-debugging guide's "first broken link": a
non-finite tensor breaks everything after it; then the update path (no update, nothing
else matters); then the fixed-batch test (can the model fit at all); then what enters the
loss (its contract) and the train/eval modes (wrong numbers from a working path); then
speed and memory (a working run that is slow or will run out); reproducibility last (it
compares two runs of whatever the run does). ``info`` findings say what a check looked at
and found healthy, or why it is inconclusive; they never make the exit status 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHECKS", "SEVERITIES", "Finding", "Diagnosis"]

CHECKS = ("finite", "update", "overfit", "contract", "modes", "input", "memory", "repro")
"""The checks that exist, in priority order (their names are the interface: ``--check NAME``)."""
SEVERITIES = ("error", "warning", "info")
"""Most important first."""
RUN = "run"
"""The ``check`` of a finding about the run itself (it crashed, timed out, never trained)."""


@dataclass(frozen=True)
class Finding:
    """One thing a check saw: the check, how bad, the cause in one sentence, the evidence
    (step, tensor, sample IDs, numbers; JSON-safe values) and the next thing to do."""

    check: str
    severity: str
    cause: str
    evidence: dict[str, Any] = field(default_factory=dict)
    next: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")

    @property
    def rank(self) -> tuple[int, int]:
        """Sort key: severity first, then the check's place in ``CHECKS`` (the run's own findings first)."""
        order = (RUN, *CHECKS)
        return SEVERITIES.index(self.severity), order.index(self.check) if self.check in order else len(order)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "cause": self.cause,
                "evidence": _json_safe(self.evidence), "next": self.next}


def _json_safe(x: Any) -> Any:
    """``x`` with non-finite floats as the strings a trace uses ("nan", "inf", "-inf"): strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


@dataclass(frozen=True)
class Diagnosis:
    """Every finding of the checks that ran, most important first."""

    findings: tuple[Finding, ...]
    checks: tuple[str, ...]
    """The checks that ran."""
    command: tuple[str, ...]
    steps: int
    """Optimizer steps each run was asked to record."""
    traces: dict[str, str] = field(default_factory=dict)
    """What was kept: label -> folder (empty without ``-o``)."""
    wall_s: float | None = None
    framework: str | None = None
    """``torch`` or ``tensorflow``: the recorder that recorded the run (None when none did)."""
    not_applicable: dict[str, str] = field(default_factory=dict)
    """Checks asked for that do not apply to this run's framework: check -> why (never a pass)."""

    @property
    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def healthy(self) -> bool:
        """Nothing above ``info``."""
        return all(f.severity == "info" for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    def to_json(self) -> dict[str, Any]:
        return {"findings": [f.to_json() for f in self.findings], "checks": list(self.checks),
                "command": list(self.command), "steps": self.steps, "traces": dict(self.traces),
                "wall_s": self.wall_s, "framework": self.framework, "not_applicable": dict(self.not_applicable)}


def ranked(findings: list[Finding]) -> tuple[Finding, ...]:
    """``findings`` most important first (stable within a rank: the order the check gave)."""
    return tuple(sorted(findings, key=lambda f: f.rank))
