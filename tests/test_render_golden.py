"""What the commands print, pinned: one representative text and ``--json`` output per command.

The rendering moved into ``reprobisect.render`` (issue 11, item 5); these files were written
by the code before the move, so the move is proven output-preserving. Real traces written
through the writer API, real result values; no subprocess (cheap). Regenerate on purpose
only: ``REPROBISECT_REGEN_GOLDEN=1 pytest tests/test_render_golden.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from reprobisect.cli import main
from reprobisect.core.compare import Tolerance, compare_paths
from reprobisect.core.envdiff import diff_environments
from reprobisect.core.outcome import Outcome
from reprobisect.core.verdict import Verdict
from reprobisect.executors.base import ProbeResult, ProbeSpec
from reprobisect.trace import TraceWriter, read_trace, record_array
from reprobisect.render import (
    envs_json,
    probe_report_json,
    render_envs,
    render_probe_report,
    render_repro,
    render_seed_map,
    repro_json,
    seed_map_json,
)
from reprobisect.workflows.envs import EnvsResult, parse_env_spec
from reprobisect.workflows.repro import ProbeReport, ReproResult
from reprobisect.workflows.seeds import SeedMap, noise_floor, seed_map

GOLDEN = Path(__file__).parent / "golden" / "render"
ENV = {"device": "cpu", "python": {"argv": ["train.py", "--lr", "1e-3"]}, "env_vars": {"PYTHONHASHSEED": "0"},
       "packages": {"torch": {"version": "2.13.0", "path": "/a/torch"}}, "host": "h1"}


def _trace(path: Path, *, seed: int = 0, env: dict | None = None, bump_step: int | None = None,
           batch_seed: int | None = None, steps: int = 3) -> str:
    with TraceWriter(path, command=["python", "train.py"], environment=env or ENV) as w:
        for k in range(steps):
            w.begin_step(k)
            rng = np.random.default_rng(100 + k)
            wr = np.random.default_rng(seed + 1000 * k)
            x = rng.standard_normal((4, 8)).astype(np.float32)
            rows = [
                ("input", "x", x, None),
                ("activation", "fc1", wr.standard_normal((4, 16)).astype(np.float32), "Linear"),
                ("activation", "drop", wr.standard_normal((4, 16)).astype(np.float32), "Dropout"),
                ("loss", "loss", np.float32(wr.standard_normal()), None),
                ("grad", "fc1.weight", wr.standard_normal((16, 8)).astype(np.float32), None),
                ("param", "fc1.weight", wr.standard_normal((16, 8)).astype(np.float32), None),
            ]
            for kind, name, a, module in rows:
                if bump_step == k and kind == "grad":
                    a = a.copy()
                    a[2, 3] += np.float32(1e-3)
                w.record(record_array(name, kind, a, module=module), a)
            ids = [k * 2, k * 2 + 1] if batch_seed is None else [int(i) for i in np.random.default_rng(batch_seed + k).permutation(8)[:2]]
            w.end_step({"loss": float(1.0 + seed + k), "grad_norm": float(2.0 + 0.5 * seed)}, batch_ids=ids)
    return str(path)


def _result(key: str, trace: str, *, env: dict | None = None) -> ProbeResult:
    return ProbeResult(spec=ProbeSpec(key=key, argv=("python", "train.py"), workdir="/w", env=env or {}),
                       outcome=Outcome("ok"), trace_dir=trace, commit_ran="0123456789abcdef0123", host="h1")


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("golden")
    return {
        "root": str(root),
        "a": _trace(root / "a"),
        "a2": _trace(root / "a2"),
        "b": _trace(root / "b", bump_step=1, env={**ENV, "python": {"argv": ["train.py", "--lr", "2e-3"]}}),
        "s0": _trace(root / "s0", seed=0, batch_seed=0),
        "s1": _trace(root / "s1", seed=1, batch_seed=1),
        "s2": _trace(root / "s2", seed=2, batch_seed=2),
    }


def _check(name: str, text: str, root: str) -> None:
    text = text.replace(root, "<tmp>")
    path = GOLDEN / name
    if os.environ.get("REPROBISECT_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed"


def _json(data) -> str:
    return json.dumps(data, indent=2) + "\n"


def test_compare_text_and_json(traces, capsys):
    root = traces["root"]
    for args, name, code in (([traces["a"], traces["b"]], "compare_diverged", 1),
                             ([traces["a"], traces["a2"]], "compare_agree", 0),
                             ([traces["a"], traces["b"], "--atol", "1e-5", "--override", "param/*=bitwise"], "compare_explicit", 1)):
        assert main(["compare", *args]) == code
        _check(f"{name}.txt", capsys.readouterr().out, root)
        assert main(["compare", *args, "--json"]) == code
        _check(f"{name}.json", capsys.readouterr().out, root)


def test_repro_text_and_json(traces):
    root = traces["root"]
    runs = (_result("repro-run0", traces["a"], env={"PYTHONHASHSEED": "0"}),
            _result("repro-run1", traces["b"], env={"PYTHONHASHSEED": "1"}),
            _result("repro-run2", traces["a2"], env={"PYTHONHASHSEED": "2"}))
    tol = Tolerance(mode="bitwise")
    comps = tuple(compare_paths(traces["a"], r.trace_dir, tolerance=tol) for r in runs[1:])
    env_set = {"env_vars": {"PYTHONHASHSEED": "0"}, "determinism": {"deterministic_algorithms": True, "x": {"y": 1}},
               "threads": {"num_threads": 4}}
    r = ReproResult(runs=runs, comparisons=comps, tolerance="bitwise", hashseeds=("0", "1", "2"), environment_set=env_set)
    _check("repro_differs.txt", render_repro(r) + "\n", root)
    _check("repro_differs.json", _json(repro_json(r)), root)
    same = ReproResult(runs=(runs[0], runs[2]), comparisons=(comps[1],), tolerance={"atol": 1e-5, "rtol": 0.0},
                       hashseeds=(None, None), environment_set={})
    _check("repro_same.txt", render_repro(same) + "\n", root)
    _check("repro_same.json", _json(repro_json(same)), root)


def test_seeds_text_and_json(traces):
    root = traces["root"]
    ts = [read_trace(traces[k]) for k in ("s0", "s1", "s2")]
    seeds = ("0", "1", "2")
    runs = tuple(_result(f"seed-{i}", traces[f"s{i}"]) for i in range(3))
    m = SeedMap(seeds=seeds, components=seed_map(ts, seeds), runs=runs, noise_floor=noise_floor(ts),
                first_divergence=compare_paths(traces["s0"], traces["s1"], tolerance=Tolerance(mode="bitwise")))
    _check("seeds.txt", render_seed_map(m) + "\n", root)
    _check("seeds.json", _json(seed_map_json(m)), root)
    m2 = SeedMap(seeds=seeds[:2], components=seed_map(ts[:2], seeds[:2]), runs=runs[:2])
    _check("seeds_plain.txt", render_seed_map(m2) + "\n", root)
    _check("seeds_plain.json", _json(seed_map_json(m2)), root)


def test_envs_text_and_json(traces):
    root = traces["root"]
    sa, sb = parse_env_spec("env.OMP_NUM_THREADS=1,lr=0.01", "a"), parse_env_spec("python=/opt/py,lr=0.02", "b")
    ta, tb = read_trace(traces["a"]), read_trace(traces["b"])
    comp = compare_paths(traces["a"], traces["b"], tolerance=Tolerance(mode="default"))
    r = EnvsResult(a=sa, b=sb, runs=(_result("envs-a", traces["a"]), _result("envs-b", traces["b"])),
                   env_changes=tuple(diff_environments(ta.manifest.environment, tb.manifest.environment)), comparison=comp)
    _check("envs.txt", render_envs(r) + "\n", root)
    _check("envs.json", _json(envs_json(r)), root)


def test_probe_text_and_json(traces):
    root = traces["root"]
    comp = compare_paths(traces["a"], traces["b"], tolerance=Tolerance(mode="bitwise"))
    bad = ProbeReport(verdict=Verdict("bad", "differs from the reference: step 1", comparison=comp, check="match"),
                      result=_result("probe-1", traces["b"]), reference=traces["a"])
    _check("probe_bad.txt", render_probe_report(bad) + "\n", root)
    _check("probe_bad.json", _json(probe_report_json(bad)), root)
    good = ProbeReport(verdict=Verdict("good", "no NaN/Inf in 3 step(s)", check="finite"),
                       result=ProbeResult(spec=ProbeSpec(key="probe-2", argv=("python", "t.py")), outcome=Outcome("ok")))
    _check("probe_good.txt", render_probe_report(good) + "\n", root)
    _check("probe_good.json", _json(probe_report_json(good)), root)


def test_render_is_a_leaf():
    """The rendering package imports nothing of reprobisect but itself and errors (module or
    function level), so every layer may render without an import cycle."""
    import ast

    import reprobisect.render

    pkg = Path(reprobisect.render.__file__).parent
    found = []
    for f in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [(f.name, n) for n in names if n.startswith(("reprobisect", "."))
                      and not n.startswith(("reprobisect.render", "reprobisect.errors", "."))]
    assert not found, found


def test_compare_json_carries_the_zoom(traces):
    """``bisect compare --zoom --json``: the zoom's own JSON under "zoom" (its text when it has none)."""
    from reprobisect.render import comparison_json

    c = compare_paths(traces["a"], traces["b"])

    class Zoomed:
        def to_json(self):
            return {"verdict": "origin"}

    assert comparison_json(c) == c.to_json()
    assert comparison_json(c, Zoomed()) == {**c.to_json(), "zoom": {"verdict": "origin"}}
    assert comparison_json(c, "no zoom: traces agree")["zoom"] == "no zoom: traces agree"
