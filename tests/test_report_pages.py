"""The report pages as a reader sees them (issue 37, "Reports people read").

Each report kind -- a comparison, a ``bisect runs`` session, an audit -- is written from
cheap sources (traces from the trace writer, a session log and result cache, an audit
document) and opened in headless Chromium (``test_report_browser.chromium``); the
assertions read the rendered DOM: the plots are inline SVG, their tick labels and legend
entries ``<text>`` elements. What is checked: no ``?`` placeholder anywhere, step axes
tick on integers, the "records differing" panel has a legend outside its data and a
distinct dash per stage, heatmap rows are ``path (Class)`` in chain order with the first
broken link outlined, audit nights told apart, and a diverged ``resume`` check has its
own section. The figures' data (grid order, labels, night labels, noise text) is also
checked without a browser.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from reprobisect.core.session import ResultCache, SessionEvent, SessionLog
from reprobisect.report import write_report
from reprobisect.report.html import _noise, _resume_lines
from reprobisect.report.plots import FIRST_GID, night_labels
from reprobisect.report.stages import stage_differences
from reprobisect.trace import TraceWriter, read_trace, record_array

from test_report import audit_doc
from test_report_browser import CHROMIUM, chromium

browser = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it as root)")

# A torch-like Sequential: module paths are bare indices, the class is recorded with the activation.
LAYERS = (("0", "Linear"), ("1", "ReLU"), ("2", "Linear"), ("3", "ReLU"))
CHAIN_ROWS = ["(batch)", "(input)", "0 (Linear)", "1 (ReLU)", "2 (Linear)", "3 (ReLU)", "(output)", "(loss)"]


def sequential(path: Path, *, steps: int = 3, drift: float = 0.0, start: int = 0) -> Path:
    """A 3-step trace of ``Sequential(Linear, ReLU, Linear, ReLU)``: step 0 opens with the
    ``init`` records of the parameters (registration order: 0, then 2), then the chain; with
    ``drift``, module ``2``'s output differs from step ``start`` on (its inputs agree: the origin)."""
    rng = np.random.default_rng(0)
    weights = {n: np.abs(rng.standard_normal((4, 4))).astype(np.float32) for n in ("0.weight", "2.weight")}
    with TraceWriter(path, command=["python", "train.py"], environment={"python": {"version": "3.11"}}) as w:
        for k in range(steps):
            w.begin_step(k)
            if k == 0:
                for n, p in weights.items():
                    w.record(record_array(n, "init", p))
            x = np.abs(np.random.default_rng(k).standard_normal((2, 4))).astype(np.float32)
            w.record(record_array("data[0]", "batch", x), x)
            w.record(record_array("x", "input", x), x)
            for name, cls in LAYERS:
                before = record_array("in", "input", x).fingerprint
                x = x @ weights[f"{name}.weight"] if cls == "Linear" else np.maximum(x, 0)
                if name == "2" and k >= start:
                    x = x * np.float32(1 + drift * 2 ** (k - start))
                w.record(record_array(name, "activation", x, module=cls, inputs=(before,)), x)
            w.record(record_array("output", "output", x), x)
            w.record(record_array("loss", "loss", np.float32((x ** 2).mean())))
            for n, p in weights.items():
                w.record(record_array(n, "grad", p * np.float32(0.01)))
            w.end_step({"loss": 1.0}, batch_ids=[k])
    return path


def sequential_pair(root: Path, *, steps: int = 3, start: int = 0) -> Path:
    sequential(root / "a", steps=steps)
    sequential(root / "b", steps=steps, drift=1e-3, start=start)
    return root


def runs_session(root: Path, pair: Path, steps: int = 3) -> Path:
    """A ``bisect runs`` folder (log + result cache) whose re-check names commit c..c bad."""
    log = SessionLog.create(root / "sessions" / "0123abcd.jsonl",
                            {"good": "a" * 40, "bad": "c" * 40, "command": ["python", "train.py"], "check": "match",
                             "steps": steps, "terms": ["good", "bad"], "repo": str(root / "no-repo")})
    cache = ResultCache(root / "cache")
    for commit, verdict, trace in (("a" * 40, "good", pair / "a"), ("b" * 40, "good", pair / "a"),
                                   ("c" * 40, "bad", pair / "b")):
        cache.put(commit[:8] + "k", verdict=verdict, trace=trace, extra={"commit": commit})
        log.append(SessionEvent(point=commit, verdict=verdict, role="search", wall_s=1.5))
    log.append(SessionEvent(point="b" * 40, verdict="good", role="recheck"))
    log.append(SessionEvent(point="c" * 40, verdict="bad", role="recheck"))
    return root


