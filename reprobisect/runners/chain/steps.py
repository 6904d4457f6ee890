"""What both recorders compute the same way for a step (framework-free).

Record names made unique within a step (``name#k``), the loss scalars from the step's loss
records, the first record holding NaN/Inf, JSON-safe floats, an optimizer's plain settings
and the combined fingerprint of a list of fingerprints.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable

__all__ = ["combine", "first_nonfinite", "json_float", "loss_scalars", "plain_settings", "unique"]


def unique(occ: dict[tuple[str, str], int], kind: str, base: str) -> str:
    """``base``, or ``base#k`` for its k-th repeat of ``kind`` counted in ``occ``."""
    k = occ.get((kind, base), 0)
    occ[(kind, base)] = k + 1
    return base if k == 0 else f"{base}#{k}"


def json_float(x: float) -> float | str:
    """``x``, or ``"nan"`` / ``"inf"`` / ``"-inf"`` (JSON has no such numbers)."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _plain(v: Any) -> Any:
    """``v`` as JSON when it is a plain bool, number or sequence of numbers (``betas``), else None
    (a tensor, variable or schedule is left out: reading it could wait on the device)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return json_float(float(v))
    if isinstance(v, (tuple, list)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [json_float(float(x)) for x in v]
    return None


def plain_settings(get: Any, keys: Iterable[str]) -> dict[str, Any]:
    """The optimizer settings ``keys`` that ``get(key)`` gives as plain values (``_plain``), by
    key: a torch param group's (``group.get``), a Keras optimizer's attributes."""
    out = {}
    for key in keys:
        v = _plain(get(key))
        if v is not None:
            out[key] = v
    return out


def combine(fingerprints: list[str]) -> str:
    """One fingerprint for a list of them, in order (an evaluation run's outputs)."""
    return hashlib.sha256("\n".join(fingerprints).encode()).hexdigest()[:32]


def loss_scalars(losses: list[Any], *, each: bool) -> dict[str, Any]:
    """``loss`` from the step's scalar loss records: the one, or the sum of several
    (accumulation: the mean loss when the loop divided each by their number); ``losses``,
    each of them, when ``each``. Empty unless every loss record is a scalar with stats."""
    s: dict[str, Any] = {}
    if losses and all(r.stats is not None and len(r.shape) == 0 for r in losses):
        s["loss"] = losses[0].stats["mean"] if len(losses) == 1 else json_float(
            math.fsum(r.stat("mean") for r in losses))
        if each and len(losses) > 1:
            s["losses"] = [r.stats["mean"] for r in losses]
    return s


def first_nonfinite(records: Iterable[Any], *, skip_grads: bool = False) -> str | None:
    """``kind 'name'`` of the first record holding NaN/Inf (``skip_grads``: gradients aside,
    a GradScaler's skipped step)."""
    for rec in records:
        if skip_grads and rec.kind == "grad":
            continue
        if rec.stats and (rec.stats.get("nan") or rec.stats.get("inf")):
            return f"{rec.kind} '{rec.name}'"
    return None
