"""Complete TensorFlow/Keras state capture and bitwise restore (issue 14 item 5)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from reprobisect.errors import TraceError, UsageError  # noqa: E402
from reprobisect.runners import tf_state  # noqa: E402
from reprobisect.trace import TraceWriter, shards  # noqa: E402

PY = sys.executable

TRAIN = textwrap.dedent(
    '''
    import hashlib, json, random, sys
    import numpy as np
    import tensorflow as tf
    import keras
    from reprobisect.runners import tf_state
    from reprobisect.trace import TraceWriter

    mode, trace, capture_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    STEPS = 6
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    def digest(vs):
        h = hashlib.sha256()
        for v in vs:
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()[:16]

    def build(seed):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dropout(0.3), keras.layers.BatchNormalization(), keras.layers.Dense(1)])
        return model, keras.optimizers.Adam(1e-2)

    rs = np.random.RandomState(123)
    X, Y = rs.rand(24, 8).astype("float32"), rs.rand(24, 1).astype("float32")
    seed = 0 if mode == "full" else 99  # a resumed process builds with ANOTHER seed: only restore can fix it
    skip = sys.argv[4].split(",") if len(sys.argv) > 4 else []
    out = {"loop": {}, "fit": {}}

    # -- a tf.GradientTape loop (eager) over a shuffled tf.data pipeline; every RNG source used
    model, opt = build(seed)
    model(X[:1])
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(24).batch(4).repeat()
    it = iter(ds)
    gen = tf.random.get_global_generator()
    writer = TraceWriter(trace + ".loop", command=sys.argv) if mode == "full" else None
    step = 0
    if mode == "resume":
        out["fresh"] = digest(model.variables)
        out["loop"]["restored"] = tf_state.restore_state(
            trace + ".loop", step=capture_at, model=model, optimizer=opt, datasets=[] if "data" in skip else [it])
        step = capture_at
    while step < STEPS:
        x, y = next(it)
        step += 1
        noise = (random.random() * float(np.random.rand()) * float(tf.random.uniform(())) * float(gen.normal(()))
                 * float(keras.random.normal(())))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2) + 1e-3 * noise
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        out["loop"][step] = [digest(model.variables + opt.variables), float(loss), x.numpy()[:, 0].tolist()]
        if writer is not None and step == capture_at:
            out["loop"]["captured"] = tf_state.capture_state(writer, step, model=model, optimizer=opt, datasets=[it])
    if writer is not None:
        writer.close()

    # -- model.fit (graph mode), captured from a callback, resumed at the epoch boundary ------
    model, opt = build(seed)
    model.compile(opt, "mse")

    class Rec(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            k = int(opt.iterations.numpy())
            out["fit"][k] = [digest(model.variables + opt.variables), float(logs["loss"])]
            if mode == "full" and k == capture_at:
                w = TraceWriter(trace + ".fit", command=sys.argv)
                out["fit"]["captured"] = tf_state.capture_state(
                    w, k, model=model, optimizer=opt, position={"steps_per_epoch": 3, "shuffle": False})
                w.close()

    if mode == "resume":
        model(X[:1])
        out["fit"]["restored"] = tf_state.restore_state(trace + ".fit", step=capture_at, model=model, optimizer=opt)
        model.fit(X[:12], Y[:12], batch_size=4, epochs=2, initial_epoch=1, shuffle=False, verbose=0, callbacks=[Rec()])
    else:
        model.fit(X[:12], Y[:12], batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[Rec()])
    print("RESULT " + json.dumps(out))
    '''
)


def _run(script: Path, *args) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    r = subprocess.run([PY, str(script), *map(str, args)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    """Every full-then-resumed pair of fresh processes this module checks, two pairs side by side (a
    TF process spends most of its life importing TensorFlow on one core): ``train`` (TRAIN, captured
    at step 3) and the recorder's own state steps of a fit in ``graph`` and ``eager`` mode
    (RECORDED_FIT). Each: (full, resumed, trace)."""
    tmp = tmp_path_factory.mktemp("tfstate")
    (tmp / "train.py").write_text(TRAIN)
    (tmp / "fit.py").write_text(RECORDED_FIT)

    def chain(name: str) -> tuple[dict, dict, Path]:
        if name == "train":
            trace = str(tmp / "run")
            return _run(tmp / "train.py", "full", trace, 3), _run(tmp / "train.py", "resume", trace, 3), Path(trace)
        trace = tmp / f"{name}.trace"
        return _run(tmp / "fit.py", "full", trace, name), _run(tmp / "fit.py", "resume", trace, name), trace

    names = ["train"] + (["graph", "eager"] if importlib.util.find_spec("reprobisect.runners.tensorflow") else [])
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(chain, names)))


@pytest.fixture(scope="module")
def runs(chains):
    return chains["train"]


@pytest.mark.slow
def test_gradient_tape_loop_resumes_bitwise_in_a_fresh_process(runs):
    full, resumed, trace = runs
    got = resumed["loop"]
    assert got["restored"]["matched_by"] == {"model": "path", "optimizer": "path"}
    assert {"python", "numpy", "tf", "tf.global_generator", "keras"} <= set(got["restored"]["rng"])
    assert got["restored"]["position"]["exact"] is True and got["restored"]["position"]["iterations"] == 3
    for k in ("4", "5", "6"):
        assert got[k][2] == full["loop"][k][2], f"step {k}: a different batch"
        assert got[k][1] == full["loop"][k][1], f"step {k}: a different loss"
        assert got[k][0] == full["loop"][k][0], f"step {k}: variables or optimizer state differ"
    assert "3" not in got  # and the resumed process did not re-run the captured steps
    assert resumed["fresh"] != full["loop"]["3"][0]  # it was built differently: restore did the work
    files = sorted(p.name for p in (trace.parent / "run.loop" / "state" / "step-3").iterdir())
    assert files == [f"{n}.{e}" for n in ("data", "model", "optimizer", "rng") for e in ("json", "safetensors")]


@pytest.mark.slow
def test_fit_resumes_bitwise_at_the_epoch_boundary(runs):
    full, resumed, _ = runs
    got = resumed["fit"]
    pos = got["restored"]["position"]
    assert (pos["epoch"], pos["step_in_epoch"], pos["iterations"], pos["exact"]) == (1, 0, 3, True)
    for k in ("4", "5", "6"):
        assert got[k] == full["fit"][k], f"fit step {k} differs after restore"


# -- in-process: layout, RNG, matching and errors --------------------------------------


def _model(seed: int = 0, width: int = 4):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(width), keras.layers.Dropout(0.5),
                          keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(1e-2)
    m.compile(opt, "mse")
    m.train_on_batch(np.ones((2, 3), "float32"), np.ones((2, 1), "float32"))
    return m, opt


@pytest.fixture(scope="module")
def trained():
    return _model(0)


def test_state_is_safetensors_and_json_keyed_by_variable_path(tmp_path, trained):
    m, opt = trained
    summary = tf_state.capture_state(tmp_path, 1, model=m, optimizer=opt)
    folder = tmp_path / "state" / "step-1"
    assert summary["groups"] == ["model", "optimizer"]
    keys = shards.keys(folder / "model.safetensors")
    paths = [v.path for v in m.variables]
    assert keys == paths  # trainable, moving statistics and the Dropout's seed state, in order
    assert any(p.endswith("moving_mean") for p in keys) and any("seed_generator_state" in p for p in keys)
    meta = json.loads((folder / "model.json").read_text())
    assert meta["framework"] == "tensorflow" and [e["path"] for e in meta["variables"]] == paths
    assert "adam/iteration" in shards.keys(folder / "optimizer.safetensors")
    for p in folder.iterdir():  # only JSON and safetensors: nothing a loader would unpickle
        assert p.suffix in (".json", ".safetensors")
    got = shards.load(folder / "model.safetensors")
    for v in m.variables:
        assert np.array_equal(got[v.path], v.numpy())


def test_restore_into_a_model_built_in_the_same_process_matches_by_position(tmp_path, trained):
    m, opt = trained
    with TraceWriter(tmp_path / "t") as w:
        tf_state.capture_state(w, 2, model=m, optimizer=opt)
    m2, opt2 = _model(5)  # auto-named dense_2 ...: other paths, same structure
    assert [v.path for v in m2.variables] != [v.path for v in m.variables]
    res = tf_state.restore_state(tmp_path / "t", step=2, model=m2, optimizer=opt2)
    assert res["matched_by"] == {"model": "position", "optimizer": "position"}
    for a, b in zip(m.variables + opt.variables, m2.variables + opt2.variables):
        assert np.array_equal(a.numpy(), b.numpy())


def test_rng_sources_round_trip_in_process():
    import random

    tf.random.set_seed(3)
    gen = tf.random.get_global_generator()
    meta, arrays = tf_state.capture_rng()
    draw = lambda: (random.random(), float(np.random.rand()), float(tf.random.uniform(())),  # noqa: E731
                    float(gen.normal(())), float(keras.random.normal(())))
    a = draw()
    tf_state.restore_rng(meta, arrays)
    assert draw() == a


def test_a_different_model_is_refused_and_left_untouched(tmp_path, trained):
    m, opt = trained
    tf_state.capture_state(tmp_path, 1, model=m, optimizer=opt)
    other, _ = _model(1, width=5)
    before = [v.numpy().copy() for v in other.variables]
    with pytest.raises(TraceError, match=r"captured as float32\[3, 4\].*build the same model"):
        tf_state.restore_state(tmp_path / "state" / "step-1", model=other)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, other.variables))


def test_missing_state_and_uncaptured_objects_are_clear_errors(tmp_path, trained):
    m, opt = trained
    with pytest.raises(TraceError, match="holds no captured state"):
        tf_state.restore_state(tmp_path, step=4, model=m)
    tf_state.capture_state(tmp_path, 4, model=m)
    with pytest.raises(TraceError, match=r"no captured state for optimizer \(captured: model\)"):
        tf_state.restore_state(tmp_path, step=4, model=m, optimizer=opt)
    with pytest.raises(UsageError, match="not a tf.data iterator"):
        tf_state.capture_state(tmp_path, 5, model=m, datasets=[tf.data.Dataset.range(3)])


def test_a_torch_state_folder_is_not_restored_as_tensorflow(tmp_path, trained):
    folder = tmp_path / "state" / "step-0"
    folder.mkdir(parents=True)
    (folder / "rng.json").write_text(json.dumps({"state": {}, "objects": []}))
    with pytest.raises(TraceError, match="another framework"):
        tf_state.restore_state(folder, model=trained[0])


def test_plain_tf_variables_and_a_users_generator_round_trip(tmp_path):
    w = tf.Variable(tf.ones((2, 2)), name="w")
    gen = tf.random.Generator.from_seed(1)
    seeds = keras.random.SeedGenerator(7)
    state = {"w": w, "gen": gen, "seeds": seeds}  # a Generator / SeedGenerator stands for its state
    tf_state.capture_state(tmp_path, 0, variables=state)
    want = (gen.normal((3,)).numpy(), keras.random.normal((3,), seed=seeds).numpy())
    w.assign_add(tf.ones((2, 2)))
    assert sorted(shards.keys(tmp_path / "state" / "step-0" / "variables.safetensors")) == ["gen", "seeds", "w"]
    res = tf_state.restore_state(tmp_path / "state" / "step-0", variables=state)
    assert res["matched_by"] == {"variables": "path"}
    assert np.array_equal(w.numpy(), np.ones((2, 2), "float32"))
    assert np.array_equal(gen.normal((3,)).numpy(), want[0])
    assert np.array_equal(keras.random.normal((3,), seed=seeds).numpy(), want[1])


def test_loss_scale_optimizer_is_restored_into_an_unbuilt_one(tmp_path):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=2.0**4)
    m.compile(opt, "mse")
    for _ in range(2):
        m.train_on_batch(np.ones((2, 3), "float32"), np.zeros((2, 1), "float32"))
    tf_state.capture_state(tmp_path, 1, model=m, optimizer=opt)
    keys = shards.keys(tmp_path / "state" / "step-1" / "optimizer.safetensors")
    assert any("momentum" in k for k in keys) and any("scale" in k for k in keys)
    m2 = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    opt2 = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=2.0**4)
    assert not opt2.built
    tf_state.restore_state(tmp_path / "state" / "step-1", model=m2, optimizer=opt2)
    assert [v.numpy().tolist() for v in opt2.variables] == [v.numpy().tolist() for v in opt.variables]


RECORDED_FIT = textwrap.dedent(
    '''
    import hashlib, json, sys
    import numpy as np, keras
    from reprobisect.runners.tensorflow import RecordPolicy, TFRecorder
    from reprobisect.runners import tf_state
    from reprobisect.runners.environment import collect_environment
    from reprobisect.trace import TraceWriter

    mode, trace, eager = sys.argv[1], sys.argv[2], sys.argv[3] == "eager"
    def digest(vs):
        h = hashlib.sha256()
        for v in vs:
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()[:16]
    keras.utils.set_random_seed(0 if mode == "full" else 9)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.3), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(1e-2)
    model.compile(opt, "mse", run_eagerly=eager)
    rs = np.random.RandomState(1)
    X, Y = rs.rand(12, 8).astype("float32"), rs.rand(12, 1).astype("float32")
    out = {}
    class Rec(keras.callbacks.Callback):
        def on_train_batch_end(self, b, logs=None):
            out[int(opt.iterations.numpy())] = digest(model.variables + opt.variables)
    if mode == "full":
        w = TraceWriter(trace, command=sys.argv)
        rec = TFRecorder(w, RecordPolicy(steps=6, state_steps=(2,))).install()
        model.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[Rec()])
        out["execution"] = collect_environment()["tensorflow"].get("execution")
        rec.remove()
        w.close()
    else:
        model(X[:1])
        tf_state.restore_state(trace, step=2, model=model, optimizer=opt)
        model.fit(X, Y, batch_size=4, epochs=2, initial_epoch=1, shuffle=False, verbose=0, callbacks=[Rec()])
    print("RESULT " + json.dumps(out))
    '''
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_the_recorders_state_steps_restore_bitwise(chains, mode):
    """The TF recorder calls capture_state at its policy's state steps (state/step-K after the
    0-based step K, i.e. after K + 1 updates); a fresh process resumes from it bitwise."""
    pytest.importorskip("reprobisect.runners.tensorflow")
    full, resumed, trace = chains[mode]
    assert (trace / "state" / "step-2" / "model.safetensors").is_file()
    assert full["execution"]["mode"] == mode and full["execution"]["run_eagerly"] is (mode == "eager")
    assert [resumed[k] for k in ("4", "5", "6")] == [full[k] for k in ("4", "5", "6")]


def test_capture_draws_nothing_and_leaves_the_data_order_alone(tmp_path, trained):
    """Observers observe: a capture (iterator serialization included) changes no RNG and no batch."""
    import random

    def pipeline():
        return iter(tf.data.Dataset.range(40).shuffle(40, seed=5).batch(4))

    a, b = pipeline(), pipeline()
    for _ in range(2):
        assert np.array_equal(next(a).numpy(), next(b).numpy())
    tf.random.set_seed(11)
    before = (random.getstate(), np.random.get_state(legacy=True)[1].copy())
    tf_state.capture_state(tmp_path, 1, model=trained[0], optimizer=trained[1], datasets=[a])
    assert random.getstate() == before[0] and np.array_equal(np.random.get_state(legacy=True)[1], before[1])
    op_seed_after_capture = float(tf.random.uniform(()))
    tf.random.set_seed(11)
    assert float(tf.random.uniform(())) == op_seed_after_capture
    for _ in range(5):
        assert np.array_equal(next(a).numpy(), next(b).numpy())


@pytest.mark.slow
def test_bench_recorder_tf_smoke_run_prints_ratios_and_says_when_the_recorder_is_missing():
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([PY, str(root / "scripts" / "bench" / "bench_recorder_tf.py"), "--quick", "--modes", "graph", "--json"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    out = json.loads(r.stdout)
    g = out["graph"]
    assert g["median_step_s"]["plain"] > 0 and g["check_numerics"] > 0
    try:
        import reprobisect.runners.tensorflow  # noqa: F401
    except ImportError:
        assert r.returncode == 2 and g["record"] is None and "not in this checkout" in out["recorder_missing"]
    else:
        assert r.returncode == 0 and g["record"] > 0 and all(n > 0 for n in g["recorded_steps_per_fit"])


def test_a_state_changed_after_the_trace_was_sealed_is_refused(tmp_path, trained):
    m, opt = trained
    with TraceWriter(tmp_path / "t") as w:
        tf_state.capture_state(w, 0, model=m, optimizer=opt)
    p = tmp_path / "t" / "state" / "step-0" / "model.safetensors"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 1  # one flipped bit in the last weight
    p.write_bytes(bytes(raw))
    with pytest.raises(TraceError, match="modified after it was sealed"):
        tf_state.restore_state(tmp_path / "t", step=0, model=m)
