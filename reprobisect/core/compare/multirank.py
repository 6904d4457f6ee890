"""Multi-rank traces compared rank by rank (``compare_ranked``).

Multi-rank traces (``reprobisect.trace.ranks``: one shard per rank) are compared rank by
rank: rank r of A with rank r of B, steps aligned by optimizer step. The first divergence
is the first by step, then chain order, then lowest rank; it carries its ``rank`` and
which other ranks agree there (``Divergence.agree``/``differ``), and each rank's own first
divergence is kept (``Comparison.rank_firsts``). A different world size or backend (or a
flat trace against a multi-rank one) is listed first among the environment differences
and makes a structural difference; the ranks both hold are still compared.
``Comparison.findings`` holds what each trace shows about its own ranks
(``reprobisect.core.distributed``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from reprobisect.core.compare.numeric import compare_records
from reprobisect.core.compare.results import _MAX_NEXT, Comparison, Divergence, StepSummary
from reprobisect.core.compare.sentinel import _ABSENT, _KIND_RANK, _SCALAR_RANK
from reprobisect.core.compare.structure import _BATCH_IDS, _batch_diff, _ranges
from reprobisect.core.compare.tolerance import Tolerance, _resolve_tolerance
from reprobisect.core.compare.walk import compare_traces
from reprobisect.core.envdiff import EnvChange, diff_environments
from reprobisect.errors import UsageError
from reprobisect.trace.format import KINDS
from reprobisect.trace.reader import Trace

__all__ = ["compare_ranked"]


def _chain_key(d: Divergence, rank: int, t: Trace | None = None) -> tuple[Any, ...]:
    """Where a divergence sits among all ranks' divergences: by step, then chain order, then rank.

    Chain order is the record's place in its step (``Record.order``: the recorder writes a
    step's records in chain order, a collective of the forward before the activation it
    feeds); batch IDs come first (after the initial parameters), the step's scalars just before its first gradient
    (where the walk compares them), a missing step last. Without an order, the kind's place."""
    step = t.step(d.step) if t is not None else None
    if d.kind == "batch" and d.name == _BATCH_IDS:  # after the step's init records, as the walk judges them
        inits = [r.order for r in step.records if r.kind == "init" and r.order >= 0] if step is not None else []
        pos = max(inits) + 0.5 if inits else -1.0
    elif d.kind == "scalar":
        pos = _SCALAR_RANK - 0.5
        if step is not None:
            pos = next((float(r.order) - 0.5 for r in step.records if _KIND_RANK.get(r.kind, 0) >= _SCALAR_RANK
                        and r.order >= 0), float(len(step.records)))
    elif d.kind == "step":
        pos = float(1 << 30)
    elif d.order >= 0 and step is not None:
        pos = float(d.order)
    else:
        pos = float(_KIND_RANK.get(d.kind, len(KINDS)))
    return (d.step, pos, d.order, rank)


def _agreement(ta: Mapping[int, Trace], tb: Mapping[int, Trace], d: Divergence, ranks_: list[int],
               tolerance: Tolerance) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The other ranks whose record ``d`` names agrees / differs at ``d``'s step."""
    agree, differ = [], []
    for r in ranks_:
        if r == d.rank:
            continue
        sa, sb = ta[r].step(d.step), tb[r].step(d.step)
        if sa is None or sb is None:
            continue
        if d.kind == "batch" and d.name == _BATCH_IDS:
            (agree if _batch_diff(sa, sb) is None else differ).append(r)
            continue
        if d.kind == "scalar":
            va, vb = sa.scalars.get(d.name.split("[", 1)[0], _ABSENT), sb.scalars.get(d.name.split("[", 1)[0], _ABSENT)
            (agree if va == vb else differ).append(r)
            continue
        ra, rb = sa.by_key().get((d.kind, d.name)), sb.by_key().get((d.kind, d.name))
        if ra is None or rb is None:
            continue
        (agree if compare_records(None, None, d.step, ra, rb, tolerance) else differ).append(r)
    return tuple(agree), tuple(differ)


