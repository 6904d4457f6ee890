"""Rendering: every text and ``--json`` document the commands print, in one place.

The library returns result values (``Comparison``, ``ReproResult``, ``SeedMap``, ...);
these functions read them by their attributes and say them. This package is a leaf: it
imports nothing of reprobisect but itself, so any layer may render without a cycle.

``comparison``  ``bisect compare`` (and the comparison inside every other answer)
``repro``       ``bisect repro`` and ``bisect probe``
``seeds``       ``bisect seeds``
``envs``        ``bisect envs`` (and ``format_changes`` for environment diffs)
``runs``        ``bisect runs`` (imported from ``reprobisect.render.runs``; it builds on ``comparison``)
``envelope``    the four keys every ``--json`` document starts with (kind, schema_version, verdict,
                exit_code) and the one verdict vocabulary; the schemas are ``docs/schemas/``
``safe``        ``printable``/``printable_lines``: names from traces and configs with their control
                characters escaped, for every terminal line, JUnit file and HTML page

The values' own ``to_json`` (trace manifest and steps, session log events, ``Outcome``,
the comparison's data) stays with them: it is what they persist or embed; the documents
the CLI prints are composed here.
"""

from __future__ import annotations

from reprobisect.render.comparison import comparison_json, format_number, render_comparison, render_divergence, render_env
from reprobisect.render.envs import envs_json, format_changes, render_envs
from reprobisect.render.repro import probe_report_json, probe_result_json, render_probe_report, render_repro, repro_json
from reprobisect.render.seeds import render_seed_map, seed_map_json

__all__ = [
    "comparison_json",
    "envs_json",
    "format_changes",
    "format_number",
    "probe_report_json",
    "probe_result_json",
    "render_comparison",
    "render_divergence",
    "render_env",
    "render_envs",
    "render_probe_report",
    "render_repro",
    "render_seed_map",
    "repro_json",
    "seed_map_json",
]
