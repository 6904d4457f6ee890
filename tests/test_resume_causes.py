"""``bisect resume`` names the first cause in the run's own time, from evidence (issue 36, item 2):
a scheduler not saved, a scheduler saved one step late, a step counter that skips a batch (data
indexed by hand, no DataLoader: the model's inputs are the evidence), and a Keras checkpoint of
the weights only (its interrupted run saves after the last step, as a preemption would). When the
records cannot tell a step counter from a scheduler, the answer is a question with the check.

Real torch (and Keras) on CPU, tiny scripts in tmp_path, the real library: the uninterrupted and
interrupted runs of each script are recorded once (``record_reference``) and judged against
several resumes (``judge_resumed``); the last tests are the pure rules on hand-made traces."""

from __future__ import annotations

import importlib.util
import tempfile
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.executors import executor_for
from reprobisect.trace.format import Manifest, Record, Step
from reprobisect.trace.reader import Trace
from reprobisect.workflows.resume import diagnose, judge_resumed, record_reference

_HEAD = """
import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--resume", default=None)
p.add_argument("--skip", action="store_true")
p.add_argument("--catch-up", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
xs, ys = torch.randn(48, 4), torch.randn(48, 1)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
def train(step):
    i = (step * 6) % 48  # the data indexed by the step counter: no DataLoader, no batch IDs
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(xs[i:i + 6]), ys[i:i + 6]).backward()
    opt.step()
"""

SCHED_NOT_SAVED = _HEAD + """
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # counts periods: a fresh one is off
step = 0
if a.resume:
    ck = torch.load(a.resume)
    model.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"]); step = ck["step"]
while step < 20:
    train(step)
    sched.step()
    step += 1
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, "ckpt.pt")  # no scheduler
"""

SCHED_SAVED_LATE = _HEAD + """
sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.6)
step = 0
if a.resume:
    ck = torch.load(a.resume)
    model.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"]); sched.load_state_dict(ck["sched"])
    step = ck["step"] + (1 if a.skip else 0)  # --skip: "continue after the saved step", one too far
    if a.catch_up:
        sched.step()  # the step the late save missed: a correct continuation
while step < 20:
    train(step)
    step += 1
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step},
               "ckpt.pt")
    sched.step()  # after the save: the checkpoint's scheduler is one step behind
"""

KERAS_WEIGHTS_ONLY = """
import argparse, json, os
import keras
import numpy as np
p = argparse.ArgumentParser()
p.add_argument("--resume", default=None)
a = p.parse_args()
keras.utils.set_random_seed(3)
xs = np.random.default_rng(3).normal(size=(30, 3)).astype("float32")
ys = xs.sum(1, keepdims=True).astype("float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
step = 0
if a.resume:
    model.load_weights(a.resume)  # the weights only: a new Adam
    step = json.load(open("step.json"))["step"]
while step < 20:
    model.train_on_batch(xs[(step * 5) % 30:(step * 5) % 30 + 5], ys[(step * 5) % 30:(step * 5) % 30 + 5])
    step += 1
    model.save_weights("w.weights.h5")  # after the step: the preemption comes after it
    json.dump({"step": step}, open("step.json", "w"))
"""


def _opts(steps: int) -> ProbeOptions:
    return ProbeOptions(steps=steps, quiet=True, env={"OMP_NUM_THREADS": "1"})


def _judge(tmp: Path, text: str, resumes: dict[str, list[str]], *, steps: int = 5, at: int = 2) -> dict:
    """Record ``text``'s uninterrupted and interrupted runs once; judge each resume against them."""
    work = tmp / "work"
    work.mkdir()
    (work / "train.py").write_text(textwrap.dedent(text))
    argv, opts = ["python", "train.py"], _opts(steps)
    with executor_for(opts) as ex, tempfile.TemporaryDirectory(prefix="resume-causes-") as scratch:
        ref = record_reference(argv, at=at, options=opts, executor=ex, cwd=work, scratch=scratch)
        assert not ref.reason, ref.reason
        return {k: judge_resumed(ref, argv, args, options=opts, executor=ex, cwd=work) for k, args in resumes.items()}


@pytest.fixture(scope="module")
def late(tmp_path_factory) -> dict:
    return _judge(tmp_path_factory.mktemp("late"), SCHED_SAVED_LATE,
                  {"late": ["--resume", "ckpt.pt"], "skip": ["--resume", "ckpt.pt", "--skip"],
                   "ok": ["--resume", "ckpt.pt", "--catch-up"]})


@pytest.mark.slow
def test_a_scheduler_saved_before_it_stepped_is_named_one_step_late_not_a_step_counter(late):
    f = late["late"].finding
    assert f is not None and f.component == "learning rate / scheduler" and f.step == 2, f
    assert "the uninterrupted run's learning rate at step 1: the schedule is one step behind" in f.what
    assert "model inputs are the uninterrupted run's at step 2" in f.what
    assert "saved before the scheduler stepped" in f.why and "one step late" in f.why


