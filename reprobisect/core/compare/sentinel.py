"""Scalar sentinels and chain order: what a sentinel comparison compares besides records.

Sentinel traces (``--detail sentinel``: ``trace.format.SENTINEL_KINDS`` and
``SENTINEL_SCALARS``) are compared sentinel by sentinel, in the order a step makes them:
batch IDs, batch tensors, loss, total gradient norm, learning rates, GradScaler scale,
parameters after the step (the scalars sit where the gradients would); each divergence
names the sentinel that showed it (``Divergence.sentinel``). Here: the scalar sentinels
(paired, compared bitwise or within the tolerance's figures as ``scalar/NAME``), the name
of the sentinel a divergence shows, and each record kind's place in the chain.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from reprobisect.core.compare.results import Divergence, TensorDiff
from reprobisect.core.compare.structure import _BATCH_IDS
from reprobisect.core.compare.tolerance import Tolerance
from reprobisect.trace.format import KINDS, stat_value

__all__: list[str] = []

_KIND_RANK = {kind: i for i, kind in enumerate(KINDS)}
_SCALAR_RANK = _KIND_RANK["grad"]
_ABSENT = object()
_SCALAR_DTYPE = {"grad_norm": "float32", "scaler_scale": "float32"}  # for the tolerance's per-dtype figures; lr: float64


def _scalar_pairs(a: Mapping[str, Any], b: Mapping[str, Any], *, grad_norm: bool) -> Iterable[tuple[str, Any, Any]]:
    """``(name, value in A, value in B)`` of the scalar sentinels, in order (``_ABSENT``: not there)."""
    if grad_norm and ("grad_norm" in a or "grad_norm" in b):
        yield "grad_norm", a.get("grad_norm", _ABSENT), b.get("grad_norm", _ABSENT)
    la, lb = a.get("lr", _ABSENT), b.get("lr", _ABSENT)
    if isinstance(la, list) and isinstance(lb, list):
        n = max(len(la), len(lb))
        for g in range(n):
            yield ("lr" if n == 1 else f"lr[{g}]"), la[g] if g < len(la) else _ABSENT, lb[g] if g < len(lb) else _ABSENT
    elif la is not _ABSENT or lb is not _ABSENT:
        yield "lr", la, lb
    if "scaler_scale" in a or "scaler_scale" in b:
        yield "scaler_scale", a.get("scaler_scale", _ABSENT), b.get("scaler_scale", _ABSENT)


def _scalar_float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return stat_value(v)  # "nan", "inf", "-inf" as JSON keeps them
    except (KeyError, TypeError, ValueError):
        return None


def _scalar_diff(name: str, va: Any, vb: Any, tolerance: Tolerance) -> TensorDiff:
    """Compare one scalar sentinel: bitwise as recorded (a JSON float is the exact double),
    or within the tolerance's figures for its kind (``scalar/NAME`` for overrides)."""
    if va is _ABSENT or vb is _ABSENT:
        return TensorDiff("missing", "structure", detail=f"{name} only in {'A' if vb is _ABSENT else 'B'}")
    fa, fb = _scalar_float(va), _scalar_float(vb)
    if fa is None or fb is None:
        return TensorDiff("identical" if va == vb else "diverged", "scalar", detail="" if va == vb else f"{name} {va!r} vs {vb!r}")
    rule = tolerance.rule("scalar", name, _SCALAR_DTYPE.get(name.split("[", 1)[0], "float64"))
    kw: dict[str, Any] = {"bitwise": rule is None, "total": 1}
    if rule is not None:
        kw.update(atol=rule[0], rtol=rule[1])
    if fa == fb or (math.isnan(fa) and math.isnan(fb)):
        return TensorDiff("identical", "scalar", mismatched=0, **kw)
    finite = math.isfinite(fa) and math.isfinite(fb)
    absd = abs(fa - fb) if finite else math.inf
    rel = absd / abs(fb) if fb else math.inf
    close = rule is not None and finite and absd <= rule[0] + rule[1] * abs(fb)
    return TensorDiff("close" if close else "diverged", "scalar", detail=f"{name} {fa!r} vs {fb!r}",
                      max_abs=absd, max_rel=rel, mismatched=0 if close else 1, **kw)


def _sentinel_of(d: Divergence) -> str:
    """The sentinel a divergence of a sentinel comparison was seen in (``Divergence.sentinel``)."""
    if d.kind == "batch":
        return "batch ids" if d.name == _BATCH_IDS else "batch"
    if d.kind == "scalar":
        return d.name.split("[", 1)[0].replace("_", " ")
    return d.kind
