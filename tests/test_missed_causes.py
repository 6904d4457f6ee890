"""Causes the answers used to miss (issue 36, items 4 and 5): unseeded global RNGs and the initialisation.

``bisect repro`` tested only the seeds it could hold (string hashing, the loader's generator,
threads, deterministic algorithms), so noise drawn from NumPy's global RNG, or a Keras layer
built without ``seed=``, ended as "not this" everywhere. Now NumPy's, Python's and (for
TensorFlow) the global seed are held too (``reprobisect.runners.hold``), and the TF recorder
lists the random layers built without a seed, which names them when graph mode records no
layer output. And a first divergence in an ``init`` record says in words that the initial
parameters differ, in ``compare`` and in ``runs``' answer alike. The cheap tests write traces
through the writer API; the end-to-end ones run real torch / Keras on CPU (slow).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from reprobisect.core.compare import compare_paths
from reprobisect.core.hints import HOLD_VAR, cause_candidates
from reprobisect.core.options import ProbeOptions
from reprobisect.render import render_comparison, render_repro, repro_json
from reprobisect.render.runs import divergence_text
from reprobisect.trace import TraceWriter, read_trace, record_array
from reprobisect.workflows.repro import run_repro


def _trace(path: Path, *, ids=(0, 1), value=0.0, init=0) -> Path:
    """One step of a torch-like run: an ``init`` record, the batch's ids and data, a loss."""
    env = {"device": "cpu", "env_vars": {}, "determinism": {}, "torch": {"num_threads": 2, "devices": []}}
    w = np.random.default_rng(init).standard_normal((2, 2)).astype(np.float32)
    x = np.array([1.0, 2.0], dtype=np.float32) + np.float32(value)
    with TraceWriter(path, command=["python", "train.py"], environment=env, seed=0) as wr:
        wr.begin_step(0)
        for name, kind, a in (("0.weight", "init", w), ("data[0]", "batch", x), ("loss", "loss", np.float32(1 + value))):
            wr.record(record_array(name, kind, a), a)
        wr.end_step({"loss": 1.0}, batch_ids=list(ids))
    return path


def _names(a: Path, b: Path) -> list[str]:
    return [c.name for c in cause_candidates(read_trace(a), read_trace(b), compare_paths(a, b), same_command=True)]


# --------------------------------------------------------------------------- cheap: candidates, holds, wording


def test_same_ids_other_values_puts_the_global_rngs_before_the_loader(tmp_path):
    a, b = _trace(tmp_path / "a"), _trace(tmp_path / "b", value=0.01)
    # the same ids with torch seeded: neither the loader's shuffle nor its workers' seeds differ (issue 36)
    assert _names(a, b) == ["hashseed", "numpy_seed", "random_seed"]
    moved = _trace(tmp_path / "c", ids=(1, 0), value=0.01)  # another order: the loader first, the RNGs after
    assert _names(a, moved) == ["hashseed", "loader_seed", "numpy_seed", "random_seed"]


def test_the_hold_switch_seeds_numpy_and_random_at_the_framework_import():
    code = textwrap.dedent("""
        import random, numpy as np, torch
        from reprobisect.runners import hold
        hold.activate_torch(None)
        print(np.random.randint(1 << 30), random.randint(0, 1 << 30))
    """)
    env = {**os.environ, HOLD_VAR: "numpy_seed,random_seed"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    np.random.seed(0)
    import random
    random.seed(0)
    assert p.stdout.split() == [str(np.random.randint(1 << 30)), str(random.randint(0, 1 << 30))]


def test_an_init_first_divergence_says_the_initial_parameters_differ(tmp_path):
    a, b = _trace(tmp_path / "a"), _trace(tmp_path / "b", init=1, ids=(1, 0))
    comp = compare_paths(a, b)
    said = "the initial parameters differ (the initialisation, before the first step): 0.weight"
    assert said in render_comparison(comp)
    runs_text = divergence_text(comp)  # what bisect runs prints after "first divergence against the last good"
    assert said in runs_text and "then the data order differs too" in runs_text
    assert runs_text.index(said) < runs_text.index("then the data order")
    other = compare_paths(a, _trace(tmp_path / "c", value=0.01))  # a batch first: no such words
    assert "initial parameters" not in render_comparison(other) + divergence_text(other)


# --------------------------------------------------------------------------- end to end: real torch / Keras

_NUMPY_NOISE = """
import numpy as np, torch
torch.manual_seed(0)
class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.tensor([i / 16.0, 1.0]) + torch.from_numpy(np.random.standard_normal(2).astype('float32'))
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(Noisy(), batch_size=4):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
"""

_KERAS_NOISE = """
import keras, numpy as np
xs = np.linspace(-1, 1, 32, dtype='float32').reshape(8, 4)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, kernel_initializer=keras.initializers.Ones()),
                          keras.layers.GaussianNoise(0.5), keras.layers.Dense(1, kernel_initializer=keras.initializers.Ones())])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss='mse')
for _ in range(3):
    model.train_on_batch(xs, xs.sum(1, keepdims=True))
"""


def _repro(folder: Path, name: str, code: str, monkeypatch) -> tuple[str, dict, Path]:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.chdir(folder)
    (folder / name).write_text(code)
    out = folder / "out"
    r = run_repro([sys.executable, name], ProbeOptions(steps=1, jobs=2, out=out, quiet=True), runs=2, confirm=True)
    assert not r
    return render_repro(r), repro_json(r), out


@pytest.mark.slow
def test_numpy_noise_in_the_dataset_is_confirmed_by_seeding_numpy(tmp_path, monkeypatch):
    text, data, _ = _repro(tmp_path, "noise.py", _NUMPY_NOISE, monkeypatch)
    assert "confirmed: with NumPy's global RNG seeded (numpy.random.seed(0) at start-up) the runs agree" in text
    assert [(c["candidate"], c["agreed"]) for c in data["causes"]] == [("hashseed", False), ("numpy_seed", True)]
    assert "PYTHONHASHSEED was unset, so" not in text


@pytest.mark.slow
def test_an_unseeded_keras_noise_layer_is_named_and_confirmed_by_a_global_seed(tmp_path, monkeypatch):
    text, data, out = _repro(tmp_path, "keras_noise.py", _KERAS_NOISE, monkeypatch)
    run0 = next(p for p in sorted(out.iterdir()) if (p / "manifest.json").exists())
    assert read_trace(run0).manifest.extra["tensorflow"]["unseeded_random_layers"] == ["gaussian_noise (GaussianNoise)"]
    first = data["causes"][0]  # the recorded unseeded layer puts the global seed first, named in its question
    assert first["candidate"] == "global_seed" and "gaussian_noise (GaussianNoise) got no seed=" in first["question"]
    assert first["agreed"] is not None
    assert "initial parameters differ" not in text
