"""How a comparison of two traces reads: as text (``bisect compare``) and as ``--json``.

The order is the order a reader needs: the environment differences first (they often
explain everything), then the tolerance and what was compared, then the first broken
link (origin or propagation), then the next few divergences and a per-step tally.
Plain text with ``·`` separators: it reads the same piped into a file as on a terminal.
A comparison of sentinel traces (``--detail sentinel``) names the sentinel that first
differed (``first divergence at step 7: sentinel param 'fc.weight' (after the step)``) and
the last step before it after which both traces hold complete state (where a full-detail
replay starts). A comparison of multi-rank traces names the rank (``step 0 · rank 1 ·
input · x``), which other ranks agree there, each rank's own first divergence (``arrived
through a collective`` where its input agreed), and the distributed findings of each trace.
Names come from traces (anyone's model, anyone's file): each is shown through
``render.safe.printable`` and the whole text through ``printable_lines``, so a control
character in a tensor name is printed as ``\\x1b``, never sent to the terminal.
"""

from __future__ import annotations

import math
from typing import Any

from reprobisect.render.safe import printable, printable_lines

__all__ = ["command_warning", "comparison_json", "format_number", "init_lines", "render_comparison", "render_divergence", "render_env",
           "sentinel_text"]

_ENV_SHOWN = 20
_VALUE_WIDTH = 60


def format_number(x: float | None) -> str:
    """A float in at most a few significant digits (``3.1e-07``, ``0.25``, ``inf``)."""
    if x is None:
        return "-"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-2 <= abs(x) < 1e5:
        return f"{x:.3g}"
    return f"{x:.1e}"


def _short(v: Any, path: str = "") -> str:
    s = printable(repr(v))
    if _whole(path):
        return s
    return s if len(s) <= _VALUE_WIDTH else s[: _VALUE_WIDTH - 1] + "…"


def _whole(path: str) -> bool:
    """Values shown whole however long: a command line, whose differing flag may sit anywhere."""
    last = path.rsplit(".", 1)[-1]
    return last in ("argv", "command", "orig_argv")


def render_env(env: tuple[Any, ...] | list[Any], *, every: bool = False) -> list[str]:
    """Lines for ``EnvChange`` values: numerics changes first, then provenance and launch info; at
    most a screenful unless ``every`` (``-v``)."""
    if not env:
        return ["environment: no differences"]
    numerics = [d for d in env if not d.info]
    lines = [f"environment differences ({len(numerics)} numerics-relevant, {len(env) - len(numerics)} launch info):"]
    # a differing command line is shown with the numerics changes, never cut off by the limit
    env = sorted(env, key=lambda d: (d.info, not _whole(d.key)))
    shown = len(env) if every else _ENV_SHOWN
    for d in list(env)[:shown]:
        tag = "  (info)" if d.info else ""
        if getattr(d, "is_data", False):  # a DVC data version: the file and its short hashes
            lines.append(f"  {printable(d)}{tag}")
        elif d.change == "changed":
            lines.append(f"  {printable(d.key)}: {_short(d.a, d.key)} → {_short(d.b, d.key)}{tag}")
        elif d.change == "added":
            lines.append(f"  {printable(d.key)}: only in B = {_short(d.b, d.key)}{tag}")
        else:
            lines.append(f"  {printable(d.key)}: only in A = {_short(d.a, d.key)}{tag}")
    if len(env) > shown:
        lines.append(f"  … and {len(env) - shown} more (-v or --json lists all)")
    return lines


def _measure(diff: Any) -> list[str]:
    parts: list[str] = []
    if diff.source == "tensors":
        parts.append(f"max abs {format_number(diff.max_abs)}")
        if diff.max_rel:
            parts.append(f"max rel {format_number(diff.max_rel)}")
        parts.append(f"{diff.mismatched}/{diff.total} elements")
        if diff.max_ulp is not None:
            parts.append(f"{diff.max_ulp} ULP")
        if diff.first_index is not None:
            parts.append(f"first at {list(diff.first_index)}")
    elif diff.source == "stats" and diff.stat_deltas:
        d = diff.stat_deltas
        parts.append("from stats: " + ", ".join(f"Δ{k} {format_number(v)}" for k, v in d.items()))
    elif diff.source == "batch_ids":
        parts.append(f"{diff.mismatched}/{diff.total} batch IDs")
    if diff.detail:
        parts.append(diff.detail)
    return parts


_LOC = {
    "origin": "origin: its inputs agree on both sides, its output does not",
    "between_modules": "the change happened between modules (its inputs already differ: look in the parent's forward)",
    "propagation": "propagation of an earlier difference",
    "unknown": "module inputs were not recorded: origin unknown",
    "first": "first broken link",
    "followed_init": "followed the initial parameters, which already differ in this step",
    "arrival": ("arrived through a collective: its input agrees on both sides on this rank, its output does not "
                "(another rank's input differs)"),
}


