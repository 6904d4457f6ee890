"""The TensorFlow / Keras recorder (issue 14) with real TensorFlow on CPU.

Keras ``fit`` (eager and graph), a ``tf.GradientTape`` loop (eager and under
``tf.function``), the explicit API, fingerprints of TF tensors against NumPy and torch, and
the searches a user runs on a Keras script: ``compare``, ``repro`` (with and without op
determinism), ``runs`` over a git history. Every TF process costs ~3-5 s of CPU (the
import), so captures are shared in module-scoped fixtures, with 2 steps of tiny models.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reprobisect.trace.reader import read_trace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "examples" / "corpus"
PYTHON = sys.executable
TIMEOUT = 300


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONHASHSEED": "0"}


def _launch(trace: Path, script: Path | str, *args: str, steps: int = 2, cwd: Path | None = None,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps), "--",
           str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd or ROOT,
                          env={**_env(), **(extra_env or {})})


def _launch_all(d: Path, launches: dict, cwd: Path | None = None,
                pool: ThreadPoolExecutor | None = None) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Record each of ``launches`` (name -> (script, args, steps[, extra env])) into ``d / name``, two at a
    time: a TF process spends most of its life importing TensorFlow on one core, so the second core
    records another meanwhile. Returns name -> (trace, completed process), as ``_launch`` for each."""

    def one(name: str) -> tuple[Path, subprocess.CompletedProcess]:
        script, args, steps, *extra = launches[name]
        return d / name, _launch(d / name, script, *args, steps=steps, cwd=cwd, extra_env=extra[0] if extra else None)

    if pool is None:
        with ThreadPoolExecutor(max_workers=2) as own:
            return dict(zip(launches, own.map(one, launches)))
    return dict(zip(launches, pool.map(one, launches)))


def _bisect(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "reprobisect", *args], capture_output=True, text=True, timeout=2 * TIMEOUT,
                          cwd=cwd, env=_env())


