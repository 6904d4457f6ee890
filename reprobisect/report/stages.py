"""Per-step, per-stage and per-module figures of how far two traces are apart.

The comparison engine (``reprobisect.core.compare``) names the *first* broken link; a
report also shows *how large* the difference is everywhere after it. This module walks
both traces step by step, pairs records by ``(kind, name)`` as the engine does, and asks
``compare_records`` (bitwise) for each pair whose fingerprints differ. Its figure is the
**relative difference** of the pair: the largest ``|a - b|`` over the largest ``|b|`` (the
tensor's scale, from the recorded stats), so a ReLU output that is 0 on one side does not
read as an infinite difference.

- With both full tensors stored it is measured exactly (``TensorDiff.max_abs``).
- Otherwise it is a lower bound from the recorded stats: ``|Δmin|``, ``|Δmax|``,
  ``|Δmean|`` and ``|Δnorm|/sqrt(n)`` never exceed the largest elementwise difference.
- A pair whose bits differ but whose stats cannot size it counts as differing with no
  figure (the plot's lower panel counts it).

Reading full tensors is bounded (``byte_budget``): past it, pairs are sized from stats,
and ``StageSeries.note`` says so. Stages are the record kinds in chain order
(``reprobisect.trace.format.KINDS``). Pure NumPy; no framework.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from reprobisect.core.compare import Tolerance, compare_records
from reprobisect.trace.format import KINDS, Record
from reprobisect.trace.reader import Trace

__all__ = ["StageSeries", "ModuleGrid", "RecordGap", "stage_differences", "module_of", "DEFAULT_BYTE_BUDGET"]

DEFAULT_BYTE_BUDGET = 512 * 2**20
"""Bytes of tensor shards read to measure differences before falling back to stats."""
MAX_MODULES = 40
"""Rows of the module heatmap (the modules with the largest differences, in chain order)."""
_BITWISE = Tolerance(mode="bitwise")
_LEAF_KINDS = ("init", "grad", "param", "optim_state")  # named by parameter: module = name minus its leaf


@dataclass(frozen=True)
class RecordGap:
    """One record pair at one step: its relative difference (0: bit-identical; None: differs, unsized)."""

    kind: str
    name: str
    rel: float | None
    source: str
    """``fingerprint`` (identical), ``tensors`` (measured), ``stats`` (lower bound) or ``none``."""


@dataclass(frozen=True)
class StageSeries:
    """Per step and stage: the largest relative difference and how many records differ."""

    steps: tuple[int, ...]
    stages: tuple[str, ...]
    """Record kinds present in either trace, in chain order."""
    rel: dict[str, tuple[float, ...]]
    """stage -> per step, the largest relative difference (0.0: all identical; NaN: stage absent at that step)."""
    differ: dict[str, tuple[int, ...]]
    """stage -> per step, records whose bits differ."""
    records: int
    measured: int
    """Pairs sized from full tensors."""
    estimated: int
    """Pairs sized from stats only (lower bounds)."""
    unsized: int
    """Pairs whose bits differ with nothing to size them."""
    note: str = ""

    @property
    def any_difference(self) -> bool:
        return any(any(v) for v in self.differ.values())


@dataclass(frozen=True)
class ModuleGrid:
    """Modules × stages at one step: the largest relative difference per cell."""

    step: int
    modules: tuple[str, ...]
    """Module paths (``module_of``) in chain order: where each one's first record appears in the
    step (``init`` records, which open step 0 in parameter-registration order, only for a module
    with no other record)."""
    stages: tuple[str, ...]
    values: tuple[tuple[float | None, ...], ...]
    """Row per module: per stage the figure (0.0 identical), NaN where the module has no
    record of that stage, None where bits differ but nothing sized it."""
    hidden: int = 0
    """Modules left out (only the ``MAX_MODULES`` with the largest differences are kept)."""
    labels: tuple[str, ...] = ()
    """Row labels, one per module: ``path (Class)`` where a record of the module names its class
    (``Record.module``), the path alone where none does (empty: the module paths are the labels)."""
    first: tuple[int, int] | None = None
    """(row, column) of the first broken link the comparison named, when it is in the grid."""

    def label(self, i: int) -> str:
        """Row ``i``'s label (its module path when no labels were given)."""
        return self.labels[i] if i < len(self.labels) else self.modules[i]


