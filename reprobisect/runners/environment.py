"""The environment record of a run, collected inside the user's process.

(Signatures first; implementation follows.)
"""

from __future__ import annotations

from typing import Any

__all__ = ["collect_environment"]


def collect_environment(extra: dict | None = None) -> dict[str, Any]:
    """Everything about this process that can change numerics, grouped for a readable diff."""
    raise NotImplementedError
