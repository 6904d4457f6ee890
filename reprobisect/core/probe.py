"""A probe as data: what to run (``ProbeSpec``), what came back (``ProbeResult``), where its trace goes.

A probe records a few steps of the user's command at one point (a commit, a seed, an
environment). Its description is plain data (picklable, JSON-able) so that it can travel
to a Ray worker; its result is what the executor hands back. Running the child process
is the executors' job (``reprobisect.executors.process``); judging a result is
``reprobisect.core.verdict``.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reprobisect.core.outcome import Outcome

__all__ = ["ProbeSpec", "ProbeResult", "trace_dir_name", "trace_path"]


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
    detail: str = "full"
    """What each step records: ``full`` (the whole chain) or ``sentinel`` (batch, loss,
    gradient norm, learning rates, scale, parameters after the step; ``trace.format``)."""
    state_every: int | None = None
    """Complete state after every K-th step (None: the launcher's default, 50 with sentinel)."""
    timeout: float | None = None
    """Seconds before the whole process group is killed (outcome ``timeout``)."""
    attempt: int = 0
    """Retry number; traces of different attempts never share a folder."""
    extra_launch_args: tuple[str, ...] = ()
    """Further launcher options (zoom, max disk)."""
    links: tuple[str, ...] = ()
    """Paths relative to ``repo``'s root (``--link``: ignored data, untracked configs) that
    appear in the probe's worktree as symlinks to the user's checkout (never copied)."""
    trace_dir: str | None = None
    """Controller-side folder the trace goes to (``bisect capture -o``, zoom's ``a.trace``);
    None: the executor's own folder, ``<out_dir>/<key>-a<attempt>`` (``trace_path``). The
    caller checks a folder named here first (``trace.outdir.check_trace_target``): an
    executor replaces it with the probe's trace and never deletes it beforehand."""
    in_place: bool = False
    """Run in ``workdir`` itself on every executor, never in a copy: the probes of one
    question share the user's files (``bisect resume``: the checkpoint one run leaves is what
    the next loads). Ray needs every node to see ``workdir`` for this."""
    echo: bool = False
    """Stream the command's output live to this process's terminal while it runs
    (``bisect capture``); executors that run it elsewhere keep it in the result only."""

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


_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def trace_dir_name(spec: ProbeSpec) -> str:
    """The folder name of a probe's trace: its key (made path-safe) and attempt."""
    safe = _UNSAFE.sub("_", spec.key).strip("._") or "probe"
    return f"{safe}-a{spec.attempt}"


def trace_path(spec: ProbeSpec, out_dir: str | os.PathLike) -> Path:
    """Where a probe's trace goes on the controller: ``spec.trace_dir`` when it names one,
    else ``out_dir/<key>-a<attempt>`` (``trace_dir_name``)."""
    return Path(spec.trace_dir) if spec.trace_dir else Path(out_dir) / trace_dir_name(spec)
