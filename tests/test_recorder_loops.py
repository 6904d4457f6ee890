"""What a step is, on the shapes real training scripts have (issue 9).

Evaluation loops (their own DataLoader with workers, drawn inside or outside ``no_grad``,
``inference_mode``; nanoGPT's ``estimate_loss`` with no DataLoader) never enter a training
step: changing only the evaluation changes no record, and the evaluation is summarised in
``scalars["eval"]``. Loops without ``torch.optim`` record one step per update by hand. The
parameters before the first update are recorded (``init``), so an unseeded initialization
is named first, and the script's ``torch.manual_seed`` reaches the manifest. Gradient
accumulation records every micro-batch; a step's forward records are bounded; LBFGS
re-evaluations are counted.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprobisect.core.compare import compare_traces
from reprobisect.trace import read_trace

PY = sys.executable


def record(tmp: Path, name: str, text: str, *opts: str, steps: int = 3, code: int = 0) -> tuple[Path, str]:
    script = tmp / f"{name}.py"
    script.write_text(textwrap.dedent(text))
    trace = tmp / f"{name}.trace"
    cmd = [PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps), *opts, "--", str(script)]
    r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=180)
    assert r.returncode == code, r.stderr[-3000:]
    return trace, r.stderr


def same(a: Path, b: Path) -> None:
    c = compare_traces(read_trace(a), read_trace(b))
    assert c, str(c)


# a training loop with an evaluation loop after every step (minGPT / PyTorch examples)
EVAL_LOOP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
train = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2))
val = DataLoader(data, batch_size={bs}, num_workers={workers})
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def evaluate():
    model.eval()
    {loop}
    model.train()

if __name__ == "__main__":
    for x, y in train:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        evaluate()
"""

LOOPS = {
    # drawn inside no_grad, workers
    "no_grad": "with torch.no_grad():\n        for vx, vy in val:\n            model(vx)",
    # drawn with gradients on, forward under no_grad: attributed lazily
    "draw_outside": "for vx, vy in val:\n        with torch.no_grad():\n            model(vx)",
    # inference tensors (no version counter)
    "inference_mode": "with torch.inference_mode():\n        for vx, vy in val:\n            model(vx)",
    # no no_grad at all: model.eval() of a model that trains in train() mode
    "eval_mode": "for vx, vy in val:\n        model(vx).sum().item()",
}


@pytest.mark.parametrize("style", list(LOOPS))
def test_evaluation_batch_size_changes_no_training_step(tmp_path: Path, style: str) -> None:
    workers = 2 if style == "no_grad" else 0
    a, _ = record(tmp_path, "a", EVAL_LOOP.format(bs=16, workers=workers, loop=LOOPS[style]))
    b, _ = record(tmp_path, "b", EVAL_LOOP.format(bs=32, workers=workers, loop=LOOPS[style]))
    same(a, b)
    t = read_trace(a)
    for s in t.steps:
        assert len(s.batch_ids) == 8, (s.step, s.batch_ids)  # the training batch only
        assert [r.name for r in s.records if r.kind == "input"] == ["input"]
    assert "eval" not in t.steps[0].scalars
    ev = t.steps[1].scalars["eval"]
    assert len(ev) == 1 and ev[0]["after_step"] == 0 and ev[0]["samples"] == 64
    assert ev[0]["batches"] == 4 and ev[0]["forwards"] == 4 and ev[0]["outputs_fingerprint"]
    assert ev[0]["phase"] == {"inference_mode": "inference_mode", "eval_mode": "eval_mode"}.get(style, "no_grad")
    evb = read_trace(b).steps[1].scalars["eval"][0]
    assert evb["batches"] == 2 and evb["ids_fingerprint"] == ev[0]["ids_fingerprint"]