def module_of(rec: Record) -> str:
    """The module a record belongs to: an activation's module path (call and index suffixes
    dropped), a parameter's owner (``fc1.weight`` -> ``fc1``), else the kind's own name."""
    name = rec.name
    if rec.kind == "activation":
        return name.split("#", 1)[0].split("[", 1)[0] or "(model)"
    if rec.kind in _LEAF_KINDS:
        base = name.split("/", 1)[0]
        return base.rsplit(".", 1)[0] if "." in base else "(model)"
    return f"({rec.kind})"


def _scale(ra: Record, rb: Record) -> float:
    vals = [abs(v) for r in (rb, ra) for k in ("min", "max") if (v := r.stat(k)) is not None and math.isfinite(v)]
    return max(vals) if vals else 0.0


def _from_stats(ra: Record, rb: Record) -> float | None:
    """A lower bound on max |a - b| from the stats (None: the stats cannot show a difference)."""
    bounds = []
    for k in ("min", "max", "mean"):
        va, vb = ra.stat(k), rb.stat(k)
        if va is not None and vb is not None:
            bounds.append(abs(va - vb) if math.isfinite(va) and math.isfinite(vb) else (0.0 if va == vb else math.inf))
    na, nb = ra.stat("norm"), rb.stat("norm")
    n = math.prod(ra.shape) if ra.shape else 1
    if na is not None and nb is not None and n:
        bounds.append(abs(na - nb) / math.sqrt(n) if math.isfinite(na) and math.isfinite(nb) else (0.0 if na == nb else math.inf))
    for k in ("nan", "inf"):
        if (ra.stat(k) or 0) != (rb.stat(k) or 0):
            bounds.append(math.inf)
    best = max(bounds) if bounds else 0.0
    return best if best > 0 else None


class _Walker:
    """Sizes record pairs, reading full tensors while the byte budget lasts."""

    def __init__(self, a: Trace, b: Trace, byte_budget: int) -> None:
        self.a, self.b, self.budget = a, b, byte_budget
        self.measured = self.estimated = self.unsized = 0
        self.over_budget = False

    def _spent(self) -> int:
        return self.a.bytes_read + self.b.bytes_read

    def gap(self, step: int, ra: Record, rb: Record) -> RecordGap:
        if ra.fingerprint == rb.fingerprint and ra.dtype == rb.dtype and tuple(ra.shape) == tuple(rb.shape):
            return RecordGap(ra.kind, ra.name, 0.0, "fingerprint")
        if ra.dtype != rb.dtype or tuple(ra.shape) != tuple(rb.shape):
            self.unsized += 1
            return RecordGap(ra.kind, ra.name, None, "none")
        read = self._spent() < self.budget
        self.over_budget |= not read and ra.stored and rb.stored
        diff = compare_records(self.a if read else None, self.b if read else None, step, ra, rb, _BITWISE)
        scale = _scale(ra, rb)
        if diff.source == "tensors" and diff.max_abs is not None:
            self.measured += 1
            nonfinite = (diff.nan and diff.nan[0] != diff.nan[1]) or (diff.inf and diff.inf[0] != diff.inf[1])
            rel = math.inf if nonfinite else _relative(diff.max_abs, scale)
            return RecordGap(ra.kind, ra.name, rel, "tensors")
        bound = _from_stats(ra, rb)
        if bound is None:
            self.unsized += 1
            return RecordGap(ra.kind, ra.name, None, "none")
        self.estimated += 1
        return RecordGap(ra.kind, ra.name, _relative(bound, scale), "stats")


def _relative(abs_diff: float, scale: float) -> float:
    if not math.isfinite(abs_diff):
        return math.inf
    if abs_diff == 0:
        return 0.0
    return abs_diff / scale if scale > 0 else math.inf


def _pairs(a: Trace, b: Trace, step: int) -> Iterable[tuple[Record, Record]]:
    sa, sb = a.step(step), b.step(step)
    if sa is None or sb is None:
        return
    kb = sb.by_key()
    for ra in sa.records:
        rb = kb.get(ra.key)
        if rb is not None:
            yield ra, rb