RESUME = {"name": "resume-ckpt", "check": "resume", "verdict": "diverged", "passed": False, "reason": None,
          "line": "resumed after step 3: first divergence at step 4 · optimizer state · exp_avg of 0.weight",
          "first_divergence": {"step": 4, "stage": "optimizer state", "tensor": "exp_avg of 0.weight", "rank": None},
          "traces": {"uninterrupted": "/n/full", "interrupted": "/n/cut", "resumed": "/n/resumed"},
          "command": ["python", "train.py"], "wall_s": 9.1, "envdiff": [], "culprit": None, "noise": None,
          "history": {"last_pass": None, "failing_nights": 2, "nights": 2}}


def audit_document(pair: Path) -> dict:
    """Today's audit document (``render.audit.audit_json``): a check within a tolerance (its
    ``noise`` holds only ``tolerance``), a golden whose band has no finite max rel, a diverged
    resume check, and two nights on 2026-12-06."""
    doc = audit_doc(pair)
    doc["checks"][0].update(verdict="within-noise", line="3 runs agree within tolerance (default)",
                            noise={"tolerance": "default"})
    doc["checks"][1]["noise"] = {"tensors": 12, "max_rel": None, "max_abs": None, "runs": 3, "safety": 4.0}
    doc["checks"].append(RESUME)
    doc["history"] += [{"started": f"2026-12-06T{t}+00:00", "check": c, "verdict": v, "wall_s": w}
                       for t in ("02:00:00", "14:30:00")
                       for c, v, w in (("train-det", "within-noise", 3.0), ("golden-mlp", "diverged", 4.4),
                                       ("resume-ckpt", "diverged", 9.0))]
    return doc


# ------------------------------------------------------------------------------ the DOM as a tree


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list["Node"] = field(default_factory=list)
    text: str = ""

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def content(self) -> str:
        return self.text + "".join(c.content() for c in self.children)

    def by_id(self, prefix: str) -> list["Node"]:
        return [n for n in self.walk() if n.attrs.get("id", "").startswith(prefix)]