def render_divergence(d: Any, *, with_localization: bool = False) -> str:
    """A ``Divergence`` on one line: ``step 0 · activation · encoder.norm (LayerNorm) · max abs 3.1e-07 · 412/1536 elements``."""
    name = f"{printable(d.name)} ({printable(d.module)})" if d.module else printable(d.name)
    rank = getattr(d, "rank", None)
    parts = [f"step {d.step}", *([f"rank {rank}"] if rank is not None else []), d.kind, name]
    if d.verdict == "missing":
        parts.append(f"missing: only in {d.only_in.upper() if d.only_in else '?'}")
        if d.diff.detail and d.kind == "step":
            parts.append(d.diff.detail)
    elif d.verdict in ("shape", "dtype"):
        parts.append(f"{d.verdict} mismatch: {d.diff.detail}")
    else:
        parts.extend(_measure(d.diff))
    line = " · ".join(parts)
    if with_localization and getattr(d, "sentinel", None):
        line += (f"\n    ↳ {sentinel_text(d)}: the first sentinel to differ (a sentinel trace holds no activations "
                 "or gradients: a full-detail replay of this step names its first broken link)")
    elif with_localization and d.localization in _LOC:
        line += f"\n    ↳ {_LOC[d.localization]}"
    if with_localization and rank is not None:
        line += _ranks_line(d)
    return line


def _ranks_line(d: Any) -> str:
    """Which other ranks agree at a multi-rank divergence (``Divergence.agree``/``differ``)."""
    agree, differ = getattr(d, "agree", None), getattr(d, "differ", None)
    if agree is None and differ is None:
        return ""
    parts = []
    if agree:
        parts.append(f"rank{'s' if len(agree) > 1 else ''} {', '.join(map(str, agree))} agree{'' if len(agree) > 1 else 's'} here")
    if differ:
        parts.append(f"rank{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ))} differ{'' if len(differ) > 1 else 's'} here too")
    if not parts:
        return f"\n    ↳ no other rank holds this record at step {d.step}"
    return "\n    ↳ " + "; ".join(parts)


def sentinel_text(d: Any) -> str:
    """The sentinel a divergence was seen in, as the answer says it: ``sentinel loss``,
    ``sentinel param 'fc.weight' (after the step)``, ``sentinel lr (group 1)``."""
    s = getattr(d, "sentinel", None) or d.kind
    if s in ("param", "init", "batch"):
        when = {"param": " (after the step)", "init": " (before the first step)", "batch": ""}[s]
        return f"sentinel {s} '{printable(d.name)}'{when}"
    if s == "loss" and d.name != "loss":
        return f"sentinel loss '{printable(d.name)}'"
    if s == "lr" and "[" in d.name:
        return f"sentinel lr (group {printable(d.name.split('[', 1)[1].rstrip(']'))})"
    return f"sentinel {printable(s)}"


def _detail_line(c: Any) -> str:
    a, b = getattr(c, "detail_a", "full"), getattr(c, "detail_b", "full")
    states = list(getattr(c, "state_steps", ()))
    held = f"; both hold complete state after step(s) {', '.join(map(str, states[:8]))}{' …' if len(states) > 8 else ''}" if states else ""
    return f"detail: {a if a == b else f'A {a}, B {b}'}{held}"


def _first_lines(c: Any) -> list[str]:
    if not getattr(c, "sentinel", False):
        return ["first divergence:"]
    lines = [f"first divergence at step {c.first.step}: {sentinel_text(c.first)}"]
    start = getattr(c, "replay_from", None)
    if start is not None:
        lines.append(f"  (full detail: replay from the state after step {start}, which both traces hold)")
    return lines


_COMMAND_KEYS = ("python.argv",)  # reprobisect.core.envdiff.COMMAND_PATHS (render imports nothing of the core)


def command_warning(env: tuple[Any, ...] | list[Any]) -> str | None:
    """The warning line when ``env`` (``EnvChange`` values) says the two runs were started with
    other arguments (``command_changes``): a comparison that is not like for like; else None."""
    changed = [d for d in env if getattr(d, "key", None) in _COMMAND_KEYS]
    if not changed:
        return None
    d = changed[0]
    return (f"warning: the two runs were started with other arguments ({_short(d.a, d.key)} → {_short(d.b, d.key)}): "
            "the comparison is not like for like")