@pytest.mark.slow
def test_a_step_counter_one_too_far_is_named_a_skipped_batch_from_the_model_inputs(late):
    f = late["skip"].finding
    assert f is not None and f.component == "step counter" and f.step == 2, f
    assert "model inputs are the uninterrupted run's one step later" in f.what
    assert "skipped the batch of step 2" in f.what and "off by +1" in f.why


@pytest.mark.slow
def test_a_correct_continuation_of_hand_indexed_data_is_bitwise(late):
    assert late["ok"].verdict == "bitwise", late["ok"].finding


@pytest.mark.slow
def test_a_scheduler_missing_from_the_checkpoint_is_named_not_saved(tmp_path):
    r = _judge(tmp_path, SCHED_NOT_SAVED, {"resume": ["--resume", "ckpt.pt"]}, steps=6, at=3)["resume"]
    f = r.finding
    assert f is not None and f.component == "learning rate / scheduler" and f.step == 4, f
    assert "the uninterrupted run's learning rate at step 3" in f.what
    assert "no file the interrupted run saved after its last step (ckpt.pt) holds a scheduler's state" in f.what
    assert f.why.startswith("the LR scheduler was not saved") and "initial_lr" in f.why


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs Keras")
def test_a_keras_weights_only_checkpoint_is_named_the_optimizer_state(tmp_path):
    """The interrupted Keras run saves after its last step (the stop waits for the next step):
    the resume starts from the right weights, and the fresh Adam is what differs first."""
    r = _judge(tmp_path, KERAS_WEIGHTS_ONLY, {"resume": ["--resume", "w.weights.h5"]}, steps=4)["resume"]
    f = r.finding
    assert f is not None and f.component == "optimizer state" and f.step == 2, (f, r.reason)
    assert "iteration" in f.what and "Keras" in f.why


# -- the rules on hand-made traces: no process -------------------------------------------------------


def _rec(kind: str, name: str, fp: str) -> Record:
    return Record(name=name, kind=kind, dtype="float32", shape=(2,), fingerprint=fp)


def _trace(steps: list[Step]) -> Trace:
    return Trace(path=Path("t"), manifest=Manifest(status="complete", command=[], environment={},
                                                   policy={"detail": "full"}), steps=steps)


def _step(k: int, lr: float, w: str, *, init: str | None = None, data: str | None = None) -> Step:
    recs = ((_rec("init", "w", init),) if init else ()) + ((_rec("input", "input", data),) if data else ())
    return Step(step=k, records=recs + (_rec("loss", "loss", f"l{w}"), _rec("param", "w", w)), batch_ids=None,
                scalars={"lr": [lr]})


def test_a_learning_rate_one_step_behind_with_no_data_recorded_is_a_question_not_a_step_counter():
    """Nothing says whether the data moved with the learning rate: a step counter off by -1 and a
    scheduler one step behind look the same, so the answer asks and says what to check."""
    a = _trace([_step(k, 0.5 ** k, f"w{k}", init="w-init" if k == 0 else None) for k in range(6)])
    c = _trace([_step(j, 0.5 ** (2 + j), f"x{j}", init="w2" if j == 0 else None) for j in range(3)])
    f = diagnose(a, c, 3)
    assert f.component == "learning rate / scheduler" and f.step == 3, f
    assert "one step behind" in f.what and "nothing recorded tells which" in f.why and "?" in f.why


def test_model_inputs_several_steps_ahead_are_named_skipped_data_not_rng():
    a = _trace([_step(k, 1.0, f"w{k}", init="w-init" if k == 0 else None, data=f"d{k}") for k in range(8)])
    c = _trace([_step(0, 1.0, "x0", init="w2", data="d5"), _step(1, 1.0, "x1", data="d6")])
    f = diagnose(a, c, 3)
    assert f.component == "data order" and "input at step 5" in f.what and "skipping 2 step(s)' batches" in f.what, f


def test_batch_ids_several_steps_ahead_say_the_data_went_ahead():
    """An epoch counter saved already incremented: the resumed run's batches are a later step's."""
    a = _trace([replace(_step(k, 1.0, f"w{k}", init="w-init" if k == 0 else None), batch_ids=[2 * k, 2 * k + 1])
                for k in range(8)])
    c = _trace([replace(_step(0, 1.0, "x0", init="w2"), batch_ids=[12, 13]),
                replace(_step(1, 1.0, "x1"), batch_ids=[14, 15])])
    f = diagnose(a, c, 3)
    assert f.component == "data order" and "step 6: the data went ahead, skipping 3 step(s)' batches" in f.what, f
