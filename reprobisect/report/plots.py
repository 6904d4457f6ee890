"""The report's plots, drawn by matplotlib and returned as SVG text to inline in the page.

matplotlib is imported inside each function (``bisect --help`` and the trace code never
pay for it), on the Agg backend, with ``MPLCONFIGDIR`` pointed at a temporary folder when
unset (``reprobisect-mpl-UID``, kept for matplotlib's font cache: a report never writes
into the user's home). SVG is kept small: text as text
(``svg.fonttype: none``), long series reduced to at most ``MAX_POINTS`` points by taking
the maximum of each bin (a spike is never averaged away), no per-point markers on long
series, heatmaps as one embedded raster. Each figure of a page is given its own salt
(``svg.hashsalt``), so the ids of several SVGs in one page never collide, and the same
input gives the same page byte for byte.

Labels come from traces and configs: each is shown through ``render.safe.printable`` (a
control character as ``\\x1b``), and a character no installed font draws (an emoji, CJK
without a CJK font) stays in the SVG as text for the browser's fonts to draw, without
matplotlib's "Glyph N missing from font" warning reaching the user's stderr
(``_quiet_glyphs``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import tempfile
import warnings
from typing import Any, Callable, Iterator, Sequence, TypeVar

from reprobisect.errors import UsageError
from reprobisect.render.safe import printable
from reprobisect.report.stages import ModuleGrid, StageSeries

__all__ = ["stage_plot", "module_heatmap", "history_plot", "downsample_max", "night_key", "night_labels", "MAX_POINTS",
           "FIRST_GID"]

MAX_POINTS = 400
"""Points per plotted series at most (longer ones are binned by their maximum)."""
FIRST_GID = "first-broken-link"
"""The SVG id (``gid``) of the heatmap's outline around the first broken link."""
_STYLES = ("-", "--", "-.", ":")
_MARKERS = "os^vDPX*"
_VERDICT_COLOURS = {"bitwise": "#2e7d32", "within-noise": "#9ccc65", "diverged": "#c62828",
                    "inconclusive": "#f9a825"}


_F = TypeVar("_F", bound=Callable[..., str])


def _label(name: Any) -> str:
    """A name as plot text: control characters escaped, ``$`` literal (not mathtext)."""
    return printable(name).replace("$", r"\$")


@contextlib.contextmanager
def _glyphs_quiet() -> Iterator[None]:
    """Silence matplotlib's missing-glyph warnings (and only those) while a figure is drawn."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Gg]lyph .* missing from")
        warnings.filterwarnings("ignore", message=r".*[Mm]atplotlib currently does not support")
        yield


def _quiet_glyphs(f: _F) -> _F:
    """Draw ``f``'s figure with ``_glyphs_quiet``."""
    @functools.wraps(f)
    def quiet(*args: Any, **kwargs: Any) -> str:
        with _glyphs_quiet():
            return f(*args, **kwargs)
    return quiet  # type: ignore[return-value]


