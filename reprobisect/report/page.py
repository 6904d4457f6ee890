"""What a report page holds, as data: the sources build it, ``html`` renders it.

A ``Page`` is the verdict on top, facts about what was compared, the environment
differences, one ``View`` per pair of traces shown in detail (stage plot, module heatmap,
op zoom), and, for an audit, the per-check table and the history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reprobisect.core.compare import Comparison
from reprobisect.report.stages import ModuleGrid, StageSeries

__all__ = ["Verdict", "View", "Page", "STATUSES"]

STATUSES = ("pass", "fail", "inconclusive")
"""How the verdict box is coloured: green, red, amber."""


@dataclass(frozen=True)
class Verdict:
    """The answer the page opens with."""

    status: str
    """``pass``, ``fail`` or ``inconclusive`` (``STATUSES``)."""
    headline: str
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class View:
    """One pair of traces in detail."""

    title: str
    comparison: Comparison | None
    series: StageSeries | None = None
    grid: ModuleGrid | None = None
    zoom: dict[str, Any] | None = None
    """The op zoom's result (``ZoomResult.to_json()``), when one ran."""
    zoom_ops: tuple[dict[str, Any], ...] = ()
    """The zoomed module's ops side by side, when the zoom traces were kept."""
    problem: str = ""
    """Why the traces could not be shown (missing, unreadable), instead of the figures."""


@dataclass(frozen=True)
class Page:
    """Everything the HTML says."""

    kind: str
    """``comparison``, ``runs`` or ``audit``."""
    title: str
    source: str
    verdict: Verdict
    facts: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str, str, str], ...] = ()
    """(key, A, B, category) rows of the environment difference."""
    env_lines: tuple[str, ...] = ()
    """Environment differences given as text only (an audit's ``envdiff``)."""
    views: tuple[View, ...] = ()
    checks: tuple[dict[str, Any], ...] = ()
    history: tuple[dict[str, Any], ...] = ()
    probes: tuple[dict[str, Any], ...] = ()
    """A runs session's probes (point, role, verdict, reason, wall time)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