NANOGPT = """
import torch
from torch import nn

torch.manual_seed(0)
data = torch.randn(500, 4)

def get_batch():
    ix = torch.randint(len(data) - 8, (4,))
    return data[ix], data[ix].sum(1, keepdim=True)

model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

@torch.no_grad()
def estimate_loss():
    model.eval()
    g = torch.Generator().manual_seed(123)  # its own stream: training is bitwise unchanged
    losses = torch.zeros({eval_iters})
    for k in range({eval_iters}):
        ix = torch.randint(len(data), (4,), generator=g)
        losses[k] = nn.functional.mse_loss(model(data[ix]), data[ix].sum(1, keepdim=True))
    model.train()
    return losses.mean()

for it in range(10):
    if it % 2 == 0:
        estimate_loss()
    x, y = get_batch()
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
"""


def test_nanogpt_style_estimate_loss_is_evaluation(tmp_path: Path) -> None:
    a, _ = record(tmp_path, "a", NANOGPT.format(eval_iters=3))
    b, _ = record(tmp_path, "b", NANOGPT.format(eval_iters=7))
    same(a, b)
    t = read_trace(a)
    s0 = t.steps[0]
    assert s0.scalars["eval"] == [{**s0.scalars["eval"][0], "phase": "no_grad", "after_step": None, "forwards": 3}]
    assert len([r for r in s0.records if r.kind == "output"]) == 1
    assert "eval" not in t.steps[1].scalars and t.steps[2].scalars["eval"][0]["after_step"] == 1


HAND_SGD = """
import sys
import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
x, y = torch.randn(16, 4), torch.randn(16, 1)
for i in range({iters}):
    model.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    {update}
    with torch.inference_mode():  # a metric after the update
        model(x)
np.save(sys.argv[0] + ".npy", model[2].weight.detach().numpy())
"""

UPDATES = {
    "data_add": "for p in model.parameters():\n        p.data.add_(p.grad, alpha=-0.1)",
    "no_grad_sub": "with torch.no_grad():\n        for p in model.parameters():\n            p -= 0.1 * p.grad",
}


@pytest.mark.parametrize("update", list(UPDATES))
def test_loop_without_optimizer_records_a_step_per_update(tmp_path: Path, update: str) -> None:
    """The word-language-model example's update by hand: one step per update, with the
    gradients backward left and the parameters after the update."""
    import numpy as np

    from reprobisect.trace import fingerprint

    trace, _ = record(tmp_path, "sgd", HAND_SGD.format(iters=2, update=UPDATES[update]), steps=5)
    t = read_trace(trace)
    assert [s.step for s in t.steps] == [0, 1] and t.manifest.outcome["status"] == "ok"
    for s in t.steps:
        kinds = {r.kind for r in s.records}
        assert {"input", "activation", "output", "loss", "grad", "param"} <= kinds, kinds
        assert s.scalars["manual_update"] is True and s.scalars["grad_params"] == 4 and s.scalars["grad_norm"] > 0
        assert len([r for r in s.records if r.kind == "output"]) == 1
    last = {r.name: r for r in t.steps[1].records if r.kind == "param"}
    assert last["2.weight"].fingerprint == fingerprint(np.load(tmp_path / "sgd.py.npy"))
    first = {r.name: r for r in t.steps[0].records}
    assert first["2.weight"].fingerprint != last["2.weight"].fingerprint
    assert "eval" not in t.steps[0].scalars  # the metric after update 0 is in step 1's window
    assert [(e["phase"], e["after_step"], e["forwards"]) for e in t.steps[1].scalars["eval"]] == [("inference_mode", 0, 1)]
    assert [(e["phase"], e["after_step"]) for e in t.manifest.extra["eval_after_last_step"]] == [("inference_mode", 1)]


def test_backward_without_any_update_is_no_steps_early_with_what_to_do(tmp_path: Path) -> None:
    text = HAND_SGD.format(iters=1000, update="pass").replace("np.save(", "print('finished', file=sys.stderr); np.save(")
    trace, err = record(tmp_path, "idle", text, code=6)
    assert "finished" not in err  # reported once it was clear, not after the whole script
    o = read_trace(trace, allow_incomplete=True).manifest.outcome
    assert o["status"] == "no_steps"
    assert "never called optimizer.step()" in o["detail"] and "no parameter changed" in o["detail"]
    assert "torch.optim" in o["detail"] and "reprobisect.torch.record" in o["detail"]


