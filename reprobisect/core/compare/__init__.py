"""The first-divergence engine: walk two traces in chain order and name the first broken link.

``compare_paths`` is the one entry: it reads and validates both traces and compares them
(``compare_traces``, or ``compare_ranked`` when either side holds one shard per rank).
The engine is in rooms, each with one job, importing one way (tolerance <- results <-
numeric, structure, sentinel, localize <- walk <- multirank <- this package):

- ``tolerance``: ``Tolerance``, ``POLICIES``, the per-dtype figures, ``choose_tolerance``;
- ``results``: ``TensorDiff``, ``Divergence``, ``StepSummary``, ``Comparison`` (data);
- ``numeric``: one pair of records, bits, tolerance and ULP (``compare_records``);
- ``structure``: which steps and records each side holds, batch IDs, compiled modules;
- ``sentinel``: the scalar sentinels and each record kind's place in the chain;
- ``localize``: origin, propagation, between modules, arrival through a collective;
- ``walk``: two traces step by step, record by record (``compare_traces``);
- ``multirank``: one shard per rank, rank r of A with rank r of B (``compare_ranked``).

Every public name is importable from here, as before the split. Pure NumPy
(bfloat16/float8 via ml_dtypes): no ML framework is imported here. The results are data;
``reprobisect.render.comparison`` says them (``str(comparison)`` calls it).
"""

from __future__ import annotations

import os

from reprobisect.core.compare.multirank import compare_ranked
from reprobisect.core.compare.numeric import compare_records
from reprobisect.core.compare.results import VERDICTS, Comparison, Divergence, StepSummary, TensorDiff
from reprobisect.core.compare.tolerance import DEFAULT_TOLERANCES, POLICIES, Tolerance, choose_tolerance
from reprobisect.core.compare.walk import compare_traces
from reprobisect.trace import ranks
from reprobisect.trace.reader import read_trace

__all__ = [
    "DEFAULT_TOLERANCES",
    "VERDICTS",
    "POLICIES",
    "Tolerance",
    "TensorDiff",
    "Divergence",
    "StepSummary",
    "Comparison",
    "choose_tolerance",
    "compare_records",
    "compare_traces",
    "compare_paths",
    "compare_ranked",
]


def compare_paths(
    a: str | os.PathLike, b: str | os.PathLike, *, tolerance: Tolerance | None = None, allow_incomplete: bool = False,
    verify: bool = False,
) -> Comparison:
    """Read and validate both traces, then ``compare_traces``; a bad trace raises ``TraceError``.

    ``verify``: check every file of both traces against its SHA-256 first (matching
    fingerprints are otherwise compared without reading the tensor shards they stand for).
    A multi-rank trace on either side (``reprobisect.trace.ranks``) is compared rank by rank
    (``compare_ranked``)."""
    if ranks.is_multi_rank(a) or ranks.is_multi_rank(b):
        ra = ranks.open_ranks(a, allow_incomplete=allow_incomplete, verify=verify)
        rb = ranks.open_ranks(b, allow_incomplete=allow_incomplete, verify=verify)
        return compare_ranked(ra, rb, tolerance, a=str(a), b=str(b))
    ta = read_trace(a, allow_incomplete=allow_incomplete, verify=verify)
    tb = read_trace(b, allow_incomplete=allow_incomplete, verify=verify)
    return compare_traces(ta, tb, tolerance)