class _Tree(HTMLParser):
    VOID = {"meta", "br", "img", "hr", "input", "link", "path", "use", "stop", "rect", "circle", "line"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(Node("#text", {}, text=data))


def parse(dom: str) -> Node:
    t = _Tree()
    t.feed(dom)
    return t.root


def plot(root: Node, heading: str) -> Node:
    """The first plot (``<div class='plot'>``) after the heading that starts with ``heading``."""
    under = False
    for n in root.walk():
        if n.tag in ("h2", "h3"):
            under = n.content().startswith(heading)
        elif under and n.tag == "div" and "plot" in n.attrs.get("class", "").split():
            return n
    raise AssertionError(f"no plot under a heading {heading!r}")


def axes(plot: Node) -> list[Node]:
    """The matplotlib axes of a plot's SVG, in drawing order."""
    return [n for n in plot.walk() if n.tag == "g" and re.fullmatch(r"axes_\d+", n.attrs.get("id", ""))]


def ticks(ax: Node, which: str) -> list[tuple[float, str]]:
    """``(position, label)`` of an axes' x or y ticks: the tick mark's x (y) and its text."""
    axis = [n for n in ax.children if n.attrs.get("id", "").startswith("matplotlib.axis_")][0 if which == "x" else 1]
    out = []
    for tick in axis.by_id(f"{which}tick_"):
        use = next(n for n in tick.walk() if n.tag == "use")
        label = "".join(n.content() for n in tick.walk() if n.tag == "text").strip()
        out.append((float(use.attrs[which]), label))
    return out


def box(node: Node) -> tuple[float, float, float, float]:
    """x0, y0, x1, y1 of the first path under ``node``."""
    d = next(n for n in node.walk() if n.tag == "path").attrs["d"]
    nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", d)]
    xs, ys = nums[0::2], nums[1::2]
    return min(xs), min(ys), max(xs), max(ys)


def legend_texts(ax: Node) -> list[tuple[float, str]]:
    legends = [n for n in ax.children if n.attrs.get("id", "").startswith("legend_")]
    return [(float(t.attrs["x"]), t.content()) for lg in legends for t in lg.walk() if t.tag == "text"]


def visible_text(node: Node) -> str:
    """The text a reader sees under ``node`` (no style sheet, no attribute)."""
    if node.tag == "style":
        return ""
    return node.text + "".join(visible_text(c) for c in node.children)


def integer(label: str) -> bool:
    return re.fullmatch(r"[−-]?\d+", label) is not None


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pages")
    pair = sequential_pair(root / "pair")
    (root / "audit.json").write_text(json.dumps(audit_document(pair)))
    return {"comparison": pair, "runs": runs_session(root / "reprobisect", pair), "audit": root / "audit.json"}


@pytest.fixture(scope="module")
def doms(sources, tmp_path_factory) -> dict[str, Node]:
    """Each report kind written, then parsed by Chromium (``--dump-dom``)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it as root)")
    out = tmp_path_factory.mktemp("doms")
    doms = {}
    for kind, src in sources.items():
        page = write_report(src, out / f"{kind}.html")
        r = chromium("--dump-dom", page.resolve().as_uri(), tmp=out)
        assert r.returncode == 0, r.stderr[-2000:]
        doms[kind] = parse(r.stdout)
    return doms


# ------------------------------------------------------------------------------ without a browser


def test_heatmap_rows_are_labelled_modules_in_chain_order(tmp_path):
    pair = sequential_pair(tmp_path)
    series, grid = stage_differences(read_trace(pair / "a"), read_trace(pair / "b"), first=("activation", "2"))
    assert grid is not None and grid.step == 0
    assert [grid.label(i) for i in range(len(grid.modules))] == CHAIN_ROWS, "init records do not reorder the rows"
    assert grid.first == (CHAIN_ROWS.index("2 (Linear)"), grid.stages.index("activation"))


def test_a_module_without_a_recorded_class_is_labelled_by_its_path(tmp_path):
    for side, drift in (("a", 0.0), ("b", 1e-3)):
        with TraceWriter(tmp_path / side) as w:
            w.begin_step(0)
            w.record(record_array("encoder.fc", "activation", np.ones(3, np.float32) * np.float32(1 + drift)))
            w.end_step()
    _, grid = stage_differences(read_trace(tmp_path / "a"), read_trace(tmp_path / "b"))
    assert grid is not None and grid.label(0) == "encoder.fc" and grid.first is None


def test_noise_text_never_shows_a_placeholder():
    assert _noise({"tolerance": "default"}) == "within tolerance: default"
    assert _noise({"tensors": 12, "max_rel": None, "runs": 3}) == "noise band from 12 tensor(s) of 3 run(s), max rel not recorded"
    assert _noise({"max_rel": 2e-6}) == "noise band from tensors not recorded, max rel 2.0e-06"
    assert _noise({}) == "noise band not recorded"


def test_nights_on_one_day_get_labels_of_their_own():
    rows = [{"started": "2026-12-06T02:00:00+00:00"}, {"started": "2026-12-06T14:30:00+00:00"},
            {"started": "2026-12-07T02:00:05+00:00", "night_id": "aaaa1111"},
            {"started": "2026-12-07T02:00:05+00:00", "night_id": "bbbb2222"},
            {"started": "2026-12-07T02:00:05+00:00", "night_id": "aaaa1111"}]
    keys, labels = night_labels(rows)
    assert labels == ["2026-12-06 02:00", "2026-12-06 14:30", "2026-12-07 02:00:05 #aaaa1111",
                      "2026-12-07 02:00:05 #bbbb2222"]
    assert len(keys) == 4


def test_resume_lines_say_where_and_which_run():
    lines = _resume_lines({**RESUME, "finding": {"why": "the optimizer state was not restored", "also": ["lr"]}})
    assert lines[1:3] == ["resume differs at step 4: optimizer state", "  what:  exp_avg of 0.weight"]
    assert "  why:   the optimizer state was not restored" in lines and "  also:  lr" in lines
    assert lines[-3:] == ["  uninterrupted /n/full", "  interrupted   /n/cut", "  resumed       /n/resumed"]


# ------------------------------------------------------------------------------ in the browser


@browser
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["comparison", "runs", "audit"])
def test_no_placeholder_and_integer_step_ticks(doms, kind):
    root = doms[kind]
    text = visible_text(root)
    assert "?" not in text, re.findall(r".{0,40}\?.{0,40}", text)[:3]
    stages = plot(root, "Largest relative difference")
    top, bottom = axes(stages)[:2]
    steps = [label for _, label in ticks(bottom, "x")]
    assert steps and all(integer(s) for s in steps), steps
    counts = [label for _, label in ticks(bottom, "y")]
    assert counts and all(integer(c) for c in counts), counts


@browser
@pytest.mark.slow
def test_records_differing_has_a_legend_outside_and_a_style_per_stage(doms):
    stages = axes(plot(doms["comparison"], "Largest relative difference"))
    bottom = stages[1]
    right = box(bottom.by_id("patch_")[0])[2]
    legend = legend_texts(bottom)
    assert [t for _, t in legend][:1] == ["records differing"]
    assert {"activation", "output", "loss"} <= {t for _, t in legend}
    assert all(x > right for x, _ in legend), "the legend sits right of the data"
    dashes = {m.group(1) for n in bottom.walk() if n.tag == "path" and "clip-path" in n.attrs
              for m in [re.search(r"stroke-dasharray: ([\d.,]+)", n.attrs.get("style", ""))] if m}
    assert len(dashes) >= 2, "coinciding stages are drawn with different dashes"


@browser
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["comparison", "runs", "audit"])
def test_heatmap_rows_and_the_first_broken_link(doms, kind):
    heat = axes(plot(doms[kind], "Per-module differences"))[0]
    rows = ticks(heat, "y")
    assert [label for _, label in rows] == CHAIN_ROWS
    outline = [n for n in heat.walk() if n.attrs.get("id") == FIRST_GID]
    assert len(outline) == 1, "the first broken link is outlined"
    x0, y0, x1, y1 = box(outline[0])
    y = dict((label, pos) for pos, label in rows)["2 (Linear)"]
    x = dict((label, pos) for pos, label in ticks(heat, "x"))["activation"]
    assert (x0 + x1) / 2 == pytest.approx(x, abs=0.5) and (y0 + y1) / 2 == pytest.approx(y, abs=0.5)


@browser
@pytest.mark.slow
def test_audit_page_nights_legend_and_resume_section(doms):
    root = doms["audit"]
    text = visible_text(root)
    assert "max rel not recorded" in text and "noise band from 12 tensor(s) of 3 run(s)" in text
    assert "3 runs agree within tolerance (default)" in text and "within tolerance: default" not in text, "said once"
    hist = axes(plot(root, "History"))
    nights = [label for _, label in ticks(hist[1], "x")]
    assert nights == ["2026-11-30 02:00", "2026-12-01 02:00", "2026-12-06 02:00", "2026-12-06 14:30"]
    right = box(hist[1].by_id("patch_")[0])[2]
    assert {"train-det", "golden-mlp", "resume-ckpt"} <= {t for _, t in legend_texts(hist[1])}
    assert all(x > right for x, _ in legend_texts(hist[1])), "the legend covers no night's point"
    head = next(n for n in root.walk() if n.tag == "h2" and "resume-ckpt" in n.content())
    assert head.content() == "check 'resume-ckpt' (resume): diverged"
    pre = next(n for n in root.walk() if n.tag == "pre" and "resume" in n.attrs.get("class", ""))
    assert "resume differs at step 4: optimizer state" in pre.content()
    assert "resumed       /n/resumed" in pre.content()


@browser
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["comparison", "runs", "audit"])
def test_screenshot_of_each_kind(sources, tmp_path, kind):
    page = write_report(sources[kind], tmp_path / f"{kind}.html")
    png = tmp_path / f"{kind}.png"
    r = chromium(f"--screenshot={png}", "--window-size=1100,1600", page.resolve().as_uri(), tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, "a page with plots, not a blank screen"


def _shots(out: Path) -> None:
    """The screenshots docs/report.md shows: each report kind of a 12-step pair that diverges at
    step 4, written to ``out`` as a small palette PNG (``python tests/test_report_pages.py [OUT]``, default docs/img)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="report-shots-") as tmp:
        _shoot(Path(tmp), out)


def _shoot(src: Path, out: Path) -> None:
    from PIL import Image

    pair = sequential_pair(src / "pair", steps=12, start=4)
    (src / "audit.json").write_text(json.dumps(audit_document(pair)))
    sources = {"comparison": pair, "runs": runs_session(src / "reprobisect", pair, 12),
               "audit": src / "audit.json"}
    for kind, height in (("comparison", 1450), ("runs", 1950), ("audit", 3000)):
        page = write_report(sources[kind], src / f"{kind}.html")
        png = (out / f"report-{kind}.png").resolve()
        r = chromium(f"--screenshot={png}", f"--window-size=1000,{height}", "--hide-scrollbars",
                     page.resolve().as_uri(), tmp=src)
        assert r.returncode == 0, r.stderr[-2000:]
        Image.open(png).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(png, optimize=True)
        print(f"{png}: {png.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    import sys

    _shots(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs" / "img")