def stage_differences(a: Trace, b: Trace, *, focus_step: int | None = None, first: tuple[str, str] | None = None,
                      byte_budget: int = DEFAULT_BYTE_BUDGET) -> tuple[StageSeries, ModuleGrid | None]:
    """The per-step stage series of ``a`` against ``b`` and the module grid at ``focus_step``
    (None: the first step where any record differs; no grid when none does). ``first``: the
    ``(kind, name)`` of the first broken link the comparison named at ``focus_step``, whose
    cell the grid marks (``ModuleGrid.first``)."""
    walker = _Walker(a, b, byte_budget)
    by_a = {s.step for s in a.steps}
    steps = tuple(s.step for s in b.steps if s.step in by_a)
    present = {r.kind for s in a.steps for r in s.records} | {r.kind for s in b.steps for r in s.records}
    stages = tuple(k for k in KINDS if k in present)
    rel = {k: [math.nan] * len(steps) for k in stages}
    differ = {k: [0] * len(steps) for k in stages}
    per_step: dict[int, list[RecordGap]] = {}
    n = 0
    for i, k in enumerate(steps):
        gaps = [walker.gap(k, ra, rb) for ra, rb in _pairs(a, b, k)]
        n += len(gaps)
        for g in gaps:
            cur = rel[g.kind][i]
            v = g.rel if g.rel is not None else 0.0
            rel[g.kind][i] = v if math.isnan(cur) else max(cur, v)
            differ[g.kind][i] += g.source != "fingerprint"
        if focus_step is None and any(g.source != "fingerprint" for g in gaps):
            focus_step = k
        if k == focus_step:
            per_step[k] = gaps
    note = ("the tensor-read budget ran out: later differences are sized from stats (lower bounds)"
            if walker.over_budget else "")
    series = StageSeries(steps, stages, {k: tuple(v) for k, v in rel.items()}, {k: tuple(v) for k, v in differ.items()},
                         n, walker.measured, walker.estimated, walker.unsized, note)
    grid = _grid(focus_step, per_step.get(focus_step, []), a, first) if focus_step is not None else None
    return series, grid


def _chain_position(recs: list[Record]) -> dict[str, int]:
    """Each module's place in the step's chain: where its first record appears, ``init``
    records counting only for a module with no other (at step 0 they come first, in the
    order parameters were registered, not the order the forward runs the modules)."""
    pos: dict[str, int] = {}
    late: dict[str, int] = {}
    for i, r in enumerate(recs):
        seen = late if r.kind == "init" else pos
        seen.setdefault(module_of(r), len(recs) + i if r.kind == "init" else i)
    return {**late, **pos}


def _classes(recs: list[Record]) -> dict[str, str]:
    """module path -> the class name a record of it holds (``Record.module``), when one does."""
    out: dict[str, str] = {}
    for r in recs:
        m = module_of(r)
        if r.module and not m.startswith("(") and m not in out:
            out[m] = r.module
    return out


def _grid(step: int, gaps: list[RecordGap], a: Trace, first: tuple[str, str] | None = None) -> ModuleGrid | None:
    """Modules × stages at ``step`` from the gaps of that step's records, modules in chain order."""
    if not gaps:
        return None
    in_step = list(a.step(step).records) if a.step(step) is not None else []
    recs = {r.key: r for r in in_step}
    cells: dict[str, dict[str, float | None]] = {}
    for g in gaps:
        rec = recs.get((g.kind, g.name))
        mod = module_of(rec) if rec is not None else g.name
        row = cells.setdefault(mod, {})
        old = row.get(g.kind, 0.0)
        if g.rel is None:
            row[g.kind] = old if old else None
        else:
            row[g.kind] = g.rel if old is None or old == 0.0 else max(old, g.rel)
    stages = tuple(k for k in KINDS if any(k in row for row in cells.values()))
    pos = _chain_position(in_step)
    order = sorted(cells, key=lambda m: pos.get(m, len(in_step) * 2))  # stable: unknown ones as first seen

    def worst(m: str) -> float:
        vals = [math.inf if v is None else v for v in cells[m].values()]
        return max(vals) if vals else 0.0

    keep = set(sorted(order, key=worst, reverse=True)[:MAX_MODULES])
    modules = tuple(m for m in order if m in keep)
    values = tuple(tuple(cells[m].get(s, math.nan) for s in stages) for m in modules)
    cls = _classes(in_step)
    labels = tuple(f"{m} ({cls[m]})" if m in cls else m for m in modules)
    return ModuleGrid(step, modules, stages, values, hidden=len(order) - len(modules), labels=labels,
                      first=_first_cell(first, recs, modules, stages))


def _first_cell(first: tuple[str, str] | None, recs: dict[tuple[str, str], Record], modules: tuple[str, ...],
                stages: tuple[str, ...]) -> tuple[int, int] | None:
    """The grid cell of the first broken link ``(kind, name)``, when its record is in the grid."""
    rec = recs.get(first) if first is not None else None
    if rec is None or rec.kind not in stages or module_of(rec) not in modules:
        return None
    return modules.index(module_of(rec)), stages.index(rec.kind)
