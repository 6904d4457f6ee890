"""What a comparison answers, as data: ``TensorDiff`` (one pair of records), ``Divergence``
(one record that does not agree, and where), ``StepSummary`` and ``Comparison`` (the whole
answer; truthy when the traces agree).

Frozen dataclasses serialisable to JSON by their ``to_json``; the text lives in
``reprobisect.render.comparison`` (``str(comparison)`` calls it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from reprobisect.core.compare.tolerance import Tolerance
from reprobisect.core.envdiff import EnvChange

__all__ = ["UNMEASURED", "VERDICTS", "unmeasured_fix", "TensorDiff", "Divergence", "StepSummary", "Comparison"]

VERDICTS = ("identical", "close", "diverged", "inconclusive", "missing", "shape", "dtype")
"""Per pair of records. ``inconclusive``: the bits differ under a value tolerance and nothing
measured how much (neither side stored the tensor, and the stats do not prove it beyond the
tolerance): not agreement, and not a divergence either."""

UNMEASURED = "bits differ, size not measured (no tensor stored)"
"""What an ``inconclusive`` pair says; the fix (``unmeasured_fix``) follows it in a verdict."""



def unmeasured_fix(step: int) -> str:
    """How to measure an ``inconclusive`` difference first seen at ``step``."""
    return f"re-run with --full-steps {step} or compare --zoom"


_MAX_NEXT = 5
"""How many divergences after the first a comparison keeps (``Comparison.next``)."""


@dataclass(frozen=True)
class TensorDiff:
    """How one pair of records compares, and what that was measured from.

    ``source`` says what the figures come from: ``fingerprint`` (bits equal, or differ
    with nothing stored to size it: ``inconclusive`` under a value tolerance), ``tensors`` (both full tensors were read), ``stats``
    (the recorded norm/min/max/mean/NaN/Inf only), ``structure`` (missing, shape, dtype).
    """

    verdict: str
    source: str
    detail: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    mismatched: int | None = None
    total: int | None = None
    first_index: tuple[int, ...] | None = None
    max_ulp: int | None = None
    stat_deltas: dict[str, float] | None = None
    nan: tuple[int, int] | None = None
    inf: tuple[int, int] | None = None
    atol: float | None = None
    rtol: float | None = None
    bitwise: bool = True

    def __bool__(self) -> bool:
        return self.verdict in ("identical", "close")

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "source": self.source,
            "detail": self.detail,
            "max_abs": _jf(self.max_abs),
            "max_rel": _jf(self.max_rel),
            "mismatched": self.mismatched,
            "total": self.total,
            "first_index": list(self.first_index) if self.first_index is not None else None,
            "max_ulp": self.max_ulp,
            "stat_deltas": {k: _jf(v) for k, v in self.stat_deltas.items()} if self.stat_deltas else None,
            "nan": list(self.nan) if self.nan else None,
            "inf": list(self.inf) if self.inf else None,
            "tolerance": "bitwise" if self.bitwise else {"atol": self.atol, "rtol": self.rtol},
        }


def _jf(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True)
class Divergence:
    """One record that does not agree: where it is in the chain, and how it differs.

    ``localization`` is ``origin`` (inputs agree, output does not: this is where the
    difference was introduced), ``propagation`` (it received a difference from earlier
    in the chain), ``between_modules`` (the first differing activation already had
    differing inputs and nothing recorded before it differed: the change happened in the
    parent's forward, between hooked modules), ``first`` (the first broken link for a
    record without module inputs: batch, loss, grad, ...), or ``unknown`` (an activation
    recorded without input fingerprints), or ``arrival`` (a collective's output whose input
    agrees on this rank: the difference arrived through the collective from another rank),
    or ``followed_init`` (the data order, batch IDs, differs in a step whose initial
    parameters already differed: named after the initialisation, as what followed it).
    """

    step: int
    kind: str
    name: str
    verdict: str
    diff: TensorDiff
    module: str | None = None
    origin: bool = False
    localization: str = "first"
    only_in: str | None = None  # 'a' or 'b' for verdict 'missing'
    order: int = -1
    sentinel: str | None = None
    """In a comparison of sentinel traces, the sentinel that showed it: ``batch ids``,
    ``batch``, ``init``, ``loss``, ``grad norm``, ``lr``, ``scaler scale`` or ``param``."""
    rank: int | None = None
    """In a comparison of multi-rank traces, the global rank it was seen on (None: single-rank)."""
    agree: tuple[int, ...] | None = None
    """Multi-rank: the other ranks whose same record agrees at this step (None: not asked)."""
    differ: tuple[int, ...] | None = None
    """Multi-rank: the other ranks whose same record differs at this step too."""

    def to_json(self) -> dict[str, Any]:
        d = {
            "step": self.step,
            "kind": self.kind,
            "name": self.name,
            "module": self.module,
            "verdict": self.verdict,
            "origin": self.origin,
            "localization": self.localization,
            "only_in": self.only_in,
            "order": self.order,
            "diff": self.diff.to_json(),
        }
        if self.sentinel is not None:
            d["sentinel"] = self.sentinel
        if self.rank is not None:
            d["rank"] = self.rank
            d["agree_ranks"] = list(self.agree) if self.agree is not None else None
            d["differ_ranks"] = list(self.differ) if self.differ is not None else None
        return d


@dataclass(frozen=True)
class StepSummary:
    """How many records of one step agree, and the largest measured difference in it."""

    step: int
    records: int
    identical: int
    close: int
    differ: int
    max_abs: float | None = None  # only when measurable from full tensors

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "records": self.records, "identical": self.identical, "close": self.close,
                "differ": self.differ, "max_abs": _jf(self.max_abs)}


@dataclass(frozen=True)
class Comparison:
    """The result of comparing two traces; truthy when they agree under the tolerance."""

    a: str
    b: str
    tolerance: Tolerance
    tolerance_reason: str
    env: tuple[EnvChange, ...]
    steps_a: tuple[int, ...]
    steps_b: tuple[int, ...]
    steps_compared: int
    records_compared: int
    first: Divergence | None
    next: tuple[Divergence, ...] = ()
    divergences: int = 0  # records that do not agree, in all compared steps
    per_step: tuple[StepSummary, ...] = ()
    structure: str = ""
    note: str = ""  # e.g. an incomplete side holding fewer steps: said, but not a divergence
    tensors_read: int = 0
    bytes_read: int = 0
    status_a: str = "complete"
    status_b: str = "complete"
    explanation: str = ""
    """A likely explanation shown under the first divergence (``lr differs: 0.001 vs 0.002
    at step 0`` next to a ``param`` divergence whose gradients agreed); ``reprobisect.core.hints``."""
    hints: tuple[str, ...] = ()
    """Likely causes the evidence supports (no seed set, string hashing); ``reprobisect.core.hints``."""
    detail_a: str = "full"
    """What trace A holds per step: ``full`` or ``sentinel`` (``Manifest.detail``)."""
    detail_b: str = "full"
    state_steps: tuple[int, ...] = ()
    """Steps after which both traces hold complete state (where a full-detail replay can start)."""
    ranks: tuple[int, ...] = ()
    """Multi-rank comparison: the ranks compared (rank r of A with rank r of B); empty: single-rank."""
    world_size_a: int = 1
    world_size_b: int = 1
    rank_firsts: tuple[Divergence, ...] = ()
    """Multi-rank: each rank's own first divergence (its rank set), in rank order: where the
    difference originates (``first``) and where it arrives through a collective (``arrival``)."""
    findings: tuple[str, ...] = ()
    """Multi-rank: what one trace shows about its own ranks (``reprobisect.core.distributed``):
    ranks whose parameters differ after a step, overlapping or missing samples, ..."""
    unmeasured: int = 0
    """Of ``divergences``, the records whose bits differ but whose size nothing measured
    (``inconclusive``). When every divergence is one, the verdict is ``inconclusive``."""

    def __bool__(self) -> bool:
        return self.first is None and not self.structure

    @property
    def sentinel(self) -> bool:
        """At least one side is a sentinel trace: sentinels were compared (``Divergence.sentinel``)."""
        return "sentinel" in (self.detail_a, self.detail_b)

    @property
    def replay_from(self) -> int | None:
        """The last step before the first divergence after which both traces hold complete
        state: a full-detail replay from there reaches the divergence. None when none."""
        if self.first is None:
            return None
        before = [s for s in self.state_steps if s < self.first.step]
        return before[-1] if before else None

    @property
    def origin(self) -> Divergence | None:
        """The first divergence that introduced a difference (not merely passed one on)."""
        for d in ((self.first,) if self.first is not None else ()) + self.next:
            if d.origin:
                return d
        return None

    @property
    def verdict(self) -> str:
        """``agree``, ``diverged`` (something measured beyond the tolerance, or a structural
        difference) or ``inconclusive`` (bits differ, nothing measured by how much). Only
        ``agree`` is truthy: an inconclusive comparison exits 1, as ``audit`` counts it."""
        if self:
            return "agree"
        return "inconclusive" if self.inconclusive else "diverged"

    @property
    def inconclusive(self) -> bool:
        """Every divergence is a bit difference nothing sized (no structural difference)."""
        return (self.first is not None and not self.structure and self.first.verdict == "inconclusive"
                and self.unmeasured >= self.divergences)

    @property
    def first_measured(self) -> Divergence | None:
        """The first kept divergence that was measured (not ``inconclusive``), or None."""
        for d in ((self.first,) if self.first is not None else ()) + self.next:
            if d.verdict != "inconclusive":
                return d
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "a": self.a,
            "b": self.b,
            "status": {"a": self.status_a, "b": self.status_b},
            "tolerance": {**self.tolerance.to_json(), "description": self.tolerance.describe(), "reason": self.tolerance_reason},
            "environment": [d.to_json() for d in self.env],
            "steps": {"a": list(self.steps_a), "b": list(self.steps_b), "compared": self.steps_compared},
            "structure": self.structure or None,
            "note": self.note or None,
            "records_compared": self.records_compared,
            "first": self.first.to_json() if self.first is not None else None,
            "next": [d.to_json() for d in self.next],
            "divergences": self.divergences,
            **({"unmeasured": self.unmeasured} if self.unmeasured else {}),
            "per_step": [s.to_json() for s in self.per_step],
            "tensors_read": self.tensors_read,
            "bytes_read": self.bytes_read,
            "explanation": self.explanation or None,
            "hints": list(self.hints),
            **({"detail": {"a": self.detail_a, "b": self.detail_b}, "state_steps": list(self.state_steps),
                "replay_from": self.replay_from} if self.sentinel else {}),  # full vs full: as before
            **({"ranks": list(self.ranks), "world_size": {"a": self.world_size_a, "b": self.world_size_b},
                "rank_firsts": [d.to_json() for d in self.rank_firsts],
                "findings": list(self.findings)} if self.ranks else {}),  # single-rank: as before
        }

    def __str__(self) -> str:
        # the text lives in the rendering package (a leaf: importing it here makes no cycle)
        from reprobisect.render.comparison import render_comparison

        return render_comparison(self)
