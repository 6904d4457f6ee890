"""Differences between two environment records, split into numerics-relevant and info.

(Signatures first; implementation follows.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EnvChange", "diff_environments"]


@dataclass(frozen=True)
class EnvChange:
    """One key whose value differs between environment ``a`` and ``b``."""

    path: str
    a: Any
    b: Any
    category: str  # 'numerics' or 'info'


def diff_environments(a: dict, b: dict) -> list[EnvChange]:
    """The changes from ``a`` to ``b``, numerics-relevant first."""
    raise NotImplementedError
