"""Tolerance: how close two tensors must be to agree, and which policy two traces get.

``Tolerance`` is a policy (``bitwise``, ``default``: per-dtype figures as
``torch.testing.assert_close``, ``explicit`` ``atol``/``rtol``, or ``auto``), optionally
refined per tensor name by globs on ``kind/name``. ``choose_tolerance`` resolves ``auto``:
bitwise when both traces share device and environment, else default. Pure data and
arithmetic: no tensor is read here.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from reprobisect.core.checks import check_number
from reprobisect.core.envdiff import diff_environments
from reprobisect.errors import UsageError
from reprobisect.trace.format import tensor_key
from reprobisect.trace.reader import Trace

__all__ = ["DEFAULT_TOLERANCES", "POLICIES", "Tolerance", "choose_tolerance"]

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


def _resolve_tolerance(a: Trace, b: Trace, tolerance: Tolerance | None) -> tuple[Tolerance, str]:
    """The tolerance to compare under, and why: ``auto`` (or None) resolved by ``choose_tolerance``."""
    if tolerance is None or tolerance.mode == "auto":
        chosen, reason = choose_tolerance(a, b)
        return Tolerance(mode=chosen.mode, overrides=tolerance.overrides if tolerance else ()), reason
    return tolerance, "as requested"
