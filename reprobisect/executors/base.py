"""The executor interface: what a probe needs to run anywhere, and what comes back.

A ``ProbeSpec`` is plain data (picklable, JSON-able) so that it can travel to a Ray
worker. An executor turns it into a ``ProbeResult`` through a ``concurrent.futures``
future, so searches can keep K probes in flight on any executor.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from reprobisect.core.outcome import Outcome

__all__ = ["ProbeSpec", "ProbeResult", "Executor"]


@dataclass(frozen=True, kw_only=True)
class ProbeSpec:
    """One probe: run ``argv`` at ``revision`` of ``repo`` and record a trace."""

    key: str
    """Unique name of this probe within a session (trace folders and logs use it)."""
    argv: tuple[str, ...]
    """The user's command, unmodified (``python train.py --lr 1e-3``), after template substitution."""
    repo: str | None = None
    """The git repository (controller-side path); None runs in ``workdir`` as it is."""
    revision: str | None = None
    """Full commit hash to check out in a detached worktree; None with ``repo`` None."""
    workdir: str | None = None
    """Folder to run in when there is no revision (the user's checkout for ``repro``)."""
    subdir: str = "."
    """Directory, relative to the worktree root, that the command runs from."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for the command (before CUDA starts)."""
    python: str | None = None
    """Interpreter that replaces ``python`` in ``argv`` (``envs --a python=PATH``)."""
    steps: int = 3
    """Optimizer steps to record before the probe ends the run."""
    full_steps: tuple[int, ...] = ()
    """Steps whose full tensors are kept."""
    state_steps: tuple[int, ...] = ()
    """Steps at which complete state is captured."""
    stop_on_nonfinite: bool = False
    """End the run at the first NaN/Inf (outcome ``nonfinite``)."""
    timeout: float | None = None
    """Seconds before the whole process group is killed (outcome ``timeout``)."""
    attempt: int = 0
    """Retry number; traces of different attempts never share a folder."""
    extra_launch_args: tuple[str, ...] = ()
    """Further launcher options (zoom, max disk)."""
    links: tuple[str, ...] = ()
    """Paths relative to ``repo``'s root (``--link``: ignored data, untracked configs) that
    appear in the probe's worktree as symlinks to the user's checkout (never copied)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProbeResult:
    """What one probe produced: its outcome, where its trace is, what actually ran."""

    spec: ProbeSpec
    outcome: Outcome
    trace_dir: str | None = None
    """Path of the trace on the controller (fetched when the probe ran elsewhere)."""
    commit_ran: str | None = None
    """The commit the worker actually had checked out (guards against stale code)."""
    host: str | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    output_tail: str = ""
    """The end of stdout and stderr together, in the order they came (the command's
    whole output, bounded, is ``output.log`` in the trace folder)."""

    def last_lines(self, n: int) -> str:
        """The last ``n`` non-empty lines the command printed (stdout and stderr)."""
        text = self.output_tail or (self.stdout_tail + self.stderr_tail)
        keep = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
        return "\n".join(keep[-n:])


@runtime_checkable
class Executor(Protocol):
    """Runs probes; ``submit`` never blocks on the probe itself."""

    name: str
    max_parallel: int

    def submit(self, spec: ProbeSpec) -> "Future[ProbeResult]": ...

    def close(self) -> None: ...