INIT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
{seed}
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
torch.manual_seed(5)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(data, batch_size=8):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def test_unseeded_initialization_is_named_first_and_a_seed_reaches_the_manifest(tmp_path: Path) -> None:
    a, _ = record(tmp_path, "a", INIT.format(seed=""), steps=2)
    b, _ = record(tmp_path, "b", INIT.format(seed=""), steps=2)
    c = compare_traces(read_trace(a), read_trace(b))
    assert not c and (c.first.step, c.first.kind, c.first.name) == (0, "init", "0.weight")
    ta = read_trace(a)
    assert [r.name for r in ta.steps[0].records if r.kind == "init"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert not [r for r in ta.steps[1].records if r.kind == "init"]
    assert ta.manifest.seed == 5  # the first torch.manual_seed the script called (after the init here)
    s, _ = record(tmp_path, "s", INIT.format(seed="torch.manual_seed(3)"), steps=2)
    assert read_trace(s).manifest.seed == 3


ACCUM = """
import torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    for micro in range(3):
        x = torch.randn(2, 4)
        (m(x).pow(2).mean() / 3).backward()
    opt.step()
"""


def test_gradient_accumulation_records_every_micro_batch(tmp_path: Path) -> None:
    t = read_trace(record(tmp_path, "acc", ACCUM, steps=2)[0])
    s = t.steps[0]
    names = {(r.kind, r.name) for r in s.records}
    assert {("input", "input"), ("input", "input#1"), ("input", "input#2")} <= names
    assert {("loss", "loss"), ("loss", "loss#1"), ("loss", "loss#2")} <= names
    assert len(s.scalars["losses"]) == 3
    assert s.scalars["loss"] == pytest.approx(sum(s.scalars["losses"]), rel=1e-12)


CELL = """
import torch
from torch import nn
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        h = c = torch.zeros(2, 4)
        for t in range(20):  # a cell called per timestep: many activations per forward
            h, c = self.cell(x[t], (h, c))
        return self.head(h)

net = Net()
opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=4)
x, y = torch.randn(20, 2, 3), torch.randn(2, 1)

def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    return loss

for _ in range(5):
    opt.step(closure)
"""


def test_records_per_step_are_bounded_and_lbfgs_reevaluations_counted(tmp_path: Path) -> None:
    full, _ = record(tmp_path, "full", CELL, steps=2)
    s = read_trace(full).steps[0]
    assert s.scalars["closure_evaluations"] > 1
    acts = [r for r in s.records if r.kind == "activation"]
    assert len(acts) == 41  # one evaluation: 20 calls x (h, c) and the head; the re-evaluations are counted only
    assert len([r for r in s.records if r.kind == "loss"]) == 1
    capped, err = record(tmp_path, "capped", CELL, "--max-records-per-step", "10", steps=2)
    t = read_trace(capped)
    s = t.steps[0]
    assert len([r for r in s.records if r.kind in ("input", "activation", "output")]) == 10
    assert s.scalars["records_dropped"] > 0 and s.scalars["max_records_per_step"] == 10
    assert {r.name for r in s.records if r.kind == "grad"} == {r.name for r in s.records if r.kind == "param"}
    assert len([r for r in s.records if r.kind == "param"]) == 6
    assert "--max-records-per-step" in err and "--max-records-per-step" in " ".join(t.manifest.extra["notes"])


def test_capture_takes_the_records_bound_its_message_names(tmp_path: Path) -> None:
    """The note names --max-records-per-step: `bisect capture` must accept it (and refuse nonsense)."""
    script = tmp_path / "cell.py"
    script.write_text(textwrap.dedent(CELL))
    out = tmp_path / "cli.trace"
    r = subprocess.run([PY, "-m", "reprobisect", "capture", "-q", "--steps", "1", "--max-records-per-step", "10",
                        "-o", str(out), "--", PY, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert read_trace(out).steps[0].scalars["max_records_per_step"] == 10
    bad = subprocess.run([PY, "-m", "reprobisect", "capture", "--max-records-per-step", "0", "-o", str(tmp_path / "x"),
                          "--", PY, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-records-per-step must be at least 1" in bad.stderr
    assert not (tmp_path / "x").exists()


TEACHER = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(64, 4, generator=g))
teacher = nn.Linear(4, 2).eval()
student = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(student.parameters(), lr=0.1)
for (x,) in DataLoader(data, batch_size=8):
    with torch.no_grad():
        target = teacher(x)
    loss = nn.functional.mse_loss(student(x), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_teachers_no_grad_forward_does_not_take_the_training_batch(tmp_path: Path) -> None:
    t = read_trace(record(tmp_path, "kd", TEACHER, steps=2)[0])
    for k, s in enumerate(t.steps):
        assert s.batch_ids == list(range(8 * k, 8 * k + 8))
        assert {(r.kind, r.name) for r in s.records} >= {("batch", "data[0]"), ("input", "input"), ("output", "output")}
        assert [(e["forwards"], e["batches"]) for e in s.scalars["eval"]] == [(1, 0)]


def test_training_in_eval_mode_is_still_training(tmp_path: Path) -> None:
    """Fine-tuning with frozen batch norm trains in model.eval() mode: that is not evaluation."""
    text = TEACHER.replace("student = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))",
                           "student = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).eval()")
    assert ".eval()\nopt" in text
    t = read_trace(record(tmp_path, "frozen", text, steps=2)[0])
    for k, s in enumerate(t.steps):
        assert s.batch_ids == list(range(8 * k, 8 * k + 8))
        assert {(r.kind, r.name) for r in s.records} >= {("input", "input"), ("activation", "1"), ("output", "output")}


# nanoGPT's shape: batches from torch.randint on the global RNG, for training and for
# estimate_loss alike, so the number of evaluation batches moves every training batch after it
GLOBAL_RNG_EVAL = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
data = torch.randn(256, 4)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
eval_iters = int(sys.argv[1])

def get_batch():
    ix = torch.randint(len(data), (8,))
    return data[ix]

for it in range(3):
    if it == 1:
        model.eval()
        with torch.no_grad():
            for _ in range(eval_iters):
                model(get_batch()).mean()
        model.train()
    opt.zero_grad()
    model(get_batch()).pow(2).mean().backward()
    opt.step()
"""


def test_evaluation_that_moves_the_training_data_is_named(tmp_path: Path) -> None:
    """Changing only eval_iters really changes training when evaluation draws from the
    global RNG: the verdict must say so (diverged at the next step's input) and the hint
    must name evaluation, not PYTHONHASHSEED."""
    from reprobisect.render import render_comparison

    def run(name: str, iters: int) -> Path:
        script = tmp_path / "g.py"
        script.write_text(textwrap.dedent(GLOBAL_RNG_EVAL))
        trace = tmp_path / f"{name}.trace"
        r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "3", "--",
                            str(script), str(iters)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                           env={**__import__("os").environ, "PYTHONHASHSEED": "random"})
        assert r.returncode == 0, r.stderr[-3000:]
        return trace

    a, b, a2 = run("a", 2), run("b", 3), run("a2", 2)
    same(a, a2)
    c = compare_traces(read_trace(a), read_trace(b))
    assert not c and c.first.step == 1 and c.first.kind == "input", str(c)
    text = render_comparison(c)
    assert "evaluation before step 1 differed" in text and "own torch.Generator" in text, text
    assert "PYTHONHASHSEED" not in text.split("verdict:")[-1], text