def _rank_env(ta: Mapping[int, Trace], tb: Mapping[int, Trace]) -> tuple[EnvChange, ...]:
    """Environment differences of rank 0 on both sides, world size and backend first."""
    def dist(t: Mapping[int, Trace]) -> dict[str, Any]:
        first = t[min(t)]
        d = first.manifest.extra.get("distributed") if isinstance(first.manifest.extra, dict) else None
        d = d if isinstance(d, dict) else {}
        return {"world_size": d.get("world_size") or len(t), "backend": d.get("backend")}

    da, db = dist(ta), dist(tb)
    head = [EnvChange(f"distributed.{k}", da[k], db[k], "numerics") for k in ("world_size", "backend") if da[k] != db[k]]
    shown = {c.path for c in head}
    rest = [c for c in diff_environments(ta[min(ta)].manifest.environment, tb[min(tb)].manifest.environment)
            if c.path not in shown]
    return tuple(head + rest)


def compare_ranked(ta: Mapping[int, Trace], tb: Mapping[int, Trace], tolerance: Tolerance | None = None, *,
                   a: str = "A", b: str = "B") -> Comparison:
    """Compare two traces read as ``{rank: Trace}``: rank r of A with rank r of B.

    The first divergence is the first by step, then chain order, then lowest rank; it
    carries its ``rank`` and which other ranks agree there. A different world size (or a
    flat trace against a multi-rank one) is an environment difference shown first and a
    structural difference; the ranks both hold are still compared.
    """
    from reprobisect.core import distributed as dist_checks

    common = sorted(set(ta) & set(tb))
    if not common:
        raise UsageError(f"traces '{a}' and '{b}' share no rank; nothing to compare")
    tolerance, reason = _resolve_tolerance(ta[common[0]], tb[common[0]], tolerance)
    per = {r: compare_traces(ta[r], tb[r], tolerance) for r in common}
    found = sorted(((_chain_key(d, r, ta[r]), replace(d, rank=r)) for r, c in per.items()
                    for d in ((c.first,) if c.first is not None else ()) + c.next), key=lambda kd: kd[0])
    divs = [d for _, d in found]
    first = divs[0] if divs else None
    if first is not None:
        agree, differ = _agreement(ta, tb, first, common, tolerance)
        first = replace(first, agree=agree, differ=differ)
    structure = [f"rank {r}: {per[r].structure}" for r in common if per[r].structure]
    only_a, only_b = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
    if only_a or only_b:
        said = [f"A has {len(ta)} rank(s), B has {len(tb)}"]
        said += [f"rank(s) {_ranges(o)} only in {side}" for side, o in (("A", only_a), ("B", only_b)) if o]
        structure.insert(0, "; ".join(said) + f" (compared rank(s) {_ranges(common)})")
    base = per[first.rank] if first is not None else per[common[0]]
    hints = list(base.hints) + dist_checks.rank_local_hints(per)
    per_step: dict[int, list[int]] = {}
    for c in per.values():
        for st in c.per_step:
            acc = per_step.setdefault(st.step, [0, 0, 0, 0])
            for i, v in enumerate((st.records, st.identical, st.close, st.differ)):
                acc[i] += v
    notes = [f"rank {r}: {per[r].note}" for r in common if per[r].note]
    return replace(
        base, a=a, b=b, tolerance=tolerance, tolerance_reason=reason, env=_rank_env(ta, tb),
        steps_a=tuple(s.step for s in ta[min(ta)].steps), steps_b=tuple(s.step for s in tb[min(tb)].steps),
        steps_compared=max(c.steps_compared for c in per.values()),
        records_compared=sum(c.records_compared for c in per.values()),
        first=first, next=tuple(divs[1:1 + _MAX_NEXT]), divergences=sum(c.divergences for c in per.values()),
        unmeasured=sum(c.unmeasured for c in per.values()),
        per_step=tuple(StepSummary(k, *v) for k, v in sorted(per_step.items())),
        structure="; ".join(structure), note="; ".join(notes),
        tensors_read=sum(c.tensors_read for c in per.values()), bytes_read=sum(c.bytes_read for c in per.values()),
        status_a=_top_status(ta), status_b=_top_status(tb), hints=tuple(dict.fromkeys(hints)),
        ranks=tuple(common), world_size_a=len(ta), world_size_b=len(tb),
        rank_firsts=tuple(replace(per[r].first, rank=r) for r in common if per[r].first is not None),
        findings=tuple(f"A: {f}" for f in dist_checks.findings(ta)) + tuple(f"B: {f}" for f in dist_checks.findings(tb)),
    )


def _top_status(t: Mapping[int, Trace]) -> str:
    statuses = [t[r].manifest.status for r in sorted(t)]
    return next((s for s in statuses if s != "complete"), "complete")
