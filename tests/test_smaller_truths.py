"""Smaller truths (issue 36 item 8): an evaluation whose RNG draw shows one step later, and
optimizer hyperparameters recorded per param group and named like the learning rate.

- nanoGPT's loop draws the next training batch before it evaluates (at the top of the next
  iteration), so an evaluation that draws from the global RNG moves the training data of
  the step AFTER the one it ran in: the evaluation hint names it; an evaluation difference
  far from the divergence (with the steps between agreeing) is not named.
- ``scalars.hyperparams`` holds each param group's betas, eps, weight decay, momentum, ...;
  a difference at or before a ``param`` divergence whose gradients agreed is the likely
  explanation (compare text and JSON); traces without them (older ones) still compare.

Real torch runs through the launcher (one set of captures for the module, two at a time);
the hint's edges on traces written through the writer API (no framework, fast).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from reprobisect.cli import main as cli_main
from reprobisect.core.compare import compare_paths, compare_traces
from reprobisect.render import render_comparison
from reprobisect.trace import TraceWriter, read_trace, record_array

PY = sys.executable

# A nanoGPT-shaped toy: a char-level bigram model, batches drawn with torch.randint from the
# global generator, the next batch fetched right after the forward, evaluation at the top of
# the iteration (its own batches from the same generator, or a fixed slice), AdamW with a
# decay group (matrices) and a no-decay group (biases), as nanoGPT configures it.
TOY = """
import argparse
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--eval_interval", type=int, default=0)      # 0: never evaluate
p.add_argument("--eval_random", type=int, default=1)        # evaluation batches from the global RNG
p.add_argument("--augment_from", type=int, default=-1)      # from this iteration on, a random token flip
p.add_argument("--weight_decay", type=float, default=0.1)
args = p.parse_args()

torch.manual_seed(1337)
corpus = torch.randint(0, 12, (600,))
train_data, val_data = corpus[:500], corpus[500:]
block, batch = 6, 4

class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(12, 16)
        self.head = nn.Linear(16, 12)

    def forward(self, idx):
        return self.head(self.tok(idx))

def get_batch(split, it=0):
    data = train_data if split == "train" else val_data
    if split == "val" and not args.eval_random:
        ix = torch.arange(batch) * block
    else:
        ix = torch.randint(len(data) - block - 1, (batch,))
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + block + 1] for i in ix])
    if split == "train" and 0 <= args.augment_from <= it:
        x = torch.where(torch.rand(x.shape) < 0.1, torch.zeros_like(x), x)
    return x, y

model = Bigram()
decay = [q for q in model.parameters() if q.dim() >= 2]
no_decay = [q for q in model.parameters() if q.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                         {"params": no_decay, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.95))

@torch.no_grad()
def estimate_loss():
    model.eval()
    for _ in range(2):
        x, y = get_batch("val")
        nn.functional.cross_entropy(model(x).view(-1, 12), y.view(-1))
    model.train()

X, Y = get_batch("train")
for it in range(6):
    if args.eval_interval and it % args.eval_interval == 0:
        estimate_loss()
    logits = model(X)
    loss = nn.functional.cross_entropy(logits.view(-1, 12), Y.view(-1))
    X, Y = get_batch("train", it + 1)  # fetched ahead, before the backward (and the next evaluation)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""

RUNS = {
    # evaluating every 2 vs every 3 iterations: step 2's evaluation moves step 3's batch
    "eval2": ["--eval_interval", "2"],
    "eval3": ["--eval_interval", "3"],
    # a deterministic evaluation once (no RNG) vs none, and random augmentation from step 4:
    # evaluation differs only far before the divergence
    "fixed_eval": ["--eval_interval", "100", "--eval_random", "0"],
    "augment": ["--augment_from", "4", "--eval_random", "0"],
    # nanoGPT's weight decay switched off (evaluation as in eval2)
    "no_decay": ["--eval_interval", "2", "--weight_decay", "0.0"],
}


def _capture(tmp: Path, name: str, args: list[str]) -> Path:
    trace = tmp / f"{name}.trace"
    r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "6", "--",
                        str(tmp / "toy.py"), *args], cwd=tmp, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return trace


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("smaller-truths")
    (tmp / "toy.py").write_text(textwrap.dedent(TOY))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futs = {name: pool.submit(_capture, tmp, name, args) for name, args in RUNS.items()}
        return {name: f.result() for name, f in futs.items()}


