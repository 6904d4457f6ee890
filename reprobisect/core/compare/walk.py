"""The walk: two traces in chain order, step by step, record by record (``compare_traces``).

The walk pairs the steps both traces hold (``structure``), judges each pair of records
(``numeric``) or scalar sentinels (``sentinel``), places each divergence in the chain
(``localize``), keeps the first divergence and the next few, counts every one, and
summarises each step. A sentinel trace against a full one compares what both hold and
says so in the note: the full side's activations, gradients and optimizer state are not
compared, nor the gradient norm (each level computes it its own way, so its bits differ).
A diverged comparison gets the likely explanation and hints its evidence supports
(``reprobisect.core.hints``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from reprobisect.core.compare.localize import _arrived, _localize
from reprobisect.core.compare.numeric import compare_records
from reprobisect.core.compare.results import _MAX_NEXT, Comparison, Divergence, StepSummary, TensorDiff
from reprobisect.core.compare.sentinel import _ABSENT, _KIND_RANK, _SCALAR_RANK, _scalar_diff, _scalar_pairs, _sentinel_of
from reprobisect.core.compare.structure import (
    _BATCH_IDS,
    _batch_diff,
    _compile_note,
    _missing_step,
    _not_recorded,
    _pair_records,
    _step_structure,
    _unobserved,
)
from reprobisect.core.compare.tolerance import Tolerance, _resolve_tolerance
from reprobisect.core.envdiff import diff_environments
from reprobisect.core.hints import divergence_hints, lr_note
from reprobisect.trace.format import SENTINEL_KINDS, Record, Step
from reprobisect.trace.reader import Trace

__all__ = ["compare_traces"]


def compare_traces(a: Trace, b: Trace, tolerance: Tolerance | None = None) -> Comparison:
    """Walk ``a`` and ``b`` step by step, record by record, and name the first broken link.

    ``tolerance`` None (or mode ``auto``) picks bitwise or default with ``choose_tolerance``.
    """
    reads0 = (a.tensors_read + b.tensors_read, a.bytes_read + b.bytes_read)
    tolerance, reason = _resolve_tolerance(a, b, tolerance)
    env = tuple(diff_environments(a.manifest.environment, b.manifest.environment))
    steps_a = tuple(s.step for s in a.steps)
    steps_b = tuple(s.step for s in b.steps)
    shape = _step_structure(a, b, steps_a, steps_b)
    walk = _Walk(a, b, tolerance)
    by_a = {s.step: s for s in a.steps}
    by_b = {s.step: s for s in b.steps}
    for k in shape.common:
        walk.step(k, by_a[k], by_b[k])
    note = _detail_note(_compile_note(shape.note, walk.not_recorded, walk.unobserved), walk)
    first = walk.divergences[0] if walk.divergences else None
    if first is None and shape.structure:
        first = _missing_step(shape)
    comp = Comparison(
        a=str(a.path),
        b=str(b.path),
        tolerance=tolerance,
        tolerance_reason=reason,
        env=env,
        steps_a=steps_a,
        steps_b=steps_b,
        steps_compared=len(shape.common),
        records_compared=walk.n_records,
        first=first,
        next=tuple(walk.divergences[1:]),
        divergences=walk.counted,
        unmeasured=walk.unmeasured,
        per_step=tuple(walk.summaries),
        structure=shape.structure,
        note=note,
        tensors_read=a.tensors_read + b.tensors_read - reads0[0],
        bytes_read=a.bytes_read + b.bytes_read - reads0[1],
        status_a=a.manifest.status,
        status_b=b.manifest.status,
        detail_a=walk.detail_a,
        detail_b=walk.detail_b,
        state_steps=tuple(sorted(set(a.state_steps) & set(b.state_steps))),
    )
    if first is not None and not shape.structure:
        comp = _with_hints(a, b, comp)
    return comp


@dataclass
class _Tally:
    """One step's running counts while it is walked."""

    records: int = 0  # records of this step on either side (a one-sided record counts once), + batch ids
    identical: int = 0
    close: int = 0
    differ: int = 0
    max_abs: float | None = None
    diverged_modules: list[str] = field(default_factory=list)  # containers of these, later in the step, only pass it on


