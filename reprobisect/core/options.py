"""The probe options every probing command shares, as a plain value the library takes.

``capture``, ``probe``, ``runs``, ``repro``, ``seeds`` and ``envs`` run probes the same
way: steps, timeout, executor, jobs, tolerance, where traces go. ``ProbeOptions`` holds
them; it knows nothing of click or of config files (``reprobisect.cli.options`` turns
flags and ``--config FILE`` into one) nor of any executor's own settings: those are the
executor's config dataclass (``reprobisect.executors.EXECUTORS``), carried opaque in
``executor_config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprobisect.core.checks import check_number
from reprobisect.core.compare import Tolerance
from reprobisect.errors import UsageError
from reprobisect.trace.format import DETAILS

__all__ = ["ProbeOptions"]


@dataclass(frozen=True, kw_only=True)
class ProbeOptions:
    """How probes run and how their traces are judged; shared by every probing command."""

    steps: int = 3
    """Optimizer steps each probe records before it ends the run."""
    timeout: float | None = None
    """Seconds before a probe's whole process group is killed (None: no limit)."""
    executor: str = "local"
    """Where probes run: a name of ``reprobisect.executors.EXECUTORS`` ('local', 'ray')."""
    executor_config: Any = None
    """The executor's own settings (its config dataclass, e.g. ``RayConfig``); None: its defaults."""
    jobs: int = 1
    """Probes run at once."""
    tolerance: Tolerance | None = None
    """How traces are judged (``Tolerance.from_flags``); None, or mode ``auto``: the command's
    own default (bitwise for runs/probe/repro, default for envs)."""
    keep: bool = False
    """Keep the probes' traces after the command ends."""
    out: Path | None = None
    """Folder that receives the traces (and keeps them); None: a temporary folder."""
    full_steps: tuple[int, ...] = ()
    """Steps whose full tensors every probe keeps (for magnitudes of a divergence)."""
    quiet: bool = False
    """No progress display."""
    config: Path | None = None
    """The config file these options were read from, if any."""
    link: tuple[str, ...] = ()
    """Paths of the user's checkout (relative to the repository root: ignored data, untracked
    configs, caches) symlinked into every probe's worktree (``--link``, config ``link: [..]``)."""
    detail: str = "full"
    """What each probe records per step: ``full`` (the whole chain) or ``sentinel`` (batch,
    loss, gradient norm, learning rates, scale, parameters after the step)."""
    state_every: int | None = None
    """Complete state after every K-th step (``--state-every``; None: 50 with sentinel, else none)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for every probe these options run (under the spec's own:
    ``envs``' sides and ``repro``'s PYTHONHASHSEED win). An audit check's ``env:`` travels
    here, so checks running at once never share one process environment."""
    shared_executor: Any = None
    """An open executor every workflow given these options borrows instead of making its own
    (``executor_for`` hands back a view whose ``close`` does nothing; its owner closes it):
    one executor, one Ray start, for a whole audit night."""

    def __post_init__(self) -> None:
        # every number is checked here, before any probe runs, whether it came from a flag
        # or from --config (YAML reads '.nan' and '.inf' as floats): NaN compares False with
        # everything, so 'timeout <= 0' alone would let --timeout nan through as "no limit"
        check_number("--steps", self.steps, minimum=1, integer=True)
        check_number("--jobs", self.jobs, minimum=1, integer=True)
        if self.timeout is not None:
            check_number("--timeout", self.timeout, minimum=0, open_min=True, unit=" seconds")
        if not isinstance(self.executor, str) or not self.executor:
            raise UsageError(f"--executor takes an executor's name (got {self.executor!r})")
        if self.detail not in DETAILS:
            raise UsageError(f"--detail takes {' or '.join(DETAILS)} (got {self.detail!r})")
        if self.state_every is not None:
            check_number("--state-every", self.state_every, minimum=1, integer=True)
        if not isinstance(self.env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise UsageError(f"probe env must map names to strings (got {self.env!r})")
        if self.tolerance is not None and not isinstance(self.tolerance, Tolerance):
            raise UsageError(f"tolerance {self.tolerance!r} is not a Tolerance; build it with Tolerance.from_flags")

    def launch_fields(self) -> dict[str, Any]:
        """The ``ProbeSpec`` fields these options set for what a probe records (``detail``, ``state_every``)."""
        return {"detail": self.detail, "state_every": self.state_every}

    def tolerance_for(self, default: str = "bitwise") -> Tolerance:
        """The tolerance to judge with: the one given, its ``auto`` mode (or none) as ``default``."""
        return (self.tolerance or Tolerance(mode="auto")).resolved(default)

    def to_json(self) -> dict[str, Any]:
        cfg = self.executor_config
        return {
            "steps": self.steps, "timeout": self.timeout, "executor": self.executor,
            "executor_config": cfg.to_json() if hasattr(cfg, "to_json") else None, "jobs": self.jobs,
            "tolerance": self.tolerance.to_json() if self.tolerance is not None else None, "keep": self.keep,
            "out": str(self.out) if self.out is not None else None, "full_steps": list(self.full_steps),
            "quiet": self.quiet, "config": str(self.config) if self.config is not None else None, "link": list(self.link),
            "detail": self.detail, "state_every": self.state_every, "env": dict(self.env),
        }
