"""The first-divergence engine: walk two traces in chain order and name the first broken link.

Steps are paired by number; inside a step, records are paired by ``(kind, name)`` and
visited in chain order (a record present on one side only is reported as ``missing`` at
the place it holds in its own trace). Equal fingerprints mean equal bits, so a pair of
identical traces is compared without reading a single full tensor. When fingerprints
differ, the tolerance decides: full tensors (when both sides stored them) give max abs /
max rel error, mismatch count, first mismatching index and ULP distance; otherwise the
recorded stats are used, and only when they prove the difference exceeds the tolerance;
a difference the stats cannot size is reported as diverged ("bits differ; no tensors
stored to measure"), never silently as close.

Layer-wise localization uses the fingerprints of each module's inputs that the recorder
keeps with its activation: the first activation whose inputs agree on both sides and
whose output does not is the *origin*; one whose inputs already differed is
*propagation*; if the first differing activation's inputs already differ and nothing
recorded before it diverged, the change happened between modules (in the parent's
forward code, outside any hooked module).

Sentinel traces (``--detail sentinel``: ``trace.format.SENTINEL_KINDS`` and
``SENTINEL_SCALARS``) are compared sentinel by sentinel, in the order a step makes them:
batch IDs, batch tensors, loss, total gradient norm, learning rates, GradScaler scale,
parameters after the step (the scalars sit where the gradients would); each divergence
names the sentinel that showed it (``Divergence.sentinel``). A sentinel trace against a
full one compares what both hold and says so in the note: the full side's activations,
gradients and optimizer state are not compared, nor the gradient norm (each level computes
it its own way, so its bits differ).

Multi-rank traces (``reprobisect.trace.ranks``: one shard per rank) are compared rank by
rank (``compare_ranked``, which ``compare_paths`` picks): rank r of A with rank r of B,
steps aligned by optimizer step. The first divergence is the first by step, then chain
order, then lowest rank; it carries its ``rank`` and which other ranks agree there
(``Divergence.agree``/``differ``), and each rank's own first divergence is kept
(``Comparison.rank_firsts``). A ``collective`` output whose input agrees on its rank is
localized as ``arrival`` (the difference came through the collective from another rank).
A different world size or backend (or a flat trace against a multi-rank one) is listed
first among the environment differences and makes a structural difference; the ranks both
hold are still compared. ``Comparison.findings`` holds what each trace shows about its own
ranks (``reprobisect.core.distributed``). Single-rank traces compare exactly as before.

Pure NumPy (bfloat16/float8 via ml_dtypes): no ML framework is imported here. The results
are data; ``reprobisect.render.comparison`` says them (``str(comparison)`` calls it).
"""

from __future__ import annotations

import fnmatch
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

import numpy as np

from reprobisect.core.checks import check_number
from reprobisect.core.hints import divergence_hints, lr_note
from reprobisect.core.envdiff import EnvChange, diff_environments
from reprobisect.errors import UsageError
from reprobisect.trace.format import KINDS, SENTINEL_KINDS, Record, Step, stat_value, tensor_key
from reprobisect.trace import ranks
from reprobisect.trace.reader import Trace, read_trace

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

VERDICTS = ("identical", "close", "diverged", "missing", "shape", "dtype")

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    # dtype: (atol, rtol) -- torch.testing.assert_close's figures
    "float16": (1e-5, 1e-3),
    "bfloat16": (1e-5, 1.6e-2),
    "float32": (1e-5, 1.3e-6),
    "float64": (1e-7, 1e-7),
    "complex64": (1e-5, 1.3e-6),
    "complex128": (1e-7, 1e-7),
    # float8 (assert_close has no figures): one machine epsilon relative, as float16 gets
    # (e4m3: 3 mantissa bits, eps 2**-3; e5m2: 2 bits, eps 2**-2), and the same atol.
    "float8_e4m3fn": (1e-5, 0.125),
    "float8_e4m3fnuz": (1e-5, 0.125),
    "float8_e5m2": (1e-5, 0.25),
    "float8_e5m2fnuz": (1e-5, 0.25),
}
"""Per-dtype (atol, rtol) of the ``default`` policy; any other dtype (integers, bool) is exact."""

