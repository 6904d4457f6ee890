"""Hints on evidence (``reprobisect.core.hints``), the per-step tally, the whole argv, the lr note:
on traces written through the writer API (cheap: no framework)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reprobisect.core.compare import Tolerance, compare_paths
from reprobisect.render import render_comparison
from reprobisect.trace import TraceWriter, record_array

ENV = {"device": "cpu", "python": {"argv": ["train.py"]}, "env_vars": {}}


def _tensors(k: int, init_seed: int) -> list[tuple[str, str, np.ndarray, str | None]]:
    """One step of a tiny model: data from the step, weights from ``init_seed``."""
    data = np.random.default_rng(100 + k)
    w = np.random.default_rng(init_seed + 1000 * k)
    x = data.standard_normal((4, 8)).astype(np.float32)
    return [
        ("input", "x", x, None),
        ("activation", "fc1", w.standard_normal((4, 16)).astype(np.float32), "Linear"),
        ("loss", "loss", np.float32(w.standard_normal()), None),
        ("grad", "fc1.weight", w.standard_normal((16, 8)).astype(np.float32), None),
        ("param", "fc1.weight", w.standard_normal((16, 8)).astype(np.float32), None),
        ("param", "fc1.bias", w.standard_normal(16).astype(np.float32), None),
    ]


def trace(path: Path, *, init_seed: int = 0, seed=None, env=None, batch=None, lr=(0.001,), steps: int = 3,
          same_from: int = 10**9, tensors=None, drop=(), init: bool = False, extra=None) -> Path:
    with TraceWriter(path, command=["python", "train.py"], environment=env or ENV, seed=seed, extra=extra) as wr:
        for k in range(steps):
            wr.begin_step(k)
            rows = (tensors or _tensors)(k, init_seed if k < same_from else 0)
            if init and k == 0:
                w0 = np.random.default_rng(init_seed).standard_normal((16, 8)).astype(np.float32)
                wr.record(record_array("fc1.weight", "init", w0), w0)
            for kind, name, a, module in rows:
                if (k, kind, name) in drop:
                    continue
                wr.record(record_array(name, kind, a, module=module), a)
            wr.end_step({"loss": 1.0, "lr": list(lr)}, batch_ids=batch(k) if batch else [k * 2, k * 2 + 1])
    return path


def hints_of(c) -> list[str]:
    return [ln for ln in render_comparison(c).splitlines() if ln.startswith("hint:")]


# -- 2. honest hints ------------------------------------------------------------------------


def test_unseeded_script_gets_the_seed_hint_not_the_hashseed_one(tmp_path):
    a = trace(tmp_path / "a", init_seed=1)
    b = trace(tmp_path / "b", init_seed=2)
    c = compare_paths(a, b)
    assert not c and c.first.step == 0
    hs = hints_of(c)
    assert any("initial parameters differ: no seed was set" in h and "torch.manual_seed(N)" in h
               and "lightning.seed_everything(N)" in h and "keras.utils.set_random_seed(N)" in h for h in hs), hs
    assert not any("PYTHONHASHSEED" in h for h in hs), hs
    assert c.to_json()["hints"] == [h[len("hint: "):] for h in hs]


def test_unseeded_script_that_shuffles_gets_the_seed_hint_not_the_hashseed_one(tmp_path):
    """No seed: the loader shuffles differently (batch ids differ first in chain order) AND the
    weights start elsewhere; the missing seed explains both, string hashing neither."""
    a = trace(tmp_path / "a", init_seed=1)
    b = trace(tmp_path / "b", init_seed=2, batch=lambda k: [k * 2 + 1, k * 2])
    c = compare_paths(a, b)
    assert c.first.kind == "batch"
    hs = hints_of(c)
    assert any("initial parameters differ: no seed was set" in h for h in hs), hs
    assert not any("PYTHONHASHSEED" in h for h in hs), hs


def test_seeded_runs_get_no_no_seed_hint(tmp_path):
    c = compare_paths(trace(tmp_path / "a", init_seed=1, seed=0), trace(tmp_path / "b", init_seed=2, seed=0))
    assert not any("no seed was set" in h for h in hints_of(c))
    c = compare_paths(trace(tmp_path / "c", init_seed=1, seed=0), trace(tmp_path / "d", init_seed=2, seed=1))
    assert any("seeded differently (0 vs 1)" in h for h in hints_of(c))


def test_a_late_small_divergence_gets_no_seed_hint(tmp_path):
    """Same init, a nondeterministic kernel at step 2: neither the seed nor hashing is the cause."""
    def tweak(k, s):
        rows = _tensors(k, 0)
        if k == 2:
            name, kind = rows[1][1], rows[1][0]
            x = rows[1][2].copy()
            x[0, 0] = np.nextafter(x[0, 0], np.float32(np.inf))
            rows[1] = (kind, name, x, "Linear")
        return rows

    c = compare_paths(trace(tmp_path / "a"), trace(tmp_path / "b", tensors=tweak))
    assert not c and c.first.step == 2
    assert hints_of(c) == []


def test_init_records_are_strong_evidence(tmp_path, monkeypatch):
    """With ``init`` records (parameters before the first step) the hint rests on them."""
    import reprobisect.trace.format as fmt
    import reprobisect.trace.writer as wrt

    kinds = ("batch", "init", *[k for k in fmt.KINDS if k not in ("batch", "init")])
    monkeypatch.setattr(fmt, "KINDS", kinds)
    monkeypatch.setattr(wrt, "KINDS", kinds)
    c = compare_paths(trace(tmp_path / "a", init_seed=1, init=True), trace(tmp_path / "b", init_seed=2, init=True))
    assert c.first.kind == "init"
    assert any("initial parameters differ: no seed was set" in h for h in hints_of(c))


def test_hashseed_hint_only_for_data_order_with_hashing_randomised(tmp_path):
    order = lambda k: [k * 2, k * 2 + 1] if k < 1 else [k * 2 + 1, k * 2]  # noqa: E731
    a = trace(tmp_path / "a")
    b = trace(tmp_path / "b", batch=order)
    c = compare_paths(a, b)
    assert c.first.kind == "batch"
    assert any("PYTHONHASHSEED was unset" in h and "data order" in h for h in hints_of(c))
    env0 = {**ENV, "env_vars": {"PYTHONHASHSEED": "0"}}
    c = compare_paths(trace(tmp_path / "c", env=env0), trace(tmp_path / "d", env=env0, batch=order))
    assert not any("PYTHONHASHSEED" in h for h in hints_of(c))  # hashing was fixed: not the cause
    env1 = {**ENV, "env_vars": {"PYTHONHASHSEED": "1"}}
    c = compare_paths(trace(tmp_path / "e", env=env0), trace(tmp_path / "f", env=env1, batch=order))
    assert any("different PYTHONHASHSEED (0 vs 1)" in h for h in hints_of(c))


def test_repro_text_has_no_hashseed_hint_for_an_unseeded_script(tmp_path):
    from reprobisect.executors.base import ProbeResult, ProbeSpec
    from reprobisect.core.outcome import Outcome
    from reprobisect.render import render_repro
    from reprobisect.workflows.repro import ReproResult

    a, b = trace(tmp_path / "a", init_seed=1), trace(tmp_path / "b", init_seed=2)
    c = compare_paths(a, b)
    runs = tuple(ProbeResult(spec=ProbeSpec(key=f"r{i}", argv=("python", "train.py")), outcome=Outcome("ok"),
                             trace_dir=str(p)) for i, p in enumerate((a, b)))
    text = render_repro(ReproResult(runs=runs, comparisons=(c,), tolerance=Tolerance(mode="bitwise"), hashseeds=(None, None),
                                    environment_set={"env_vars": {}}))
    assert "hint: initial parameters differ: no seed was set" in text
    assert "hint: PYTHONHASHSEED" not in text


# -- 3. full argv, the lr next to a param divergence -----------------------------------------


def test_a_long_argv_is_shown_whole(tmp_path):
    argv = ["train.py", "--data", "/very/long/path/to/the/dataset/folder/train", "--epochs", "90",
            "--batch-size", "256", "--workers", "8", "--lr"]
    a = trace(tmp_path / "a", env={**ENV, "python": {"argv": [*argv, "1e-3"]}})
    b = trace(tmp_path / "b", env={**ENV, "python": {"argv": [*argv, "2e-3"]}})
    text = render_comparison(compare_paths(a, b))
    line = next(ln for ln in text.splitlines() if "python.argv" in ln)
    assert "'1e-3']" in line and "'2e-3']" in line and "…" not in line, line
    from reprobisect.core.envdiff import diff_environments

    (ch,) = [d for d in diff_environments({"python": {"argv": [*argv, "1e-3"]}}, {"python": {"argv": [*argv, "2e-3"]}})]
    assert "'2e-3'" in str(ch)


def test_lr_difference_is_shown_under_a_param_divergence(tmp_path):
    def same_grads_other_params(k, s):
        rows = _tensors(k, 0)
        if s == 1:  # a larger step: every parameter far from A's, the forward of step 0 identical
            rows[4] = ("param", "fc1.weight", rows[4][2] * np.float32(2), None)
            rows[5] = ("param", "fc1.bias", rows[5][2] * np.float32(2), None)
        return rows

    a = trace(tmp_path / "a", lr=(0.001,))
    b = trace(tmp_path / "b", lr=(0.002,), init_seed=1, tensors=same_grads_other_params)
    c = compare_paths(a, b)
    assert c.first.kind == "param" and c.first.step == 0
    assert c.explanation == "lr differs: 0.001 vs 0.002 at step 0"
    lines = render_comparison(c).splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("first divergence"))
    assert "likely explanation: lr differs: 0.001 vs 0.002 at step 0" in "\n".join(lines[i + 1:i + 4])
    assert hints_of(c) == []  # the forward agreed: the init did not differ, whatever seed the manifest says
    # per group, and never when the gradients already differed (the lr is then not the explanation)
    b2 = trace(tmp_path / "b2", lr=(0.001, 0.5), init_seed=1, tensors=same_grads_other_params)
    assert compare_paths(trace(tmp_path / "a2", lr=(0.001, 0.1)), b2).explanation.startswith("lr (group 1) differs: 0.1 vs 0.5")
    c3 = compare_paths(a, trace(tmp_path / "b3", lr=(0.002,), init_seed=5))
    assert c3.first.kind != "param" and c3.explanation == ""


# -- 4. the per-step tally -------------------------------------------------------------------


def test_per_step_tally_never_counts_more_differing_than_records(tmp_path):
    drop = {(0, kind, name) for kind, name, _, _ in _tensors(0, 0)[1:]}  # A lost 5 of its 6 records at step 0
    a = trace(tmp_path / "a", drop=drop)
    b = trace(tmp_path / "b", batch=lambda k: [9, 9])  # and the batches differ
    c = compare_paths(a, b)
    s0 = c.per_step[0]
    assert s0.differ <= s0.records, s0
    assert s0.records == 6 + 1 and s0.differ == 5 + 1  # the union of both sides, and the batch ids
    assert s0.identical + s0.close + s0.differ == s0.records
    assert "0: 6/7" in render_comparison(c)
    for s in c.per_step:
        assert s.identical + s.close + s.differ == s.records


# -- layers a TensorFlow graph-mode fit does not expose --------------------------------------


def _no_layers(k: int, init_seed: int) -> list[tuple[str, str, np.ndarray, str | None]]:
    """A graph-mode Keras step: input, output, loss, grads, params; no layer outputs."""
    return [(kind, name, a, m) for kind, name, a, m in _tensors(k, init_seed) if kind != "activation"]


def test_a_divergence_behind_unrecorded_layers_says_how_to_name_the_layer(tmp_path):
    graph = {"tensorflow": {"mode": "graph", "layer_outputs": "not recorded: graph mode (run_eagerly=False)"}}
    a = trace(tmp_path / "a", tensors=_no_layers, extra=graph)
    b = trace(tmp_path / "b", tensors=_no_layers, init_seed=1, extra=graph)
    c = compare_paths(a, b)
    assert c.first is not None and c.first.kind == "loss"
    (hint,) = [h for h in hints_of(c) if "layer outputs" in h]
    assert "graph mode" in hint and "REPROBISECT_TF_EAGER=1" in hint
    # recorded layers (eager, torch): no such hint
    e = trace(tmp_path / "e", tensors=_no_layers, extra={"tensorflow": {"mode": "eager"}})
    f = trace(tmp_path / "f", tensors=_no_layers, init_seed=1, extra={"tensorflow": {"mode": "eager"}})
    assert not [h for h in hints_of(compare_paths(e, f)) if "layer outputs" in h]