def _ok(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, p.stderr[-4000:]


def _steps(trace: Path) -> list:
    return list(read_trace(trace).steps)


# --------------------------------------------------------------------------- no framework at import


def test_registry_imports_no_framework():
    code = ("import sys, reprobisect.runners.registry as r; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules)); "
            "print([e.name for e in r.recorders()])")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    _ok(p)
    loaded, names = p.stdout.splitlines()
    assert loaded == "[]"
    assert "'tensorflow'" in names and "'keras'" in names and "'torch'" in names


# --------------------------------------------------------------------------- fingerprints

_FP_SCRIPT = textwrap.dedent("""
    import json
    import ml_dtypes, numpy as np, tensorflow as tf, torch
    from reprobisect.runners import fingerprint_tf as fptf
    from reprobisect.runners import fingerprint_torch as fpt
    from reprobisect.trace.fingerprint import fingerprint as np_fp
    rng = np.random.default_rng(0)
    base = rng.normal(size=(37, 129)).astype(np.float32)  # not a multiple of a row: a partial last row
    out = {}
    cases = {"float32": (base, tf.float32, torch.float32), "float16": (base.astype(np.float16), tf.float16, torch.float16),
             "bfloat16": (base.astype(ml_dtypes.bfloat16), tf.bfloat16, torch.bfloat16),
             "int32": ((base * 1000).astype(np.int32), tf.int32, torch.int32),
             "int64": ((base * 1000).astype(np.int64), tf.int64, torch.int64), "bool": (base > 0, tf.bool, torch.bool)}
    for name, (a, tdt, pdt) in cases.items():
        t = tf.constant(a, dtype=tdt)
        if name == "bfloat16":
            p = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            p = torch.from_numpy(np.array(a))
        flipped = np.array(a).copy()
        flipped.view(np.uint8)[5] ^= 1
        out[name] = {"tf": fptf.fingerprint(t), "np": np_fp(a), "torch": fpt.fingerprint(p),
                     "flipped": fptf.fingerprint(tf.constant(flipped, dtype=tdt)), "var": fptf.fingerprint(tf.Variable(t))}
    t = tf.constant(base)
    out["no_copy"] = bool(np.shares_memory(fptf.host_array(t), fptf.host_array(t)))
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_fingerprints_of_tf_tensors_equal_numpy_and_torch():
    p = subprocess.run([PYTHON, "-c", _FP_SCRIPT], capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    _ok(p)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out.pop("no_copy") is True  # a host tensor is read in place, not copied
    assert set(out) == {"float32", "float16", "bfloat16", "int32", "int64", "bool"}
    for name, fps in out.items():
        assert fps["tf"] == fps["np"] == fps["torch"] == fps["var"], name
        assert fps["flipped"] != fps["tf"], name


# --------------------------------------------------------------------------- tape loops, isolation, None gradients


@pytest.fixture(scope="module")
def tape(tmp_path_factory):
    """The GradientTape corpus loop under tf.function with a severed variable (2 steps, the
    script ends by itself under --steps 5), and a torch-only script."""
    d = tmp_path_factory.mktemp("tape")
    torch_script = d / "torch_only.py"
    torch_script.write_text(textwrap.dedent("""
        import sys, torch
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad(); m(torch.randn(4, 3)).sum().backward(); opt.step()
        print("frameworks loaded:", ",".join(x for x in ("tensorflow", "keras", "torch") if x in sys.modules))
    """))
    xla_script = d / "xla_tape.py"
    xla_script.write_text(textwrap.dedent("""
        import tensorflow as tf
        m = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.1)
        @tf.function(jit_compile=True)
        def step(x):
            with tf.GradientTape() as t:
                loss = tf.reduce_mean(m(x, training=True) ** 2)
            g = t.gradient(loss, m.trainable_variables)
            opt.apply_gradients(zip(g, m.trainable_variables))
            return loss
        print("losses", [float(step(tf.ones((4, 3)))) for _ in range(3)])
    """))
    fit_ds = d / "fit_ds.py"
    fit_ds.write_text(textwrap.dedent("""
        import numpy as np, tensorflow as tf, keras
        keras.utils.set_random_seed(0)
        x = np.random.default_rng(0).normal(size=(40, 4)).astype("float32"); y = x.sum(1, keepdims=True)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(40).batch(8)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        m.compile(optimizer="adam", loss="mse")
        m.fit(ds, epochs=1, verbose=0)
        m.fit(ds.map(lambda a, b: (a * 2, b)), epochs=1, verbose=0)
    """))
    idle_script = d / "idle.py"
    idle_script.write_text("import tensorflow as tf\nprint(float(tf.reduce_sum(tf.ones(3))))\n")
    launches = {
        "graph": (CORPUS / "tf_tape.py", ("--sever", "1", "--function", "1", "--steps", "2"), 5),
        "eager": (CORPUS / "tf_tape.py", ("--sever", "1", "--steps", "2"), 5),
        "torch": (torch_script, (), 5),
        "idle": (idle_script, (), 2),
        "xla": (xla_script, (), 2),
        "fit_ds": (fit_ds, (), 7),
    }
    return _launch_all(d, launches)


@pytest.mark.slow
def test_a_tf_script_never_imports_torch_and_a_torch_script_never_tf(tape):
    for key, want in (("graph", "tensorflow,keras"), ("torch", "torch")):
        trace, p = tape[key]
        _ok(p)
        assert f"frameworks loaded: {want}\n" in p.stdout, (key, p.stdout)
        assert read_trace(trace).manifest.steps == 2


@pytest.mark.slow
def test_a_tf_script_that_never_trains_is_no_steps_with_a_tf_hint(tape):
    trace, p = tape["idle"]
    assert p.returncode == 6, p.stderr[-3000:]  # no_steps
    outcome = read_trace(trace, allow_incomplete=True).manifest.outcome
    assert outcome["status"] == "no_steps" and "no GradientTape.gradient and no optimizer update" in outcome["detail"]


@pytest.mark.slow
def test_fit_on_tf_data_derives_sample_ids_through_shuffle_and_batch_not_through_map(tape):
    trace, p = tape["fit_ds"]
    _ok(p)
    t = read_trace(trace)
    ids = [s.batch_ids for s in t.steps]
    assert all(b is not None for b in ids[:5]) and sorted(sum(ids[:5], [])) == list(range(40))  # one epoch: each row once
    assert ids[5:] == [None, None]  # a map changes the rows: not derivable, and said so
    why = t.manifest.extra["tensorflow"]["batch_ids"]
    assert why.startswith("derived") and "not derivable: the tf.data pipeline has a MapDataset" in why


@pytest.mark.slow
def test_a_tape_loop_under_xla_runs_on_and_is_no_steps_saying_why(tape):
    trace, p = tape["xla"]
    assert p.returncode == 6, p.stderr[-3000:]
    assert "losses [" in p.stdout  # the program ran to its end, untouched
    t = read_trace(trace, allow_incomplete=True)
    assert "XLA-compiled function (jit_compile=True)" in t.manifest.outcome["detail"]
    assert t.manifest.extra["tensorflow"]["mode"] == "xla"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_severed_variable_is_named_and_the_run_continues(tape, mode):
    trace, p = tape[mode]
    _ok(p)
    assert "loss " in p.stdout  # the loop ran to its own end: the None gradient crashed nothing
    warnings = [line for line in p.stderr.splitlines() if line.startswith("reprobisect: warning:")]
    assert len(warnings) == 1 and "severed_scale" in warnings[0] and "None" in warnings[0]
    t = read_trace(trace)
    assert t.manifest.extra["tensorflow"]["none_gradients"] == {"variables": ["severed_scale"], "first_step": 0}
    assert t.manifest.extra["tensorflow"]["mode"] == mode
    assert t.manifest.seed == 0 and t.manifest.extra["seed_source"] == "tf.random.set_seed"  # the script's own
    for s in t.steps:
        assert s.scalars["none_grad_variables"] == ["severed_scale"]
        grads = [r.name for r in s.records if r.kind == "grad"]
        params = [r.name for r in s.records if r.kind == "param"]
        assert "severed_scale" not in grads and "severed_scale" in params
        assert len(grads) == 4 and s.scalars["loss"] > 0
        kinds = [r.kind for r in s.records]
        assert kinds == sorted(kinds, key=["init", "batch", "input", "activation", "output", "loss", "grad", "param",
                                           "optim_state"].index)
    plain = _plain(CORPUS / "tf_tape.py", "--sever", "1", "--steps", "2", *(["--function", "1"] if mode == "graph" else []))
    assert [x for x in p.stdout.splitlines() if x.startswith("loss ")] == \
        [x for x in plain.stdout.splitlines() if x.startswith("loss ")]  # recording changed no numerics
    acts = [r for r in t.steps[0].records if r.kind == "activation"]
    if mode == "eager":
        assert [(r.name, r.module) for r in acts] == [("dense_in", "Dense"), ("logit", "Dense")]
    else:
        assert acts == [] and "not recorded: graph mode" in t.manifest.extra["tensorflow"]["layer_outputs"]
    eager, graph = (read_trace(tape[m][0]) for m in ("eager", "graph"))
    # the same loop in both modes: same batches in, same loss out of step 0
    first = {m: {(r.kind, r.name): r.fingerprint for r in tr.steps[0].records} for m, tr in (("e", eager), ("g", graph))}
    assert first["e"][("input", "input")] == first["g"][("input", "input")] == first["e"][("batch", "data[0]")]
    # the tf.data pipeline (from_tensor_slices -> shuffle -> batch) traced back to its rows, in both modes
    assert t.manifest.extra["tensorflow"]["batch_ids"].startswith("derived")
    ids = [s.batch_ids for s in t.steps]
    assert ids == [s.batch_ids for s in eager.steps] == [s.batch_ids for s in graph.steps]
    assert all(len(b) == 16 and len(set(b)) == 16 and all(0 <= i < 64 for i in b) for b in ids)


# --------------------------------------------------------------------------- Keras fit


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    runs = {
        "eager": ("--eager", "1"),
        "epsilon": ("--eager", "1", "--epsilon", "0.1"),
        "graph": (),
        "xla": ("--jit", "1"),
    }
    launches = {k: (CORPUS / "keras_fit.py", a, 2) for k, a in runs.items()}
    launches["forced"] = (CORPUS / "keras_fit.py", (), 2, {"REPROBISECT_TF_EAGER": "1"})
    return _launch_all(d, launches)


def _plain(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(script), *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
                          env=_env())


@pytest.mark.slow
@pytest.mark.parametrize("eager", ["0", "1"])
def test_recording_changes_no_numerics_of_a_whole_fit(tmp_path, eager):
    """Observers observe: a fit that ends by itself under the recorder (8 steps, --steps 20)
    ends with the same loss, to the bit, as the plain script (graph mode: with its taps)."""
    args = ("--eager", eager)
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side: each mostly imports TensorFlow on one core
        rec = pool.submit(_launch, tmp_path / "t", CORPUS / "keras_fit.py", *args, steps=20)
        plain = pool.submit(_plain, CORPUS / "keras_fit.py", *args)
        rec, plain = rec.result(), plain.result()
    _ok(rec)
    _ok(plain)
    loss = [line for line in rec.stdout.splitlines() if line.startswith("loss ")]
    assert loss and loss == [line for line in plain.stdout.splitlines() if line.startswith("loss ")]
    assert read_trace(tmp_path / "t").manifest.steps == 8
    assert "frameworks loaded: tensorflow,keras\n" in rec.stdout  # a Keras script never imports torch


@pytest.mark.slow
def test_fit_eager_records_the_whole_chain(fit):
    trace, p = fit["eager"]
    _ok(p)
    t = read_trace(trace)
    assert t.manifest.outcome["status"] == "ok" and t.manifest.steps == 2
    tfx = t.manifest.extra["tensorflow"]
    assert tfx["mode"] == "eager" and tfx["run_eagerly"] is True and tfx["batch_ids"].startswith("derived")
    s0 = t.steps[0]
    assert s0.batch_ids is not None and len(s0.batch_ids) == 8
    names = [(r.kind, r.name, r.module) for r in s0.records if r.kind in ("activation", "output")]
    assert names == [("activation", "standardize", "Normalization"), ("activation", "hidden", "Dense"),
                     ("activation", "layer_norm", "LayerNormalization"), ("activation", "dropout", "Dropout"),
                     ("activation", "head", "Dense"), ("output", "output", "Sequential")]
    kinds = {r.kind for r in s0.records}
    assert kinds == {"init", "batch", "input", "activation", "output", "loss", "grad", "param", "optim_state"}
    assert "init" not in {r.kind for r in t.steps[1].records}
    assert s0.scalars["lr"] == [pytest.approx(0.01)] and s0.scalars["loss"] > 0
    assert any(r.name.endswith("_momentum") for r in s0.records if r.kind == "optim_state")
    # the batch the model got is the batch fit drew
    fps = {(r.kind, r.name): r.fingerprint for r in s0.records}
    assert fps[("batch", "data[0]")] == fps[("input", "input")]


@pytest.mark.slow
def test_fit_graph_mode_records_all_but_layer_outputs_and_says_so(fit):
    trace, p = fit["graph"]
    _ok(p)
    t = read_trace(trace)
    tfx = t.manifest.extra["tensorflow"]
    assert tfx["mode"] == "graph" and tfx["run_eagerly"] is False
    assert tfx["layer_outputs"].startswith("not recorded: graph mode (run_eagerly=False)")
    eager = read_trace(fit["eager"][0])
    for sg, se in zip(t.steps, eager.steps):
        kinds = {r.kind for r in sg.records}
        assert "activation" not in kinds and {"batch", "input", "output", "loss", "grad", "param", "optim_state"} <= kinds
        assert sg.batch_ids == se.batch_ids  # Keras' own shuffled order, derived in both modes
    g0 = {(r.kind, r.name): r.fingerprint for r in t.steps[0].records}
    e0 = {(r.kind, r.name): r.fingerprint for r in eager.steps[0].records}
    assert g0[("batch", "ids")] == e0[("batch", "ids")] and g0[("input", "input")] == e0[("input", "input")]
    assert {k for k in g0 if k[0] == "init"} == {k for k in e0 if k[0] == "init"}


@pytest.mark.slow
def test_forced_eager_gives_full_detail_and_says_so(fit):
    trace, p = fit["forced"]
    _ok(p)
    t = read_trace(trace)
    tfx = t.manifest.extra["tensorflow"]
    assert tfx["mode"] == "eager" and "REPROBISECT_TF_EAGER=1" in tfx["forced_eager"]
    p = _bisect("compare", str(fit["eager"][0]), str(trace), "--json", cwd=ROOT)
    out = json.loads(p.stdout)
    assert out["verdict"] == "agree" and out["first"] is None, p.stdout[-2000:]  # the same as run_eagerly=True


@pytest.mark.slow
def test_fit_under_xla_records_variables_from_a_callback_and_says_what_is_missing(fit):
    trace, p = fit["xla"]
    _ok(p)
    t = read_trace(trace)
    tfx = t.manifest.extra["tensorflow"]
    assert tfx["mode"] == "xla" and tfx["jit_compile"] is True
    assert tfx["layer_outputs"] == "not recorded: XLA (jit_compile=True)" and "not recorded" in tfx["xla"]
    assert t.manifest.steps == 2
    assert {r.kind for r in t.steps[0].records} == {"init", "param", "optim_state"}
    eager = read_trace(fit["eager"][0])
    init = lambda tr: {r.name: r.fingerprint for r in tr.steps[0].records if r.kind == "init"}  # noqa: E731
    assert init(t) == init(eager)  # the same initial variables, whatever the mode


@pytest.mark.slow
def test_changed_normalization_epsilon_is_named_by_layer_at_step_0(fit):
    (a, pa), (b, pb) = fit["eager"], fit["epsilon"]
    _ok(pa)
    _ok(pb)
    p = _bisect("compare", str(a), str(b), "--json", cwd=ROOT)
    first = json.loads(p.stdout)["first"]
    assert (first["step"], first["kind"], first["name"], first["module"]) == (0, "activation", "layer_norm",
                                                                             "LayerNormalization")
    assert first["origin"] is True


# --------------------------------------------------------------------------- repro


def _repro(tmp: Path, *args: str) -> dict:
    p = _bisect("repro", "--runs", "2", "-j", "2", "--steps", "2", "-q", "--json", "--", "python", *args, cwd=tmp)
    assert p.returncode in (0, 1), p.stderr[-4000:]
    return json.loads(p.stdout)


@pytest.mark.slow
def test_repro_identical_keras_runs_agree_bitwise(tmp_path):
    out = _repro(tmp_path, str(CORPUS / "keras_fit.py"), "--eager", "1")
    assert out["deterministic"] is True, out["comparisons"][0].get("first")


@pytest.mark.slow
def test_repro_names_an_unseeded_dropout(tmp_path):
    out = _repro(tmp_path, str(CORPUS / "keras_fit.py"), "--eager", "1", "--seed", "none", "--dropout-seed", "none",
                 "--shuffle", "0")
    first = out["comparisons"][0]["first"]
    assert out["deterministic"] is False
    assert (first["step"], first["kind"], first["name"], first["module"]) == (0, "activation", "dropout", "Dropout")


@pytest.mark.slow
def test_repro_names_an_unseeded_sample_order_at_the_batch(tmp_path):
    out = _repro(tmp_path, str(CORPUS / "keras_fit.py"), "--seed", "none")  # graph mode, fit's own shuffle
    first = out["comparisons"][0]["first"]
    assert out["deterministic"] is False
    assert (first["step"], first["kind"]) == (0, "batch")


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", ["0", "1"])
def test_repro_tape_loop_with_and_without_op_determinism(tmp_path, deterministic):
    out = _repro(tmp_path, str(CORPUS / "tf_tape.py"), "--function", "1", "--deterministic", deterministic)
    assert out["deterministic"] is True, out["comparisons"][0].get("first")
    assert all(r["outcome"]["status"] == "ok" for r in out["runs"])


# --------------------------------------------------------------------------- runs over a git history


@pytest.mark.slow
def test_runs_over_a_keras_history_names_the_commit_and_the_layer(tmp_path):
    repo = tmp_path / "proj"
    repo.mkdir()

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()

    src = (CORPUS / "keras_fit.py").read_text()
    git("init", "-q")
    (repo / "train.py").write_text(src)
    git("add", "-A")
    git("commit", "-qm", "keras script")
    good = git("rev-parse", "HEAD")
    (repo / "README.md").write_text("notes\n")
    git("add", "-A")
    git("commit", "-qm", "docs")
    (repo / "train.py").write_text(src.replace('default=1e-3)', 'default=1e-2)'))
    git("commit", "-qam", "change the layer norm epsilon")
    culprit = git("rev-parse", "HEAD")
    (repo / "README.md").write_text("more notes\n")
    git("commit", "-qam", "docs again")
    p = _bisect("runs", "--good", good, "--bad", "HEAD", "--steps", "2", "-j", "2", "-q", "--json", "--", "python",
                "train.py", "--eager", "1", cwd=repo)
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout)
    assert out["first_bad"]["hash"] == culprit
    first = out["divergence"]["first"]
    assert (first["step"], first["kind"], first["name"], first["module"]) == (0, "activation", "layer_norm",
                                                                             "LayerNormalization")


# --------------------------------------------------------------------------- the explicit API

_API_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf
    import reprobisect.tensorflow as rtf
    tf.keras.utils.set_random_seed(0)
    w = tf.Variable(tf.ones((3, 1)), name="w")
    unused = tf.Variable(0.0, name="unused")
    x = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    out = sys.argv[1]
    with rtf.record(trace=out + "/manual", steps=2, full_steps=(0, 1), max_disk=40) as rec:
        for i in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
            gw, gu = tape.gradient(loss, [w, unused])
            w.assign_sub(0.1 * gw)
            rec.step(loss=loss, grads=[gw, gu], variables=[w, unused])
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, name="d")], name="m")
    opt = tf.keras.optimizers.SGD(0.1)
    with rtf.record(model=model, optimizer=opt, trace=out + "/opt", steps=5) as rec:
        for i in range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x, training=True) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            assert rec.step(loss=loss) is False  # the optimizer's apply ended the step already
    print("done", rec.steps)
""")


