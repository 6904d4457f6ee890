"""The executor interface: ``Executor`` turns a ``ProbeSpec`` into a ``ProbeResult``, anywhere.

The probe's description and result are core data (``reprobisect.core.probe``). An
executor returns each result through a ``concurrent.futures`` future, so searches can
keep K probes in flight on any executor.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol, runtime_checkable

from reprobisect.core.probe import ProbeResult, ProbeSpec

__all__ = ["Executor", "ProbeSpec", "ProbeResult"]


@runtime_checkable
class Executor(Protocol):
    """Runs probes; ``submit`` never blocks on the probe itself."""

    name: str
    max_parallel: int

    def submit(self, spec: ProbeSpec) -> "Future[ProbeResult]": ...

    def close(self) -> None: ...
