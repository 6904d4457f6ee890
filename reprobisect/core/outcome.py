"""How one probe ended (``Outcome``) and the verdict a search gives a point (``VerdictKind``).

``ok`` — a sealed trace; ``skip`` — the command could not be tested here (import or
dependency failure, command not found: git bisect's 125); ``crashed`` — an exception
after training started (with step and traceback); ``nonfinite`` — stopped at the first
NaN/Inf when asked to; ``no_steps`` — the command ended without stepping an optimizer;
``timeout`` and ``infra`` — the probe was killed from outside (timeout, signal, lost
worker), or reprobisect's own recorder failed inside the run: never evidence about the
code, and the only outcomes that are retried (``Status.retryable``).

Statuses and verdicts are str-valued enums: they equal, hash, print and JSON-encode as
the plain strings (``"ok"``, ``"good"``), so manifests, session logs and cache entries
written before they were enums read back unchanged.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

__all__ = ["OUTCOMES", "Status", "VerdictKind", "Outcome", "LAUNCH_EXIT", "DISK_FULL", "disk_full_detail", "disk_full", "no_space_code"]


class _Named(str, Enum):
    """A str-valued enum member that prints (``str``, f-strings) as its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Status(_Named):
    """How a probe ended; see the module docstring."""

    OK = "ok"
    SKIP = "skip"
    CRASHED = "crashed"
    NONFINITE = "nonfinite"
    NO_STEPS = "no_steps"
    TIMEOUT = "timeout"
    INFRA = "infra"

    @property
    def is_evidence(self) -> bool:
        """True when the ending says something about the code (ok, crashed, nonfinite);
        skip, no_steps, timeout and infra only say the probe could not test it."""
        return self in (Status.OK, Status.CRASHED, Status.NONFINITE)

    @property
    def retryable(self) -> bool:
        """True for an ending that came from outside the code (timeout, infra): run it again."""
        return self in (Status.TIMEOUT, Status.INFRA)


class VerdictKind(_Named):
    """What a probe says about a search's predicate at one point (git bisect's good/bad/skip)."""

    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


OUTCOMES = tuple(s.value for s in Status)

# Exit status of `python -m reprobisect.runners.launch` for each outcome it can see itself.
LAUNCH_EXIT = {Status.OK: 0, Status.CRASHED: 3, Status.NONFINITE: 4, Status.SKIP: 5, Status.NO_STEPS: 6, Status.INFRA: 7}


@dataclass(frozen=True)
class Outcome:
    """The result of one probe; truthy when it produced a sealed trace."""

    status: Status
    detail: str = ""
    step: int | None = None
    traceback: str | None = None
    trace: str | None = None
    returncode: int | None = None
    wall_s: float | None = None

    def __post_init__(self) -> None:
        try:
            status = Status(self.status)
        except ValueError:
            raise ValueError(f"unknown outcome '{self.status}' (one of {', '.join(OUTCOMES)})") from None
        object.__setattr__(self, "status", status)

    def __bool__(self) -> bool:
        return self.status is Status.OK

    def __str__(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        return f"{self.status}{where}" + (f": {self.detail}" if self.detail else "")

    @property
    def is_evidence(self) -> bool:
        """Whether this ending is a fact about the code (``Status.is_evidence``)."""
        return self.status.is_evidence

    @property
    def retryable(self) -> bool:
        """Whether the probe should be run again (``Status.retryable``: timeout, infra)."""
        return self.status.retryable

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Outcome":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


DISK_FULL = "no space left on the disk holding"
"""The words that open an ``infra`` outcome whose trace could not be written because its
disk (or quota) was full: the tool's own writing failed, never the program's crash.
``bisect capture`` turns it into one line and exit 2 (``disk_full``)."""


def disk_full_detail(path: str, code: str = "ENOSPC") -> str:
    """The detail of a probe whose trace at ``path`` hit a full disk (``code``: ENOSPC or EDQUOT)."""
    return f"{DISK_FULL} '{path}' ({code}) while writing the trace"


def disk_full(outcome: Outcome) -> str | None:
    """The full-disk sentence of an ``infra`` outcome (``disk_full_detail``), else None."""
    if outcome.status is not Status.INFRA:
        return None
    m = _DISK_FULL_RE.search(outcome.detail or "")
    return m.group(0) if m else None


def no_space_code(outcome: Outcome) -> str | None:
    """``ENOSPC``/``EDQUOT`` when an ``infra`` outcome's own words say the disk was full (the
    recorder's failure as the child reported it, before anyone rewrote it), else None."""
    if outcome.status is not Status.INFRA:
        return None
    m = _NO_SPACE_RE.search(f"{outcome.detail or ''}\n{outcome.traceback or ''}")
    return None if m is None else ("ENOSPC" if m.group(1) == "28" else "EDQUOT")


_NO_SPACE_RE = re.compile(r"\[Errno (28|122)\]")
_DISK_FULL_RE = re.compile(re.escape(DISK_FULL) + r" '.*?' \((?:ENOSPC|EDQUOT)\) while writing the trace")