@pytest.mark.slow
def test_explicit_api_records_manual_updates_and_optimizer_steps(tmp_path):
    p = subprocess.run([PYTHON, "-c", _API_SCRIPT, str(tmp_path)], capture_output=True, text=True, env=_env(),
                       timeout=TIMEOUT, cwd=tmp_path)
    _ok(p)
    assert "done 2" in p.stdout
    manual = read_trace(tmp_path / "manual")
    assert manual.manifest.outcome["status"] == "ok" and manual.manifest.steps == 2  # the third step: quiet
    s0 = manual.steps[0]
    assert [(r.kind, r.name) for r in s0.records] == [("loss", "loss"), ("grad", "w"), ("param", "w"),
                                                      ("param", "unused")]
    assert s0.scalars["none_grad_variables"] == ["unused"]
    # full tensors of step 0 are kept (32 bytes); step 1's would pass max_disk=40: noted, not kept
    assert all(r.stored for r in s0.records) and not any(r.stored for r in manual.steps[1].records)
    assert any("not kept: --max-disk 40" in n for n in manual.manifest.extra["notes"])
    assert "unused" in p.stderr and "reprobisect: warning:" in p.stderr
    opt = read_trace(tmp_path / "opt")
    assert opt.manifest.steps == 2
    kinds = [r.kind for r in opt.steps[1].records]
    assert kinds.count("loss") == 1 and "output" in kinds and "optim_state" in kinds