def _pyplot() -> Any:
    if not os.environ.get("MPLCONFIGDIR"):
        # one folder per user, kept: matplotlib builds its font cache there once, not per report
        folder = os.path.join(tempfile.gettempdir(), f"reprobisect-mpl-{os.getuid() if hasattr(os, 'getuid') else 0}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.environ["MPLCONFIGDIR"] = folder
    try:
        import matplotlib
    except ImportError:
        raise UsageError("HTML reports draw their plots with matplotlib, which is not installed: "
                         "pip install 'reprobisect[report]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any, salt: str) -> str:
    """The figure as SVG text without the XML prolog (ready to inline), then closed; ``salt``
    makes its element ids differ from every other figure's in the page."""
    import matplotlib

    plt = _pyplot()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"rb-{salt}",
                                "svg.image_inline": True}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def downsample_max(xs: Sequence[int], ys: Sequence[float], n: int = MAX_POINTS) -> tuple[list[int], list[float]]:
    """At most ``n`` points: each bin's first x and its largest finite y (NaN when it has none)."""
    if len(xs) <= n:
        return list(xs), list(ys)
    out_x, out_y = [], []
    size = math.ceil(len(xs) / n)
    for lo in range(0, len(xs), size):
        chunk = [y for y in ys[lo:lo + size] if not math.isnan(y)]
        out_x.append(xs[lo])
        out_y.append(max(chunk) if chunk else math.nan)
    return out_x, out_y


def _stage_style(i: int, marker: bool) -> dict[str, Any]:
    """Stage ``i``'s line style: its own dash, marker and width, so lines that coincide stay
    visible under one another (the first drawn widest)."""
    return {"ls": _STYLES[i % len(_STYLES)], "marker": _MARKERS[i % len(_MARKERS)] if marker else None,
            "lw": max(1.0, 2.6 - 0.3 * i), "ms": max(3.0, 6.5 - 0.6 * i), "mfc": "none"}


def _integer_axis(axis: Any) -> None:
    """Ticks on whole numbers only (steps and counts are integers: no 0.25, 0.5)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _outside_legend(ax: Any, **kw: Any) -> None:
    """The legend right of the axes, never over the data."""
    ax.legend(fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kw)


@_quiet_glyphs
def stage_plot(series: StageSeries, *, first_step: int | None = None, title: str = "", salt: str = "stages") -> str:
    """Two panels over the steps: the largest relative difference per stage (log scale;
    identical steps are gaps) and the number of records that differ per stage. Each stage
    has one colour, dash and marker in both panels; steps and counts tick on integers."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.6), sharex=True, gridspec_kw={"height_ratios": [3, 1.8]})
    cmap = plt.get_cmap("tab10")
    steps = list(series.steps)
    marker = len(steps) <= 30
    ceiling = 10.0
    for i, stage in enumerate(series.stages):
        ys = [min(v, ceiling) if v > 0 else math.nan for v in series.rel[stage]]
        xs, ys = downsample_max(steps, ys)
        style = {"color": cmap(i % 10), **_stage_style(i, marker)}
        if any(not math.isnan(y) for y in ys):
            top.plot(xs, ys, label=_label(stage), **style)
        cx, cy = downsample_max(steps, [float(c) for c in series.differ[stage]])
        if any(cy):
            bottom.step(cx, cy, where="post", label=_label(stage), **style)
    top.set_yscale("log")
    top.set_ylabel("max |a−b| / max |b|")
    if first_step is not None:
        for ax in (top, bottom):
            ax.axvline(first_step, color="#555", ls="--", lw=0.9)
        top.annotate(f"first divergence (step {first_step})", xy=(first_step, 1), xycoords=("data", "axes fraction"),
                     xytext=(4, -12), textcoords="offset points", fontsize=8, color="#333")
    if top.get_legend_handles_labels()[0]:
        _outside_legend(top, title="largest difference")
    else:
        top.text(0.5, 0.5, "every stage bit-identical at every step", ha="center", va="center", transform=top.transAxes)
    if bottom.get_legend_handles_labels()[0]:
        _outside_legend(bottom, title="records differing")
    top.grid(True, which="major", alpha=0.3)
    bottom.set_ylabel("records differing", fontsize=8)
    bottom.set_xlabel("step")
    bottom.grid(True, alpha=0.3)
    _integer_axis(bottom.xaxis)  # shared with the top panel
    _integer_axis(bottom.yaxis)
    if title:
        top.set_title(_label(title), fontsize=10)
    return _svg(fig, salt)


def _row_label(label: str, width: int = 48) -> str:
    """A heatmap row label at most ``width`` characters: a long path loses its start, never its ``(Class)``."""
    text = _label(label)
    if len(text) <= width:
        return text
    head, sep, cls = text.rpartition(" (")
    path, tail = (head, sep + cls) if sep and text.endswith(")") else (text, "")
    keep = max(8, width - 1 - len(tail))
    return "…" + path[-keep:] + tail


@_quiet_glyphs
def module_heatmap(grid: ModuleGrid, *, salt: str = "modules") -> str:
    """Modules × stages at one step, colour = log10 of the relative difference (viridis:
    no colour of the scale is near the white of an empty cell); identical cells light grey, cells without a record blank, differing-but-unsized cells hatched.
    Rows in chain order, labelled ``path (Class)``; the first broken link outlined in red (SVG id ``FIRST_GID``)."""
    import numpy as np

    plt = _pyplot()
    rows, cols = len(grid.modules), len(grid.stages)
    data = np.full((rows, cols), np.nan)
    same = np.zeros((rows, cols), bool)
    unsized = []
    for i, row in enumerate(grid.values):
        for j, v in enumerate(row):
            if v is None:
                unsized.append((i, j))
            elif v == 0:
                same[i, j] = True
            elif not math.isnan(v):
                data[i, j] = math.log10(min(v, 1e3))
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * cols, 1.0 + 0.26 * rows))
    ax.imshow(np.where(same, 1.0, np.nan), cmap="Greys", vmin=0, vmax=6, aspect="auto", interpolation="nearest")
    finite = data[~np.isnan(data)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (-8.0, 0.0)
    if hi - lo < 1:
        lo, hi = lo - 0.5, hi + 0.5
    im = ax.imshow(data, cmap="viridis", vmin=lo, vmax=hi, aspect="auto", interpolation="nearest")
    for i, j in unsized:
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#c62828", lw=0.6))
    if grid.first is not None:
        i, j = grid.first
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#d50000", lw=2.4, zorder=5,
                                   gid=FIRST_GID))
    ax.set_xticks(range(cols), [_label(s) for s in grid.stages], fontsize=8, rotation=30, ha="right")
    ax.set_yticks(range(rows), [_row_label(grid.label(i)) for i in range(rows)], fontsize=8)
    ax.set_ylabel("module (class), in chain order", fontsize=8)
    ax.set_title(f"step {grid.step}: log10 relative difference per module and stage", fontsize=10)
    cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    cb.set_label("log10(max |a−b| / max |b|)", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    return _svg(fig, salt)


def night_key(h: dict[str, Any]) -> str:
    """Which night a history row belongs to: its ``night_id`` when the document has one (two
    audits started in the same second are two nights), else its ``started`` time."""
    nid = h.get("night_id")
    return f"id:{nid}" if isinstance(nid, str) and nid else f"at:{h.get('started') or ''}"


def _night_start(history: Sequence[dict[str, Any]]) -> dict[str, str]:
    """night key -> its ``started`` text (the first row's)."""
    out: dict[str, str] = {}
    for h in history:
        out.setdefault(night_key(h), str(h.get("started") or ""))
    return out


def night_labels(history: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The nights of ``history`` in time order and a label each: date and time to the minute
    (``2026-12-06 14:30``), to the second where two share a minute, then the night id where
    two share even that; a night with no time is ``(no time)``."""
    start = _night_start(history)
    keys = sorted(start, key=lambda k: (start[k], k))

    def at(k: str, n: int) -> str:
        t = start[k].replace("T", " ")
        return t[:n] if t else "(no time)"

    labels = [at(k, 16) for k in keys]
    for extend in (lambda k, lab: at(k, 19), lambda k, lab: f"{lab} #{k.split(':', 1)[1][:8]}"):
        seen: dict[str, int] = {}
        for lab in labels:
            seen[lab] = seen.get(lab, 0) + 1
        labels = [extend(k, lab) if seen[lab] > 1 else lab for k, lab in zip(keys, labels)]
    return keys, labels


def _check_name(h: dict[str, Any]) -> str:
    c = h.get("check")
    return "(no name)" if c is None or c == "" else str(c)


@_quiet_glyphs
def history_plot(history: Sequence[dict[str, Any]], *, max_nights: int = 60, salt: str = "history") -> str:
    """The audit history: per check, the verdict of each night (top) and its wall time (bottom).
    Nights are told apart by ``night_id`` (``night_key``) and labelled to the minute
    (``night_labels``); the legends sit outside the axes, never over a point."""
    import numpy as np

    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    keys, names = night_labels(history)
    keys, names = keys[-max_nights:], names[-max_nights:]
    checks = list(dict.fromkeys(_check_name(h) for h in history))[:30]
    col = {n: i for i, n in enumerate(keys)}
    row = {c: i for i, c in enumerate(checks)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 1.6 + 0.3 * len(checks) + 2.2), sharex=True,
                                      gridspec_kw={"height_ratios": [max(1.0, 0.3 * len(checks)), 2.2]})
    kinds = list(_VERDICT_COLOURS)
    strip = np.full((len(checks), len(keys)), np.nan)
    walls: dict[str, list[tuple[int, float]]] = {c: [] for c in checks}
    for h in history:
        n, c = night_key(h), _check_name(h)
        if n not in col or c not in row:
            continue
        v = str(h.get("verdict"))
        strip[row[c], col[n]] = kinds.index(v) if v in kinds else len(kinds)
        w = h.get("wall_s")
        if isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w):
            walls[c].append((col[n], float(w)))
    cmap = ListedColormap([*_VERDICT_COLOURS.values(), "#9e9e9e"])
    top.imshow(strip, cmap=cmap, vmin=-0.5, vmax=len(kinds) + 0.5, aspect="auto", interpolation="nearest")
    top.set_yticks(range(len(checks)), [_label(c) for c in checks], fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=v) for v in _VERDICT_COLOURS.values()]
    _outside_legend(top, handles=handles, labels=list(_VERDICT_COLOURS), title="verdict")
    for i, (c, pts) in enumerate(walls.items()):
        if pts:
            pts.sort()
            bottom.plot([p[0] for p in pts], [p[1] for p in pts], label=_label(c),
                        **_stage_style(i, len(keys) <= 30))
    bottom.set_ylabel("wall time (s)", fontsize=8)
    bottom.grid(True, alpha=0.3)
    step = max(1, len(keys) // 10)
    bottom.set_xticks(range(0, len(keys), step), [_label(names[i]) for i in range(0, len(keys), step)],
                      fontsize=7, rotation=30, ha="right")
    if any(walls.values()):
        _outside_legend(bottom, title="check")
    return _svg(fig, salt)
