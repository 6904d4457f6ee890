"""Op-level zoom, controller side: re-run both sides recording every aten op of one module.

(Signatures first; implementation follows.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ZoomResult", "ZoomSide", "run_zoom", "first_divergent_op"]


@dataclass(frozen=True, kw_only=True)
class ZoomSide:
    """How to re-run one side (defaults: what its manifest recorded)."""

    command: tuple[str, ...] | None = None
    cwd: str | None = None
    env: dict | None = None


@dataclass(frozen=True)
class ZoomResult:
    """The first op inside ``module`` at ``step`` whose inputs agree and whose output does not."""

    module: str
    step: int
    op: str | None = None
    occurrence: int | None = None


def first_divergent_op(a: Any, b: Any, module: str, step: int) -> ZoomResult:
    raise NotImplementedError


def run_zoom(a: Any, b: Any, divergence: Any = None, *, module: str | None = None, step: int | None = None,
             side_a: ZoomSide | None = None, side_b: ZoomSide | None = None, timeout: float = 600.0) -> ZoomResult:
    raise NotImplementedError