# --------------------------------------------------------------------------- --detail sentinel: escalation

# a data-dependent branch: the batch holding sample 22 (step 5 of 8) gets unseeded noise on the loss
_LATE_NOISE = textwrap.dedent("""
    import os
    import numpy as np
    import tensorflow as tf
    import keras

    keras.utils.set_random_seed(0)
    xs = np.random.default_rng(1).normal(size=(64, 8)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((np.arange(64), xs)).batch(4)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh", name="fc1"),
                              keras.layers.Dense(1, name="fc2")])
    opt = keras.optimizers.Adam(1e-2)
    for ids, x in ds:
        with tf.GradientTape() as tape:
            h = model(x)
            if bool((ids.numpy() == 22).any()):
                g = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
                h = h + g.random(h.shape).astype("float32") * 1e-3
            loss = tf.reduce_mean(h ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
""")


@pytest.mark.slow
def test_sentinel_repro_of_a_tape_loop_escalates_to_the_first_broken_link(tmp_path):
    """A late divergence in a TF loop under --detail sentinel: the escalation replays (re-runs,
    quiet before step 4, runners.replay_tf) and names step 5's loss, the first broken link a
    full recording names, from replays faithful to their runs. Before replay_tf the launcher
    recorded steps 0..1 as the 'replay' and the answer was 'the replays agree'."""
    (tmp_path / "train.py").write_text(_LATE_NOISE)
    p = _bisect("repro", "--runs", "2", "-j", "2", "--steps", "8", "--detail", "sentinel", "--state-every", "2",
                "-q", "--json", "--keep", "--", "python", "train.py", cwd=tmp_path)
    assert p.returncode in (0, 1), p.stderr[-4000:]
    out = json.loads(p.stdout)
    assert out["deterministic"] is False
    esc = out["escalation"]
    assert esc["conclusive"] is True, esc["reason"]
    assert (esc["step"], esc["from_step"]) == (5, 4) and "re-running" in esc["reason"]
    first = esc["comparison"]["first"]
    assert (first["step"], first["kind"], first["name"]) == (5, "loss", "loss")
    replayed = read_trace(esc["traces"][0])
    assert [s.step for s in replayed.steps] == [4, 5]
    assert replayed.manifest.extra["replay"]["mode"] == "rerun"
    assert any(r.kind == "activation" for r in replayed.steps[0].records)  # full detail
    # a replay asked of a trace with no state there is refused in one line, never recorded from step 0
    q = _launch(tmp_path / "refused", "train.py", steps=1, cwd=tmp_path)
    _ok(q)
    r = subprocess.run([PYTHON, "-m", "reprobisect.runners.launch", "--trace", str(tmp_path / "r2"), "--steps", "1",
                        "--replay-from", str(tmp_path / "refused"), "--replay-step", "3", "--", "train.py"],
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=_env())
    assert "Traceback" not in r.stderr
    t = read_trace(tmp_path / "r2", allow_incomplete=True)
    assert t.manifest.outcome["status"] == "skip" and "no complete state after step 2" in t.manifest.outcome["detail"]
    assert t.manifest.steps == 0