class _Walk:
    """The walk through the common steps, in chain order: the first divergence and the next
    ``_MAX_NEXT`` kept, every divergence counted, one ``StepSummary`` per step."""

    def __init__(self, a: Trace, b: Trace, tolerance: Tolerance) -> None:
        self.a, self.b, self.tolerance = a, b, tolerance
        self.divergences: list[Divergence] = []  # the first 1 + _MAX_NEXT only
        self.counted = 0
        self.unmeasured = 0  # of those counted, bit differences nothing sized (``inconclusive``)
        self.n_records = 0
        self.summaries: list[StepSummary] = []
        self.unobserved = {"a": _unobserved(a), "b": _unobserved(b)}  # activations a compiled side could not record
        self.not_recorded = {"a": 0, "b": 0}  # one-sided activations skipped for that reason, per side lacking them
        self.detail_a, self.detail_b = a.manifest.detail, b.manifest.detail
        self.sentinel = "sentinel" in (self.detail_a, self.detail_b)  # compare the sentinels only
        self.mixed = self.detail_a != self.detail_b  # sentinel vs full: what both hold
        self.not_held = 0  # records only the full side holds (a sentinel trace never does)

    def keep(self, d: Divergence) -> None:
        self.counted += 1
        self.unmeasured += d.verdict == "inconclusive"
        if len(self.divergences) <= _MAX_NEXT:
            self.divergences.append(replace(d, sentinel=_sentinel_of(d)) if self.sentinel else d)

    def _first_place(self) -> dict[str, Any]:
        """A divergence found now is the origin (first broken link) when none came before it."""
        return {"origin": not self.divergences, "localization": "first" if not self.divergences else "propagation"}

    def step(self, k: int, sa: Step, sb: Step) -> None:
        self._sa, self._sb = sa, sb
        t = _Tally()
        if sa.batch_ids is not None and sb.batch_ids is not None:
            t.records += 1
        bd = _batch_diff(sa, sb)
        if bd is None and sa.batch_ids is not None and sb.batch_ids is not None:
            t.identical += 1
        order_pending = bd is not None  # the batch IDs are judged after the step's init records
        scalars_done = not self.sentinel  # sentinel: the step's scalars sit where its gradients would
        for ra, rb in _pair_records(sa, sb):
            kind = (ra or rb).kind  # type: ignore[union-attr]
            if order_pending and kind != "init":
                order_pending = False
                self._order(k, bd, t)  # type: ignore[arg-type]
            if self.sentinel and kind not in SENTINEL_KINDS:
                self.not_held += 1
                continue
            if not scalars_done and _KIND_RANK[kind] >= _SCALAR_RANK:
                scalars_done = True
                self._scalars(k, sa, sb, t)
            self.n_records += 1
            t.records += 1
            if ra is None or rb is None:
                self._one_sided(k, ra, rb, t)
            else:
                self._pair(k, ra, rb, t)
        if order_pending:
            self._order(k, bd, t)  # type: ignore[arg-type]
        if not scalars_done:
            self._scalars(k, sa, sb, t)
        self.summaries.append(StepSummary(k, t.records, t.identical, t.close, t.differ, t.max_abs))

    def _order(self, k: int, bd: TensorDiff, t: _Tally) -> None:
        """The step's batch IDs differ: the data order. The initial parameters (``init``,
        made before the first batch is drawn) come first in the run's own time, so a
        difference there is named first and the data order as what followed it
        (``followed_init``: an initialisation that draws from the global RNG moves the
        loader's shuffle too), never the other way round."""
        t.differ += 1
        place = self._first_place()
        if self.divergences and any(d.step == k and d.kind == "init" for d in self.divergences):
            place["localization"] = "followed_init"
        self.keep(Divergence(k, "batch", _BATCH_IDS, "diverged", bd, **place))

    def _scalars(self, k: int, sa: Step, sb: Step, t: _Tally) -> None:
        """The step's scalar sentinels: total gradient norm (not between detail levels: each
        computes it its own way), learning rates per group, GradScaler scale."""
        for name, va, vb in _scalar_pairs(sa.scalars, sb.scalars, grad_norm=not self.mixed):
            self.n_records += 1
            t.records += 1
            diff = _scalar_diff(name, va, vb, self.tolerance)
            if diff.verdict == "identical":
                t.identical += 1
                continue
            if diff.verdict == "close":
                t.close += 1
                continue
            t.differ += 1
            only = None if diff.verdict != "missing" else ("a" if vb is _ABSENT else "b")
            self.keep(Divergence(k, "scalar", name, diff.verdict, diff, only_in=only, **self._first_place()))

    def _one_sided(self, k: int, ra: Record | None, rb: Record | None, t: _Tally) -> None:
        r = ra or rb
        assert r is not None
        side = "a" if ra is not None else "b"
        other = "b" if side == "a" else "a"
        if _not_recorded(r, self.unobserved[other]):
            self.not_recorded[other] += 1  # not a structural difference: that side ran it compiled
            self.n_records -= 1
            return
        diff = TensorDiff("missing", "structure", detail=f"only in {side.upper()}")
        t.differ += 1
        self.keep(Divergence(k, r.kind, r.name, "missing", diff, module=r.module, **self._first_place(),
                             only_in=side, order=r.order))

    def _pair(self, k: int, ra: Record, rb: Record, t: _Tally) -> None:
        # Value tolerances need the tensors to tell close from diverged; bitwise only
        # reads them to size the first few divergences.
        measure = self.counted <= _MAX_NEXT or self.tolerance.rule(ra.kind, ra.name, ra.dtype) is not None
        diff = compare_records(self.a if measure else None, self.b if measure else None, k, ra, rb, self.tolerance)
        if diff.verdict == "identical":
            t.identical += 1
            return
        if diff.max_abs is not None and diff.source == "tensors":
            t.max_abs = diff.max_abs if t.max_abs is None else max(t.max_abs, diff.max_abs)
        if diff.verdict == "close":
            t.close += 1
            return
        t.differ += 1
        loc = _localize(ra, rb, bool(self.divergences), t.diverged_modules)
        if ra.kind == "collective" and _arrived(ra.name, self._sa, self._sb):
            loc = "arrival"
        if ra.kind == "activation":
            t.diverged_modules.append(ra.name)
        self.keep(Divergence(k, ra.kind, ra.name, diff.verdict, diff, module=ra.module or rb.module,
                             origin=loc in ("origin", "first"), localization=loc, order=ra.order))


def _detail_note(note: str, walk: "_Walk") -> str:
    """``note`` plus, when one side is a sentinel trace and the other a full one, what was compared."""
    if not walk.mixed:
        return note
    sides = f"trace A is {walk.detail_a}, trace B {walk.detail_b}"
    said = (f"{sides}: compared what both hold (batch, loss, learning rates, scale, parameters after each step); "
            f"{walk.not_held} record(s) only the full trace holds (activations, gradients, optimizer state) and the "
            "gradient norm (computed differently at each detail level) were not compared")
    return f"{note}; {said}" if note else said


def _with_hints(a: Trace, b: Trace, comp: Comparison) -> Comparison:
    """``comp`` with the likely explanation and hints the evidence supports (``reprobisect.core.hints``)."""
    try:  # a hint is a courtesy: never lose the comparison over one
        explanation = lr_note(a, b, comp) or ""
        found = tuple(divergence_hints(a, b, comp))
    except Exception:
        explanation, found = "", ()
    return replace(comp, explanation=explanation, hints=found)