def render_comparison(c: Any, *, verbose: bool = False) -> str:
    """The whole ``Comparison`` as text; environment differences come first (all of them when ``verbose``)."""
    lines = [f"A: {printable(c.a)} ({c.status_a}, {len(c.steps_a)} steps)",
             f"B: {printable(c.b)} ({c.status_b}, {len(c.steps_b)} steps)"]
    lines = [s.replace(" 1 steps)", " 1 step)") for s in lines]
    if getattr(c, "ranks", ()):
        lines = [line[:-1] + f", {n} rank{'s' if n != 1 else ''})" for line, n in zip(lines, (c.world_size_a, c.world_size_b))]
    lines.extend(render_env(c.env, every=verbose))
    lines.append(f"tolerance: {c.tolerance.describe()} — {c.tolerance_reason}")
    read = f"; read {c.tensors_read} full tensor(s), {c.bytes_read} bytes" if c.tensors_read else "; no full tensor read"
    lines.append(f"compared {c.steps_compared} step(s), {c.records_compared} record(s){read}")
    if c.structure:
        lines.append(f"structure: {c.structure}")
    if c.note:
        lines.append(f"note: {c.note}")
    if getattr(c, "sentinel", False):
        lines.append(_detail_line(c))
    lines.extend(f"distributed: {f}" for f in getattr(c, "findings", ()))
    if c.first is None:
        lines.append("verdict: AGREE" if c else "verdict: DIVERGED (structure)")
        closes = sum(s.close for s in c.per_step)
        if closes:
            lines.append(f"  ({closes} record(s) differ in bits but are within tolerance)")
        return printable_lines("\n".join(lines))
    lines.extend(_first_lines(c))
    lines.append("  " + render_divergence(c.first, with_localization=True))
    lines.extend(init_lines(c))
    explanation = getattr(c, "explanation", "")
    if explanation:
        lines.append(f"    ↳ likely explanation: {explanation}")
    firsts = getattr(c, "rank_firsts", ())
    if len(firsts) > 1:
        lines.append("first divergence of each rank:")
        for d in firsts:
            how = " (arrived through a collective)" if d.localization == "arrival" else ""
            lines.append(f"  {render_divergence(d)}{how}")
    origin = c.origin
    if origin is not None and origin is not c.first:
        lines.append("first origin (inputs agree, output differs):")
        lines.append("  " + render_divergence(origin))
    if c.next:
        lines.append(f"next {len(c.next)}:")
        for d in c.next:
            lines.append("  " + render_divergence(d))
    differing = [s for s in c.per_step if s.differ]
    if differing:
        tally = ", ".join(
            f"{s.step}: {s.differ}/{s.records}" + (f" (max abs {format_number(s.max_abs)})" if s.max_abs is not None else "")
            for s in differing[:10]
        )
        more = f" … and {len(differing) - 10} more" if len(differing) > 10 else ""
        lines.append(f"per step (differing/records): {tally}{more}")
    what = sentinel_text(c.first) if getattr(c.first, "sentinel", None) else f"{c.first.kind} {printable(c.first.name)}"
    if getattr(c.first, "rank", None) is not None:
        what = f"rank {c.first.rank}, {what}"
    lines.extend(_verdict_lines(c, what))
    lines.extend(f"hint: {h}" for h in getattr(c, "hints", ()))
    return printable_lines("\n".join(lines))


def init_lines(c: Any) -> list[str]:
    """Under a first divergence in an ``init`` record: in words, the initial parameters differ
    (the initialisation, the run's earliest event), which of them, and the data order that
    differs in the same step as what followed it (a question about why, never a cause
    stated as fact)."""
    first = getattr(c, "first", None)
    if first is None or first.kind != "init":
        return []
    inits = [d for d in (first, *getattr(c, "next", ())) if d.kind == "init"]
    names = ", ".join(printable(d.name) for d in inits[:4]) + (" …" if len(inits) > 4 else "")
    lines = [f"    ↳ the initial parameters differ (the initialisation, before the first step): {names}"]
    after = [d for d in getattr(c, "next", ()) if getattr(d, "localization", "") == "followed_init"]
    if after:
        d = after[0]
        lines.append(f"    ↳ then the data order differs too (step {d.step}: {d.diff.detail}): it followed the "
                     "initialisation — did the initialisation draw from the global RNG before the loader shuffled?")
    return lines


def _verdict_lines(c: Any, what: str) -> list[str]:
    """The verdict of a comparison with a first divergence: DIVERGED only when something was
    measured beyond the tolerance; INCONCLUSIVE (with how to measure) when bits differ and
    nothing sized the difference (``Comparison.unmeasured``)."""
    step = c.first.step
    if getattr(c, "verdict", "diverged") == "inconclusive":
        return [f"verdict: INCONCLUSIVE at step {step} ({what}): bits differ, size not measured (no tensor stored); "
                f"re-run with --full-steps {step} or compare --zoom"]
    lines = [f"verdict: DIVERGED at step {step} ({what})"]
    if c.first.verdict == "inconclusive":
        measured = getattr(c, "first_measured", None)
        where = f": {render_divergence(measured)}" if measured is not None else " later in the run"
        lines.append(f"  (the first difference is not measured; the first one measured beyond the tolerance{where})")
    return lines


def comparison_json(c: Any, zoom: Any = None) -> dict[str, Any]:
    """What ``bisect compare --json`` prints: the ``Comparison``'s data, with the zoom when one ran."""
    data = c.to_json()
    if zoom is not None:
        data["zoom"] = zoom.to_json() if hasattr(zoom, "to_json") else str(zoom)
    return data