def _hints(c) -> str:
    return "\n".join(ln for ln in render_comparison(c).splitlines() if ln.startswith("hint:"))


# -- 1. evaluation one step late ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.torch
def test_evaluation_whose_draw_shows_one_step_later_is_named(runs):
    """eval_interval 2 vs 3 in a nanoGPT loop: the runs agree through step 2 (the batch of
    step 2 was fetched before step 2's evaluation), step 3's batch is the first difference,
    and the hint names step 2's evaluation, one step before it."""
    c = compare_traces(read_trace(runs["eval2"]), read_trace(runs["eval3"]))
    assert not c and c.first.step == 3 and c.first.kind in ("batch", "input"), str(c)
    hints = _hints(c)
    assert "in step 2's evaluation: A evaluated there, B did not" in hints, render_comparison(c)
    assert "one step after that evaluation" in hints and "own torch.Generator" in hints, hints
    assert "PYTHONHASHSEED" not in hints, hints


@pytest.mark.slow
@pytest.mark.torch
def test_evaluation_far_from_the_divergence_is_not_named(runs):
    """A deterministic evaluation at step 0 in one run only, and a divergence at step 4 from
    an augmentation: the steps between agreed, so the evaluation did not move the RNG; the
    answer must not blame evaluation."""
    c = compare_traces(read_trace(runs["fixed_eval"]), read_trace(runs["augment"]))
    assert not c and c.first.step >= 3, str(c)
    assert "evaluation" not in _hints(c), render_comparison(c)


# -- 2. optimizer hyperparameters per param group ------------------------------------------


@pytest.mark.slow
@pytest.mark.torch
def test_hyperparameters_are_recorded_per_param_group(runs):
    s = read_trace(runs["eval2"]).steps[0].scalars
    assert s["hyperparams"] == [
        {"betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.1, "amsgrad": False, "maximize": False,
         **({"decoupled_weight_decay": True} if "decoupled_weight_decay" in s["hyperparams"][0] else {})},
        {"betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.0, "amsgrad": False, "maximize": False,
         **({"decoupled_weight_decay": True} if "decoupled_weight_decay" in s["hyperparams"][1] else {})},
    ]
    assert all(st.scalars["hyperparams"] == s["hyperparams"] for st in read_trace(runs["eval2"]).steps)