# --------------------------------------------------------------------------- evaluation (validation, evaluate, predict)

# fit on fixed training rows, with or without validation data, then (with it) evaluate and predict
_EVAL_FIT = textwrap.dedent("""
    import sys
    import numpy as np
    import keras

    val, eager = sys.argv[1], sys.argv[2] == "1"
    keras.utils.set_random_seed(0)
    data = np.random.default_rng(7)
    x = data.normal(size=(32, 6)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    xv = data.normal(size=(16, 6)).astype("float32")
    yv = xv.sum(axis=1, keepdims=True).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dropout(0.25, seed=3, name="dropout"), keras.layers.Dense(1, name="head")])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", run_eagerly=eager)
    kw = {"validation_data": (xv, yv)} if val == "data" else {}
    hist = model.fit(x, y, batch_size=8, epochs=2, verbose=0, **kw)
    print("loss", hist.history["loss"])
    if val == "data":
        print("val_loss", hist.history["val_loss"])
        print("evaluate", model.evaluate(xv, yv, batch_size=8, verbose=0))
        print("predict", model.predict(xv, batch_size=8, verbose=0).tobytes().hex())
""")


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    d = tmp_path_factory.mktemp("evaluation")
    (d / "fit_val.py").write_text(_EVAL_FIT)
    runs = {"none": ("none", "0"), "val": ("data", "0"), "val_eager": ("data", "1")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain = pool.submit(subprocess.run, [PYTHON, str(d / "fit_val.py"), "data", "0"], capture_output=True,
                            text=True, timeout=TIMEOUT, cwd=d, env=_env())
        out = _launch_all(d, {k: (d / "fit_val.py", a, 20) for k, a in runs.items()}, cwd=d, pool=pool)
        return d, out, plain.result()


@pytest.mark.slow
def test_validation_never_changes_the_training_records(evaluation):
    """Two captures differing only in validation agree bitwise: evaluation forwards are never records."""
    d, out, _ = evaluation
    for k in ("none", "val"):
        _ok(out[k][1])
    a, b = read_trace(out["none"][0]), read_trace(out["val"][0])
    assert a.manifest.steps == b.manifest.steps == 8
    assert [[r.key for r in s.records] for s in a.steps] == [[r.key for r in s.records] for s in b.steps]
    p = _bisect("compare", str(out["none"][0]), str(out["val"][0]), "--json", cwd=d)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert json.loads(p.stdout)["first"] is None


@pytest.mark.slow
@pytest.mark.parametrize("run", ["val", "val_eager"])
def test_validation_evaluate_and_predict_are_summarised_as_evaluation(evaluation, run):
    """Validation after epoch 1 is in step 4's scalars['eval']; the last epoch's validation,
    evaluate and predict after fit are in the manifest's eval_after_last_step (as the torch
    recorder: phase, after_step, forwards, batches, samples, ids and outputs fingerprints)."""
    _, out, _ = evaluation
    trace, p = out[run]
    _ok(p)
    t = read_trace(trace)
    assert [s.step for s in t.steps if s.scalars.get("eval")] == [4]
    (v1,) = t.steps[4].scalars["eval"]
    assert {k: v1[k] for k in ("phase", "after_step", "forwards", "batches", "samples", "outputs_fingerprinted")} == \
        {"phase": "validation", "after_step": 3, "forwards": 2, "batches": 2, "samples": 16, "outputs_fingerprinted": 2}
    tail = t.manifest.extra["eval_after_last_step"]
    assert [(e["phase"], e["after_step"], e["batches"], e["samples"]) for e in tail] == \
        [("validation", 7, 2, 16), ("evaluate", 7, 2, 16), ("predict", 7, 2, 16)]
    ids = {e["ids_fingerprint"] for e in [v1, *tail]}
    assert len(ids) == 1 and None not in ids  # the same 16 rows, in order, every time
    # validation after epoch 2 and evaluate after fit see the same parameters: the same outputs
    assert tail[0]["outputs_fingerprint"] == tail[1]["outputs_fingerprint"] == tail[2]["outputs_fingerprint"]
    assert v1["outputs_fingerprint"] != tail[0]["outputs_fingerprint"]


@pytest.mark.slow
def test_summarising_evaluation_changes_no_numerics(evaluation):
    """Observers observe: val_loss, evaluate and predict of the recorded graph-mode run equal the plain run's."""
    _, out, plain = evaluation
    _ok(plain)
    _ok(out["val"][1])
    want = [line for line in plain.stdout.splitlines() if line.split(" ")[0] in ("loss", "val_loss", "evaluate", "predict")]
    got = [line for line in out["val"][1].stdout.splitlines() if line.split(" ")[0] in ("loss", "val_loss", "evaluate", "predict")]
    assert len(want) == 4 and got == want


@pytest.mark.slow
def test_a_fit_replay_re_runs_quiet_and_is_faithful_across_an_epoch_and_its_validation(tmp_path):
    """--replay-from on a graph-mode fit (runners.replay_tf): steps 4-5 (after epoch 1 and its
    validation) recorded with full detail, numbered as the original, agreeing with its sentinels."""
    from reprobisect.workflows.replay import verify_replay

    a, b = tmp_path / "a", tmp_path / "b"
    _ok(subprocess.run([PYTHON, "-m", "reprobisect.runners.launch", "--trace", str(a), "--steps", "7", "--detail",
                        "sentinel", "--state-every", "2", "--", str(CORPUS / "keras_fit.py"), "--steps", "4"],
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=_env()))
    _ok(subprocess.run([PYTHON, "-m", "reprobisect.runners.launch", "--trace", str(b), "--steps", "2", "--replay-from",
                        str(a), "--replay-step", "4", "--", str(CORPUS / "keras_fit.py"), "--steps", "4"],
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=_env()))
    orig, rep = read_trace(a), read_trace(b)
    assert [s.step for s in rep.steps] == [4, 5]
    assert rep.manifest.outcome["status"] == "ok" and "re-running" in rep.manifest.outcome["detail"]
    assert {r.kind for r in rep.steps[0].records} >= {"batch", "input", "output", "loss", "grad", "param", "optim_state"}
    assert verify_replay(rep, orig) == (None, 2)
    assert rep.steps[0].batch_ids == orig.steps[4].batch_ids
    assert rep.steps[0].scalars["eval"] == orig.steps[4].scalars["eval"]  # epoch 1's validation, as in the run
