"""Checks of the numbers a user gives (flags, config files, library arguments), shared by
the CLI's option types and the library's config dataclasses so both say the same thing."""

from __future__ import annotations

import math
from typing import Any

from reprobisect.errors import UsageError

__all__ = ["check_number"]


def check_number(name: str, value: Any, *, minimum: float | None = None, open_min: bool = False,
                 maximum: float | None = None, integer: bool = False, unit: str = "") -> None:
    """Raise one UsageError unless ``value`` is a finite number in range (NaN and inf never are)."""
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise UsageError(f"{name} takes {'a whole number' if integer else 'a number'} (got {value!r})")
    if not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number (got {value})")
    if minimum is not None and (value <= minimum if open_min else value < minimum):
        bound = f"greater than {minimum:g}" if open_min else (f"at least {minimum:g}" if minimum else ">= 0")
        raise UsageError(f"{name} must be {bound}{unit} (got {value:g})")
    if maximum is not None and value > maximum:
        raise UsageError(f"{name} must be at most {maximum:g}{unit} (got {value:g})")