@pytest.mark.slow
@pytest.mark.torch
def test_changed_weight_decay_is_the_likely_explanation_in_text_and_json(runs, capsys):
    """nanoGPT's weight decay switched off: the parameters after step 0 differ with the
    gradients agreeing, and the answer names the weight decay of the decay group."""
    want = "the optimizer's weight_decay differs: 0.1 vs 0 (param group 0) at step 0"
    c = compare_paths(runs["eval2"], runs["no_decay"])
    assert not c and c.first.step == 0 and c.first.kind == "param", str(c)
    assert c.explanation == want, c.explanation
    assert f"likely explanation: {want}" in render_comparison(c)
    capsys.readouterr()
    assert cli_main(["compare", str(runs["eval2"]), str(runs["no_decay"]), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["explanation"] == want


@pytest.mark.torch
def test_torch_groups_keep_the_plain_hyperparameters_of_any_optimizer():
    """SGD's momentum, dampening and nesterov; a tensor setting is left out (reading it could wait on the device)."""
    import torch

    from reprobisect.runners.observers.torch_params import _hyperparams

    w = torch.nn.Parameter(torch.zeros(2))
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    assert {k: v for k, v in _hyperparams(sgd.param_groups[0]).items() if k != "maximize"} == {
        "momentum": 0.9, "dampening": 0.0, "nesterov": True, "weight_decay": 0.0001}
    assert _hyperparams({"params": [w], "betas": (torch.tensor(0.9), 0.99), "eps": torch.tensor(1e-8)}) == {}


# -- the hint's edges, on traces written through the writer API (no framework) ------------

ENV = {"device": "cpu", "python": {"argv": ["train.py"]}, "env_vars": {}}


def _writer_trace(path: Path, *, w_after: float, hyper=None, eval_at=(), data_from: int = 99) -> Path:
    """Three steps of a one-weight model: identical forwards and gradients unless the data
    changes from step ``data_from``; the parameter after step 0 is ``w_after``."""
    with TraceWriter(path, command=["python", "train.py"], environment=ENV) as wr:
        for k in range(3):
            wr.begin_step(k)
            x = np.full(4, 1.0 + (k if k < data_from else k + 0.5), np.float32)
            wr.record(record_array("input", "input", x), x)
            g = np.ones(4, np.float32)
            wr.record(record_array("w", "grad", g), g)
            p = np.full(4, w_after + k, np.float32)
            wr.record(record_array("w", "param", p), p)
            scalars = {"loss": 1.0, "lr": [0.1]}
            if hyper is not None:
                scalars["hyperparams"] = hyper
            if k in eval_at:
                scalars["eval"] = [{"phase": "no_grad", "after_step": k - 1 if k else None, "forwards": 2,
                                    "batches": 2, "samples": None, "ids_fingerprint": None}]
            wr.end_step(scalars, batch_ids=[k])
    return path


def test_a_trace_without_hyperparameters_still_compares_and_says_nothing_of_them(tmp_path):
    """Older traces hold no ``hyperparams``: compared with a newer one they read and compare,
    and no hyperparameter is named (absent is not a difference)."""
    old = _writer_trace(tmp_path / "old", w_after=1.0)
    new = _writer_trace(tmp_path / "new", w_after=2.0, hyper=[{"eps": 1e-8, "weight_decay": 0.01}])
    c = compare_paths(old, new)
    assert not c and c.first.kind == "param"
    assert "optimizer" not in (c.explanation or ""), c.explanation


def test_several_hyperparameters_and_the_lr_are_named_together(tmp_path):
    a = _writer_trace(tmp_path / "a", w_after=1.0, hyper=[{"momentum": 0.9, "nesterov": True}])
    b = _writer_trace(tmp_path / "b", w_after=2.0, hyper=[{"momentum": 0.0, "nesterov": False}])
    c = compare_paths(a, b)
    assert c.explanation == ("the optimizer's momentum differs: 0.9 vs 0 (param group 0) at step 0 (and 1 more: "
                             "the optimizer's nesterov differs: True vs False (param group 0))"), c.explanation


def test_evaluation_in_the_same_count_at_other_steps_is_named(tmp_path):
    """Both runs evaluated once, at different steps (before: an IndexError swallowed with every
    hint); the one in the step before the first differing data is named."""
    a = _writer_trace(tmp_path / "a", w_after=1.0, eval_at=(1,), data_from=2)
    b = _writer_trace(tmp_path / "b", w_after=1.0, eval_at=(2,))
    c = compare_paths(a, b)
    assert not c and c.first.step == 2 and c.first.kind == "input", str(c)
    assert "in step 1's evaluation: A evaluated there, B did not" in _hints(c), render_comparison(c)


# -- Keras: the optimizer's settings as one group ----------------------------------------

KERAS_TOY = """
import sys
import numpy as np
import keras

keras.utils.set_random_seed(0)
x = np.random.RandomState(0).randn(48, 4).astype("float32")
y = x.sum(1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-2, weight_decay=float(sys.argv[1])), loss="mse")
model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
"""


@pytest.mark.slow
def test_keras_optimizer_settings_are_recorded_and_named(tmp_path):
    """A graph-mode ``fit`` with AdamW's weight decay 0.004 vs 0: recorded as one group (read
    as each step runs) and named as the likely explanation."""
    pytest.importorskip("tensorflow")
    (tmp_path / "toy.py").write_text(textwrap.dedent(KERAS_TOY))

    def run(name: str, wd: str) -> Path:
        trace = tmp_path / f"{name}.trace"
        r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "2", "--",
                            str(tmp_path / "toy.py"), wd], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": "0", "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert r.returncode == 0, r.stderr[-3000:]
        return trace

    with ThreadPoolExecutor(max_workers=2) as pool:
        a, b = pool.map(lambda nw: run(*nw), [("a", "0.004"), ("b", "0.0")])
    s = read_trace(a).steps[1].scalars
    assert s["hyperparams"] == [{"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07, "weight_decay": 0.004,
                                 "amsgrad": False}], s
    c = compare_paths(a, b)
    assert not c and c.first.kind == "param", str(c)
    assert c.explanation == "the optimizer's weight_decay differs: 0.004 vs 0 (param group 0) at step 0", c.explanation