# Keys under these prefixes are the code revision, not the environment: two commits run in
# the same environment still get the bitwise policy (any changed bit is the code's doing).
_REVISION_PREFIXES = ("git.",)

_MAX_NEXT = 5


# --------------------------------------------------------------------------------------
# tolerance


POLICIES = ("bitwise", "default")
"""What ``--tolerance`` (and a config file's ``tolerance:``) takes; ``--atol``/``--rtol`` give ``explicit``."""


def _rule_spec(spec: Any, where: str) -> tuple[float, float] | str:
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s in ("bitwise", "default"):
            return s
        parts = [p for p in s.replace(" ", "").split(",") if p]
        if len(parts) == 2:
            spec = parts
        else:
            raise UsageError(f"tolerance override {where}: '{spec}' is not 'bitwise', 'default' or 'ATOL,RTOL' (e.g. 1e-5,1e-4)")
    try:
        atol, rtol = (float(x) for x in spec)
    except (TypeError, ValueError):
        raise UsageError(f"tolerance override {where}: {spec!r} is not 'bitwise', 'default' or (atol, rtol)") from None
    if not (atol >= 0 and rtol >= 0) or math.isinf(atol) or math.isinf(rtol):
        raise UsageError(f"tolerance override {where}: atol and rtol must be finite and >= 0, got {atol}, {rtol}")
    return (atol, rtol)


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """How close two tensors must be to agree: a policy, optionally refined per tensor name."""

    mode: str = "auto"
    """``bitwise`` (bits equal), ``default`` (per-dtype figures, ``DEFAULT_TOLERANCES``),
    ``explicit`` (``atol``/``rtol`` for every floating tensor) or ``auto`` (bitwise when
    both traces share device and environment, else default; see ``choose_tolerance``)."""

    atol: float | None = None
    """Absolute tolerance of ``explicit`` mode (0 when only ``rtol`` is given)."""

    rtol: float | None = None
    """Relative tolerance of ``explicit`` mode, relative to trace B's value (0 when only ``atol`` is given)."""

    overrides: Any = ()
    """Per-tensor rules: a mapping (or pairs) from a glob on ``kind/name`` (``grad/*``,
    ``activation/encoder.*``) to ``(atol, rtol)``, ``'bitwise'`` or ``'default'``. The first
    matching glob wins; unmatched tensors follow ``mode``. Strings ``'1e-5,1e-4'`` are accepted."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "bitwise", "default", "explicit"):
            raise UsageError(f"unknown tolerance mode '{self.mode}' (bitwise, default, explicit or auto)")
        if self.mode == "explicit" and self.atol is None and self.rtol is None:
            raise UsageError("an explicit tolerance needs --atol and/or --rtol")
        for v, label in ((self.atol, "atol"), (self.rtol, "rtol")):
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise UsageError(f"{label} must be finite and >= 0, got {v}")
        items = self.overrides.items() if isinstance(self.overrides, Mapping) else self.overrides
        norm = tuple((str(k), _rule_spec(v, f"'{k}'")) for k, v in items)
        object.__setattr__(self, "overrides", norm)

    @classmethod
    def parse_override(cls, text: str) -> tuple[str, tuple[float, float] | str]:
        """Parse ``'grad/*=1e-5,1e-4'`` (or ``'param/*=bitwise'``) into a (glob, rule) pair."""
        if "=" not in text:
            raise UsageError(f"override '{text}' needs the form GLOB=ATOL,RTOL or GLOB=bitwise (e.g. 'grad/*=1e-5,1e-4')")
        glob, spec = text.split("=", 1)
        if not glob.strip():
            raise UsageError(f"override '{text}' has an empty glob; e.g. 'grad/*=1e-5,1e-4'")
        return glob.strip(), _rule_spec(spec, f"'{text}'")

    @classmethod
    def from_flags(cls, tolerance: str | None = None, atol: float | None = None, rtol: float | None = None,
                   overrides: Iterable[str] | Mapping[str, Any] = ()) -> "Tolerance | None":
        """The one road from flags (and config keys) to a ``Tolerance``; None when none is given.

        ``tolerance``: ``bitwise`` or ``default``; ``atol``/``rtol``: an explicit tolerance
        (not together with ``tolerance``); ``overrides``: ``GLOB=ATOL,RTOL`` texts (``--override``)
        or a mapping glob -> rule (a config file). Only overrides: mode ``auto``, which each
        command resolves to its own default (``compare``: by the traces' environments).
        """
        if tolerance is not None and tolerance not in POLICIES:
            raise UsageError(f"unknown tolerance '{tolerance}'; use bitwise or default (or --atol/--rtol)")
        for label, v in (("--atol", atol), ("--rtol", rtol)):
            if v is not None:
                check_number(label, v, minimum=0)
        explicit = atol is not None or rtol is not None
        if explicit and tolerance is not None:
            raise UsageError("give either --tolerance or --atol/--rtol, not both")
        if isinstance(overrides, Mapping):
            rules: tuple[Any, ...] = tuple((str(g), _rule_spec(v, f"'{g}'")) for g, v in overrides.items())
        else:
            rules = tuple(cls.parse_override(o) for o in overrides)
        if not explicit and tolerance is None and not rules:
            return None
        if explicit:
            return cls(mode="explicit", atol=atol, rtol=rtol, overrides=rules)
        return cls(mode=tolerance or "auto", overrides=rules)

    def resolved(self, default: str) -> "Tolerance":
        """This tolerance with mode ``auto`` replaced by ``default`` (a command's own policy)."""
        if self.mode != "auto":
            return self
        return Tolerance(mode=default, overrides=self.overrides)

    def canonical(self) -> str | dict[str, Any]:
        """A JSON value equal for equal settings (session cache keys, ``repro --json``).

        Without overrides it is the form earlier versions keyed sessions by (``'bitwise'``,
        ``'default'``, ``'auto'`` or ``{'atol', 'rtol'}``), so their session logs still match.
        """
        if self.overrides:
            rules = [[g, r if isinstance(r, str) else list(r)] for g, r in self.overrides]  # order: first match wins
            return {"mode": self.mode, "atol": self.atol, "rtol": self.rtol, "overrides": rules}
        if self.mode == "explicit":
            return {"atol": self.atol or 0.0, "rtol": self.rtol or 0.0}
        return self.mode

    def rule(self, kind: str, name: str, dtype: str) -> tuple[float, float] | None:
        """``None`` for bitwise comparison, else the ``(atol, rtol)`` that applies to this tensor."""
        key = tensor_key(kind, name)
        chosen: tuple[float, float] | str | None = None
        for glob, spec in self.overrides:
            if fnmatch.fnmatchcase(key, glob):
                chosen = spec
                break
        if chosen is None:
            chosen = {"bitwise": "bitwise", "auto": "bitwise", "default": "default"}.get(self.mode)
            if chosen is None:
                chosen = (self.atol or 0.0, self.rtol or 0.0)
        if chosen == "bitwise":
            return None
        if not _is_float(dtype):
            return (0.0, 0.0)  # integers and bool: exact in every value mode
        if chosen == "default":
            return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
        return chosen  # type: ignore[return-value]

    def describe(self) -> str:
        base = {
            "bitwise": "bitwise (bits must be equal)",
            "auto": "bitwise (bits must be equal)",
            "default": "default (per dtype, as torch.testing.assert_close)",
            "explicit": f"explicit (atol {self.atol or 0:g}, rtol {self.rtol or 0:g})",
        }[self.mode]
        if self.overrides:
            rules = ", ".join(f"{g}={s if isinstance(s, str) else f'{s[0]:g},{s[1]:g}'}" for g, s in self.overrides)
            base += f"; overrides {rules}"
        return base

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "atol": self.atol,
            "rtol": self.rtol,
            "overrides": {g: (s if isinstance(s, str) else list(s)) for g, s in self.overrides},
        }


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


# --------------------------------------------------------------------------------------
# environment


def choose_tolerance(a: Trace, b: Trace) -> tuple[Tolerance, str]:
    """The policy ``auto`` resolves to for these two traces, and why.

    Bitwise when both traces were recorded on the same device in the same environment
    (only launch information such as host, cwd or import paths, or the git revision,
    differs): then any bit difference is a real nondeterminism or code change. Otherwise ``default``: a
    different device, library or flag legitimately changes rounding.
    """
    diffs = [d for d in diff_environments(a.manifest.environment, b.manifest.environment)
             if not d.info and not (d.key + ".").startswith(_REVISION_PREFIXES)]
    if not diffs:
        return Tolerance(mode="bitwise"), "both traces share device and environment"
    shown = ", ".join(d.key for d in diffs[:3]) + (f" and {len(diffs) - 3} more" if len(diffs) > 3 else "")
    return Tolerance(mode="default"), f"the environments differ ({shown})"


# --------------------------------------------------------------------------------------
# per-tensor results


@dataclass(frozen=True)
class TensorDiff:
    """How one pair of records compares, and what that was measured from.

    ``source`` says what the figures come from: ``fingerprint`` (bits equal, or differ
    with nothing stored to size it), ``tensors`` (both full tensors were read), ``stats``
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


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        x = x.view(np.float32 if x.dtype.itemsize == 8 else np.float64)
    return x.view(_UINT[x.dtype.itemsize])


def _ulp_distance(a: np.ndarray, b: np.ndarray, valid: np.ndarray) -> int | None:
    """Largest distance in units in the last place over ``valid`` positions (IEEE floats only)."""
    if a.dtype.kind == "c" or a.dtype.itemsize not in (2, 4, 8) or not _is_float(str(a.dtype)):
        return None
    if not valid.any():
        return 0
    width = a.dtype.itemsize * 8
    ut = _UINT[a.dtype.itemsize]
    sign = ut(1 << (width - 1))
    ua, ub = a.view(ut)[valid].astype(np.uint64), b.view(ut)[valid].astype(np.uint64)
    bias = np.uint64(1 << 63)

    def ordered(u: np.ndarray) -> np.ndarray:
        mag = u & np.uint64(int(sign) - 1)
        neg = (u & np.uint64(int(sign))) != 0
        return np.where(neg, bias - mag, bias + mag)  # -0.0 and +0.0 both map to bias

    oa, ob = ordered(ua), ordered(ub)
    d = np.where(oa >= ob, oa - ob, ob - oa)
    return int(d.max())


_CHUNK = 1 << 20  # elements per chunk: metrics in bounded memory, chunks with equal bits skipped


@dataclass
class _Metrics:
    """Running figures of one tensor pair, chunk by chunk (``_measure``)."""

    is_float: bool
    ulp: int | None  # None: not an IEEE float of 2, 4 or 8 bytes (no ULP distance)
    count: int = 0  # mismatching elements
    nonfinite: int = 0  # of those, involving NaN/Inf
    first: int | None = None  # flat index of the first mismatch
    max_abs: float = 0.0
    max_rel: float = 0.0
    nan: list[int] = field(default_factory=lambda: [0, 0])
    inf: list[int] = field(default_factory=lambda: [0, 0])
    any_bits: bool = False  # some bits differ


def _measure(x: np.ndarray, y: np.ndarray, rule: tuple[float, float] | None, dtype: str) -> TensorDiff:
    """Metrics from two full tensors of the same dtype and shape, chunk by chunk."""
    total = int(x.size)
    if total == 0:
        return TensorDiff("identical", "tensors", total=0, mismatched=0, bitwise=rule is None)
    is_float = _is_float(dtype)
    fx, fy = x.reshape(-1), y.reshape(-1)
    bx, by = _bits(fx), _bits(fy)
    lanes = bx.size // fx.size  # 2 for complex (real, imaginary)
    m = _Metrics(is_float, 0 if is_float and x.dtype.kind != "c" and x.dtype.itemsize in (2, 4, 8) else None)
    with np.errstate(all="ignore"):
        for lo in range(0, total, _CHUNK):
            hi = min(total, lo + _CHUNK)
            bit_diff = bx[lo * lanes : hi * lanes] != by[lo * lanes : hi * lanes]
            if lanes > 1:
                bit_diff = bit_diff.reshape(-1, lanes).any(-1)
            _measure_chunk(m, fx[lo:hi], fy[lo:hi], bit_diff, lo, rule)
    return _measured(m, x.shape, total, rule)


def _measure_chunk(m: _Metrics, xa: np.ndarray, ya: np.ndarray, bit_diff: np.ndarray, lo: int,
                   rule: tuple[float, float] | None) -> None:
    """Fold one chunk (flat elements from ``lo``) into ``m``; a chunk with equal bits adds only NaN/Inf counts."""
    if m.is_float:
        wide = np.complex128 if xa.dtype.kind == "c" else np.float64
        fa, fb = xa.astype(wide), ya.astype(wide)
        nan_a, nan_b = np.isnan(fa), np.isnan(fb)
        m.nan[0] += int(nan_a.sum())
        m.nan[1] += int(nan_b.sum())
        m.inf[0] += int(np.isinf(fa).sum())
        m.inf[1] += int(np.isinf(fb).sum())
    if not bit_diff.any():
        return
    m.any_bits = True
    if not m.is_float:
        fa, fb = xa.astype(np.float64), ya.astype(np.float64)
        nan_a = nan_b = np.zeros(fa.shape, bool)
    both_finite = np.isfinite(fa) & np.isfinite(fb)
    absdiff = np.where(both_finite, np.abs(fa - fb), 0.0)
    absb = np.abs(fb)
    if rule is None:
        mismatch = bit_diff
    else:
        atol, rtol = rule
        same = (fa == fb) | (nan_a & nan_b)  # -0.0 == 0.0, inf == inf, NaN by position
        mismatch = ~same & ~(both_finite & (absdiff <= atol + rtol * np.where(both_finite, absb, 0.0)))
    c = int(np.count_nonzero(mismatch))
    if c and m.first is None:
        m.first = lo + int(np.argmax(mismatch))
    m.count += c
    m.nonfinite += int(np.count_nonzero(mismatch & ~both_finite))
    m.max_abs = max(m.max_abs, float(absdiff.max()))
    rel = np.where(absdiff > 0, absdiff / np.where(absb > 0, absb, 1.0), 0.0)
    rel = np.where((absdiff > 0) & (absb == 0), np.inf, rel)
    m.max_rel = max(m.max_rel, float(rel.max()))
    if m.ulp is not None:
        m.ulp = max(m.ulp, _ulp_distance(xa, ya, ~(nan_a | nan_b)) or 0)


def _measured(m: _Metrics, shape: tuple[int, ...], total: int, rule: tuple[float, float] | None) -> TensorDiff:
    """The verdict and figures of a measured pair."""
    first_index = tuple(int(i) for i in np.unravel_index(m.first, shape)) if m.first is not None else None
    notes = []
    if m.nonfinite:
        notes.append(f"{m.nonfinite} mismatch(es) involve NaN/Inf (max abs/rel cover finite pairs only)")
    if m.count:
        verdict = "diverged"
    elif not m.any_bits:
        verdict = "diverged"
        notes.append("fingerprints differ but the stored tensors are bit-identical (inconsistent trace)")
    else:
        verdict = "close" if rule is not None else "diverged"
    return TensorDiff(
        verdict,
        "tensors",
        detail="; ".join(notes),
        max_abs=m.max_abs,
        max_rel=m.max_rel,
        mismatched=m.count,
        total=total,
        first_index=first_index,
        max_ulp=m.ulp,
        nan=(m.nan[0], m.nan[1]) if m.is_float else (0, 0),
        inf=(m.inf[0], m.inf[1]) if m.is_float else (0, 0),
        atol=None if rule is None else rule[0],
        rtol=None if rule is None else rule[1],
        bitwise=rule is None,
    )


def _from_stats(ra: Record, rb: Record, rule: tuple[float, float] | None) -> TensorDiff:
    """Judge a bit difference from the recorded stats alone (no full tensors on both sides)."""
    total = int(np.prod(ra.shape, dtype=np.int64)) if ra.shape else 1
    kw: dict[str, Any] = {"total": total, "bitwise": rule is None}
    if rule is not None:
        kw.update(atol=rule[0], rtol=rule[1])
    if not ra.stats or not rb.stats:
        what = "bits differ; no tensors or stats stored to measure"
        return TensorDiff("diverged", "fingerprint", detail=what, **kw)
    deltas: dict[str, float] = {}
    for k in ("norm", "min", "max", "mean"):
        va, vb = ra.stat(k), rb.stat(k)
        if va is not None and vb is not None:
            deltas[k] = abs(va - vb) if not (math.isnan(va) and math.isnan(vb)) else 0.0
    nan = (int(ra.stat("nan") or 0), int(rb.stat("nan") or 0))
    inf = (int(ra.stat("inf") or 0), int(rb.stat("inf") or 0))
    kw.update(stat_deltas=deltas, nan=nan, inf=inf)
    if rule is None:
        return TensorDiff("diverged", "stats", detail="bits differ (bitwise); sized from stats, no tensors stored", **kw)
    atol, rtol = rule
    if nan[0] != nan[1] or inf[0] != inf[1]:
        return TensorDiff("diverged", "stats", detail=f"NaN/Inf counts differ (NaN {nan[0]} vs {nan[1]}, Inf {inf[0]} vs {inf[1]})", **kw)
    # If every element were within tolerance, |a_i - b_i| <= atol + rtol*max|b| =: bound, so
    # min, max and mean move by at most bound and the norm by at most sqrt(n)*bound.
    mn, mx = rb.stat("min"), rb.stat("max")
    if mn is not None and mx is not None and math.isfinite(mn) and math.isfinite(mx):
        big = max(abs(mn), abs(mx))
        bound = atol + rtol * big
        # sums and norms are rounded (float32 rows on the torch CPU path: ~1e-6 relative),
        # so allow that much on top; min and max are exact
        eps = 1e-6 * big
        norm_eps = 1e-6 * max(abs(ra.stat("norm") or 0.0), abs(rb.stat("norm") or 0.0))
        limits = {"min": bound, "max": bound, "mean": bound + eps, "norm": math.sqrt(total) * bound + norm_eps}
        for k, lim in limits.items():
            d = deltas.get(k)
            if d is not None and math.isfinite(d) and d > lim * (1 + 1e-9) + 1e-300:
                return TensorDiff(
                    "diverged", "stats",
                    detail=f"{k} moved by {d:.3g}, more than any within-tolerance change allows ({lim:.3g})",
                    **kw,
                )
    return TensorDiff("diverged", "fingerprint", detail="bits differ; no tensors stored to measure", **kw)


def compare_records(
    a: Trace | None, b: Trace | None, step: int, ra: Record, rb: Record, tolerance: Tolerance
) -> TensorDiff:
    """Compare one pair of records (the same key at the same step) under ``tolerance``.

    Reads full tensors only when the fingerprints differ and both traces stored them.
    """
    if ra.dtype != rb.dtype:
        return TensorDiff("dtype", "structure", detail=f"dtype {ra.dtype} vs {rb.dtype}")
    if tuple(ra.shape) != tuple(rb.shape):
        return TensorDiff("shape", "structure", detail=f"shape {tuple(ra.shape)} vs {tuple(rb.shape)}")
    rule = tolerance.rule(ra.kind, ra.name, ra.dtype)
    if ra.fingerprint == rb.fingerprint:
        return TensorDiff("identical", "fingerprint", bitwise=rule is None,
                          atol=None if rule is None else rule[0], rtol=None if rule is None else rule[1])
    if a is not None and b is not None and ra.stored and rb.stored:
        x, y = a.tensor(step, ra), b.tensor(step, rb)
        if x is not None and y is not None and x.dtype == y.dtype and x.shape == y.shape:
            return _measure(x, y, rule, ra.dtype)
    return _from_stats(ra, rb, rule)


# --------------------------------------------------------------------------------------
# divergences and the comparison


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
    agrees on this rank: the difference arrived through the collective from another rank).
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
        return "agree" if self else "diverged"

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


_BATCH_IDS = "<batch_ids>"


def _pair_records(sa: Step, sb: Step) -> Iterable[tuple[Record | None, Record | None]]:
    """Both steps' records merged in chain order; a one-sided record keeps its own place."""
    ka = {r.key for r in sa.records}
    rb = sb.records
    bpos = {r.key: i for i, r in enumerate(rb)}
    j = 0
    for ra in sa.records:
        p = bpos.get(ra.key)
        if p is None:
            yield ra, None
            continue
        if p >= j:
            for r in rb[j:p]:
                if r.key not in ka:
                    yield None, r
            j = p + 1
        yield ra, rb[p]
    for r in rb[j:]:
        if r.key not in ka:
            yield None, r


def _batch_diff(sa: Step, sb: Step) -> TensorDiff | None:
    ia, ib = sa.batch_ids, sb.batch_ids
    if ia is None or ib is None or ia == ib:
        return None
    la, lb = list(ia), list(ib)
    first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
    mism = sum(1 for x, y in zip(la, lb) if x != y) + abs(len(la) - len(lb))
    show_a = la[first] if first < len(la) else "(end)"
    show_b = lb[first] if first < len(lb) else "(end)"
    return TensorDiff("diverged", "batch_ids", detail=f"batch IDs differ (first at position {first}: {show_a!r} vs {show_b!r})",
                      mismatched=mism, total=max(len(la), len(lb)), first_index=(first,))


def _unobserved(trace: Trace) -> tuple[str, ...]:
    """Module names whose activations ``trace`` could not record because they ran under
    torch.compile (the recorder's ``environment.torch.compile.unobserved``): ``*`` every
    module, ``NAME.*`` the modules below NAME, ``NAME`` NAME and those below it,
    ``<input>``/``<output>`` the model's own inputs/outputs (``model.compile()``)."""
    env = trace.manifest.environment
    comp = env.get("torch", {}).get("compile") if isinstance(env, dict) and isinstance(env.get("torch"), dict) else None
    if not isinstance(comp, dict) or comp.get("mode") != "compiled":
        return ()
    names = comp.get("unobserved")
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def _not_recorded(r: Record, unobserved: tuple[str, ...]) -> bool:
    """True for an activation (or model input/output) the other trace could not hold: it
    ran that module compiled."""
    if r.kind in ("input", "output"):
        return f"<{r.kind}>" in unobserved
    if r.kind != "activation" or not unobserved:
        return False
    module = r.name.split("#", 1)[0].split("[", 1)[0]
    for u in unobserved:
        if u == "*":
            return True
        if u.endswith(".*"):
            if module.startswith(u[:-1]):
                return True
        elif module == u or module.startswith(u + "."):
            return True
    return False


def _is_ancestor(parent: str, child: str) -> bool:
    base = parent.split("#", 1)[0]
    return base == "" or child.startswith(base + ".")


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


def _resolve_tolerance(a: Trace, b: Trace, tolerance: Tolerance | None) -> tuple[Tolerance, str]:
    """The tolerance to compare under, and why: ``auto`` (or None) resolved by ``choose_tolerance``."""
    if tolerance is None or tolerance.mode == "auto":
        chosen, reason = choose_tolerance(a, b)
        return Tolerance(mode=chosen.mode, overrides=tolerance.overrides if tolerance else ()), reason
    return tolerance, "as requested"


@dataclass(frozen=True)
class _Steps:
    """Which steps both traces hold, which one side only, and what that means."""

    common: list[int]
    only_a: list[int]
    only_b: list[int]
    structure: str  # the step sets differ: a structural divergence
    note: str  # an incomplete side holds a prefix of the other's steps: said, not a divergence


def _step_structure(a: Trace, b: Trace, steps_a: tuple[int, ...], steps_b: tuple[int, ...]) -> _Steps:
    common = sorted(set(steps_a) & set(steps_b))
    only_a = sorted(set(steps_a) - set(steps_b))
    only_b = sorted(set(steps_b) - set(steps_a))
    structure = note = ""
    if only_a or only_b:
        parts = [f"A has {len(steps_a)} step(s), B has {len(steps_b)}"]
        for side, only in (("A", only_a), ("B", only_b)):
            if only:
                parts.append(f"step{'s' if len(only) > 1 else ''} {_ranges(only)} only in {side}")
        last = max(common) if common else -1
        short = "B" if only_a else "A"
        short_trace = b if only_a else a
        if not (only_a and only_b) and min(only_a or only_b) > last and not short_trace.complete:
            # the shorter side was stopped early (read with allow_incomplete): its steps are a
            # prefix of the other's, so the common steps are all there is to compare
            note = "; ".join(parts) + f" (trace {short} is {short_trace.manifest.status}: compared steps both hold)"
        else:
            structure = "; ".join(parts)
    return _Steps(common, only_a, only_b, structure, note)


def _missing_step(shape: _Steps) -> Divergence:
    """The first divergence of traces whose records agree but whose step sets do not."""
    k = (shape.only_a + shape.only_b)[0]
    side = "a" if shape.only_a and k == shape.only_a[0] else "b"
    return Divergence(k, "step", f"step {k}", "missing",
                      TensorDiff("missing", "structure", detail=shape.structure), origin=True,
                      localization="first", only_in=side)


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
        if bd is not None:
            t.differ += 1
            self.keep(Divergence(k, "batch", _BATCH_IDS, "diverged", bd, **self._first_place()))
        scalars_done = not self.sentinel  # sentinel: the step's scalars sit where its gradients would
        for ra, rb in _pair_records(sa, sb):
            kind = (ra or rb).kind  # type: ignore[union-attr]
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
        if not scalars_done:
            self._scalars(k, sa, sb, t)
        self.summaries.append(StepSummary(k, t.records, t.identical, t.close, t.differ, t.max_abs))

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


def _detail_note(note: str, walk: "_Walk") -> str:
    """``note`` plus, when one side is a sentinel trace and the other a full one, what was compared."""
    if not walk.mixed:
        return note
    sides = f"trace A is {walk.detail_a}, trace B {walk.detail_b}"
    said = (f"{sides}: compared what both hold (batch, loss, learning rates, scale, parameters after each step); "
            f"{walk.not_held} record(s) only the full trace holds (activations, gradients, optimizer state) and the "
            "gradient norm (computed differently at each detail level) were not compared")
    return f"{note}; {said}" if note else said


def _compile_note(note: str, not_recorded: dict[str, int], unobserved: dict[str, tuple[str, ...]]) -> str:
    """``note`` plus, per side, the activations not compared because that side ran them compiled."""
    for side, n in not_recorded.items():
        if n:
            have = "A" if side == "b" else "B"
            said = (f"{n} activation record(s) only in {have} not compared: trace {side.upper()} ran those modules "
                    "under torch.compile, where activations are not recorded")
            if any(u in unobserved[side] for u in ("<input>", "<output>")):
                said += " (nor the inputs and outputs of a model compiled with model.compile())"
            note = f"{note}; {said}" if note else said
    return note


def _with_hints(a: Trace, b: Trace, comp: Comparison) -> Comparison:
    """``comp`` with the likely explanation and hints the evidence supports (``reprobisect.core.hints``)."""
    try:  # a hint is a courtesy: never lose the comparison over one
        explanation = lr_note(a, b, comp) or ""
        found = tuple(divergence_hints(a, b, comp))
    except Exception:
        explanation, found = "", ()
    return replace(comp, explanation=explanation, hints=found)


def _arrived(name: str, sa: Step, sb: Step) -> bool:
    """A collective's output (``NAME/out``) whose input (``NAME/in``) agrees bit for bit on both sides."""
    if not name.endswith("/out"):
        return False
    key = ("collective", name[: -len("/out")] + "/in")
    ia, ib = sa.by_key().get(key), sb.by_key().get(key)
    return ia is not None and ib is not None and ia.fingerprint == ib.fingerprint


def _localize(ra: Record, rb: Record, earlier: bool, diverged_modules: list[str]) -> str:
    if ra.kind != "activation":
        return "propagation" if earlier else "first"
    if ra.inputs is None or rb.inputs is None:
        return "propagation" if earlier else "unknown"
    if tuple(ra.inputs) == tuple(rb.inputs):
        if any(_is_ancestor(ra.name, m) for m in diverged_modules):
            return "propagation"  # a container whose submodule already diverged
        return "origin"
    return "propagation" if earlier else "between_modules"


def _ranges(xs: list[int]) -> str:
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:  # type: ignore[list-item]
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


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


# --------------------------------------------------------------------------------------
# multi-rank traces


def _chain_key(d: Divergence, rank: int, t: Trace | None = None) -> tuple[Any, ...]:
    """Where a divergence sits among all ranks' divergences: by step, then chain order, then rank.

    Chain order is the record's place in its step (``Record.order``: the recorder writes a
    step's records in chain order, a collective of the forward before the activation it
    feeds); batch IDs come first, the step's scalars just before its first gradient
    (where the walk compares them), a missing step last. Without an order, the kind's place."""
    step = t.step(d.step) if t is not None else None
    if d.kind == "batch" and d.name == _BATCH_IDS:
        pos = -1.0
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
