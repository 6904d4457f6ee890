"""How one probe ended: the ``Outcome`` every launcher, executor and search speaks.

``ok`` — a sealed trace; ``skip`` — the command could not be tested here (import or
dependency failure, command not found: git bisect's 125); ``crashed`` — an exception
after training started (with step and traceback); ``nonfinite`` — stopped at the first
NaN/Inf when asked to; ``no_steps`` — the command ended without stepping an optimizer;
``timeout`` and ``infra`` — the probe was killed from outside (timeout, signal, lost
worker), or reprobisect's own recorder failed inside the run: never evidence about the code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["OUTCOMES", "Outcome", "LAUNCH_EXIT"]

OUTCOMES = ("ok", "skip", "crashed", "nonfinite", "no_steps", "timeout", "infra")

# Exit status of `python -m reprobisect.runners.launch` for each outcome it can see itself.
LAUNCH_EXIT = {"ok": 0, "crashed": 3, "nonfinite": 4, "skip": 5, "no_steps": 6, "infra": 7}


@dataclass(frozen=True)
class Outcome:
    """The result of one probe; truthy when it produced a sealed trace."""

    status: str
    detail: str = ""
    step: int | None = None
    traceback: str | None = None
    trace: str | None = None
    returncode: int | None = None
    wall_s: float | None = None

    def __post_init__(self) -> None:
        if self.status not in OUTCOMES:
            raise ValueError(f"unknown outcome '{self.status}' (one of {', '.join(OUTCOMES)})")

    def __bool__(self) -> bool:
        return self.status == "ok"

    def __str__(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        return f"{self.status}{where}" + (f": {self.detail}" if self.detail else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Outcome":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})
