"""Replay from a recorded complete state (issue 12 item 4's mechanism).

Each training script (in the styles of ``examples/corpus``) is recorded uninterrupted for
N steps with complete state captured after step S-1, then replayed: the unmodified
command runs again from its start, loads that state where step S began and records steps
S..N-1. The replayed steps must equal the uninterrupted recording's bitwise, record by
record (``core.compare``). Where the state cannot be restored faithfully the replay ends
as ``skip`` with a one-line reason; where the loop's own variables make the replay differ,
``verify_replay`` says so and the result is not faithful.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from reprobisect.core.compare import Tolerance, compare_traces  # noqa: E402
from reprobisect.core.outcome import Status  # noqa: E402
from reprobisect.trace.reader import read_trace  # noqa: E402
from reprobisect.workflows.replay import last_state_before, replay, replay_info, replay_through  # noqa: E402

PY = sys.executable
N, S = 7, 3  # record steps 0..6 with state after step 2; replay steps 3..6

LOADER_ADAM_SCALER = '''
import random
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0); random.seed(0); np.random.seed(0)
g = torch.Generator().manual_seed(123)
ds = TensorDataset(torch.randn(20, 8, generator=g), torch.randn(20, 1, generator=g))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
loader = DataLoader(ds, batch_size=6, shuffle=True)  # 4 batches an epoch: the replay crosses epochs
for epoch in range(100):
    for x, y in loader:
        noise = torch.randn(()) * random.random() * float(np.random.rand()) * 1e-2
        loss = ((model(x) - y) ** 2).mean() + noise
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
'''

SGD_LOADER_GENERATOR = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
g = torch.Generator().manual_seed(1)
ds = TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))
model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Dropout(0.2), nn.Linear(12, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 4], gamma=0.3)
loader = DataLoader(ds, batch_size=8, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(5))
while True:
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
'''

GET_BATCH = '''
import torch
from torch import nn

torch.manual_seed(1337)
data = torch.randint(0, 32, (400,))
block, bs = 8, 4

def get_batch():
    ix = torch.randint(len(data) - block - 1, (bs,))
    return (torch.stack([data[i:i + block] for i in ix]), torch.stack([data[i + 1:i + 1 + block] for i in ix]))

class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(32, 16)
        self.drop = nn.Dropout(0.1)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 32, bias=False)

    def forward(self, idx, targets):
        h = self.drop(self.wte(idx))
        h = h + self.mlp(h)
        logits = self.head(h)
        return logits, nn.functional.cross_entropy(logits.view(-1, 32), targets.view(-1))

model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
iter_num = 0
while True:
    X, Y = get_batch()
    logits, loss = model(X, Y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    iter_num += 1
'''

# nanoGPT's learning rate comes from the loop's own counter: not in any state_dict
GET_BATCH_LR_FROM_COUNTER = GET_BATCH.replace(
    "    X, Y = get_batch()\n",
    "    for group in opt.param_groups:\n        group['lr'] = 3e-3 * min(1.0, (iter_num + 1) / 10)\n"
    "    X, Y = get_batch()\n",
)

# a DataLoader with worker processes: their seeds come from the restored epoch start
LOADER_WORKERS = LOADER_ADAM_SCALER.replace("batch_size=6, shuffle=True)", "batch_size=6, shuffle=True, num_workers=2)")

# nanoGPT draws the next batch before the step ends: the batch of step S is not in any state
GET_BATCH_AHEAD = GET_BATCH.replace(
    "while True:\n    X, Y = get_batch()\n    logits, loss = model(X, Y)\n",
    "X, Y = get_batch()\nwhile True:\n    logits, loss = model(X, Y)\n    X, Y = get_batch()\n",
)

ITERABLE = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

class Stream(IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(4, generator=g), torch.randn(1, generator=g)

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Stream(), batch_size=2)
for x, y in (DataLoader(Stream(), batch_size=2) if "temporary" in __import__("sys").argv else loader):
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()
'''

# a second optimizer that first steps after the state was captured: the state does not hold it
LATE_OPTIMIZER = SGD_LOADER_GENERATOR.replace(
    "sched = torch.optim.lr_scheduler",
    "aux = nn.Linear(3, 3)\naux_opt = torch.optim.RMSprop(aux.parameters(), lr=0.01)\nsched = torch.optim.lr_scheduler",
)

SCRIPTS = {"loader_adam_scaler": LOADER_ADAM_SCALER, "sgd_loader_generator": SGD_LOADER_GENERATOR,
           "get_batch": GET_BATCH, "lr_from_counter": GET_BATCH_LR_FROM_COUNTER, "iterable": ITERABLE,
           "loader_workers": LOADER_WORKERS, "get_batch_ahead": GET_BATCH_AHEAD, "late_optimizer": LATE_OPTIMIZER}


def _record(folder: Path, name: str, steps: int = N, state_after: int = S - 1, args: tuple[str, ...] = ()):
    script = folder / f"{name}.py"
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    trace = folder / f"{name}{''.join(args)}.full.trace"
    r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps),
                        "--state-steps", str(state_after), "--", script.name, *args], cwd=folder, capture_output=True,
                       text=True, timeout=300, env=os.environ.copy())
    assert r.returncode == 0, r.stderr[-3000:]
    return read_trace(trace)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("replay")


def _replay(work: Path, name: str, full, first: int = S, steps: int = N - S, args: tuple[str, ...] = ()):
    return replay(["python", f"{name}.py", *args], full.path, first, work / f"{name}{''.join(args)}.replay{first}.trace",
                  steps=steps, cwd=work)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["loader_adam_scaler", "sgd_loader_generator", "get_batch", "loader_workers"])
def test_replayed_steps_equal_the_uninterrupted_recording_bitwise(work, name):
    full = _record(work, name)
    res = _replay(work, name, full)
    assert res.outcome.status is Status.OK, res.outcome
    assert res.outcome.detail.startswith(f"replayed {N - S} step(s) from step {S} ")
    assert res.faithful is True and res.steps_checked == N - S, res.detail
    rep = read_trace(res.trace)
    assert [s.step for s in rep.steps] == list(range(S, N))
    info = replay_info(rep)
    assert info["from"] == str(full.path.resolve()) and info["step"] == S and info["restored"] is True
    assert info["mode"] == ("step_end" if name == "get_batch" else "loader")
    tail = dataclasses.replace(full, steps=[s for s in full.steps if s.step >= S])
    comp = compare_traces(tail, rep, Tolerance(mode="bitwise"))
    assert comp.first is None and comp.steps_compared == N - S, comp.first
    for k in range(S, N):  # record by record, the same chain (no init: that is step 0's)
        a, b = full.step(k), rep.step(k)
        assert len(a.records) > 10 and [(r.key, r.fingerprint) for r in a.records] == \
            [(r.key, r.fingerprint) for r in b.records]
        assert a.batch_ids == b.batch_ids and a.scalars.get("lr") == b.scalars.get("lr")
        assert a.scalars.get("scaler_scale") == b.scalars.get("scaler_scale")


@pytest.mark.slow
@pytest.mark.parametrize("args, why", [
    ((), "the DataLoader reads an IterableDataset, whose position cannot be set"),
    # a loader only its iterator holds is gone when the state is captured: no position in the state
    (("temporary",), "the command iterates a DataLoader, but the state at step 1 holds no DataLoader position "
                     "(the loader was not kept alive, or not tracked)"),
])
def test_a_loader_whose_position_cannot_be_set_is_refused(work, args, why):
    full = _record(work, "iterable", steps=4, state_after=1, args=args)
    res = _replay(work, "iterable", full, first=2, steps=2, args=args)
    assert res.outcome.status is Status.SKIP and not res
    assert res.outcome.detail == f"cannot replay: {why}"
    info = replay_info(read_trace(res.trace, allow_incomplete=True))
    assert info["refused"] == res.outcome.detail and info["restored"] is False


@pytest.mark.slow
def test_an_object_the_state_does_not_hold_is_refused(work):
    full = _record(work, "late_optimizer", steps=4, state_after=1)
    res = _replay(work, "late_optimizer", full, first=2, steps=2)
    assert res.outcome.status is Status.SKIP
    assert res.outcome.detail == ("cannot replay: the command built a RMSprop that the state at step 1 does not hold "
                                  "(capture it, or replay a run that recorded it)")


@pytest.mark.slow
@pytest.mark.parametrize("name, where", [
    ("lr_from_counter", "step 4: param 'wte.weight' differs"),  # step 3 starts with the restored lr
    ("get_batch_ahead", "step 3: input 'input[0]' differs"),
])
def test_loop_state_outside_the_checkpoint_makes_the_replay_unfaithful(work, name, where):
    full = _record(work, name)
    res = _replay(work, name, full)
    assert res.outcome.status is Status.OK  # it ran: only the comparison with the original shows it
    assert res.faithful is False and not res
    assert f"the replay is not faithful ({where} from the original run's)" in res.detail, res.detail


@pytest.mark.slow
def test_no_state_at_the_step_before_is_refused(work):
    full = read_trace(work / "get_batch.full.trace") if (work / "get_batch.full.trace").is_dir() else \
        _record(work, "get_batch")
    assert last_state_before(full, 6) == S - 1 and last_state_before(full, S - 1) is None
    res = _replay(work, "get_batch", full, first=5, steps=1)
    assert res.outcome.status is Status.SKIP
    assert res.outcome.detail.startswith("cannot replay: trace ") and "holds no state at step 4" in res.outcome.detail


@pytest.mark.slow
def test_replay_through_a_step_starts_from_the_last_state_before_it(work):
    full = read_trace(work / "get_batch.full.trace") if (work / "get_batch.full.trace").is_dir() else \
        _record(work, "get_batch")
    late = replay_through(["python", "get_batch.py"], full.path, 5, work / "through5.trace", cwd=work)
    assert late.first_step == S and late.faithful is True and late.steps_checked == 3
    assert [s.step for s in read_trace(late.trace).steps] == [3, 4, 5]
    early = replay_through(["python", "get_batch.py"], full.path, 2, work / "through2.trace", cwd=work)
    assert early.first_step == 0 and early.faithful is True and early.detail.startswith("recorded from step 0")
    assert [s.step for s in read_trace(early.trace).steps] == [0, 1, 2]
    assert replay_info(read_trace(early.trace)) is None


# -- cheap: the checks around a replay, on traces written by hand ------------------------------

def _trace(path: Path, steps: dict[int, dict], states: tuple[int, ...] = ()):
    from reprobisect.trace.format import Record
    from reprobisect.trace.writer import TraceWriter

    with TraceWriter(path) as w:
        for k, spec in steps.items():
            w.begin_step(k)
            for kind, name, fp in spec.get("records", ()):
                w.record(Record(name=name, kind=kind, dtype="float32", shape=(2,), fingerprint=fp))
            w.end_step({"lr": spec.get("lr", [0.1])}, batch_ids=spec.get("ids"))
        for k in states:
            w.write_state(k, "rng", {}, {"state": {}, "objects": []})
    return read_trace(path)


def test_verify_replay_names_the_first_step_and_record_that_disagree(tmp_path):
    from reprobisect.workflows.replay import verify_replay

    def step(fp, lr=0.1, ids=(1, 2)):
        return {"records": [("loss", "loss", "a"), ("param", "w", fp)], "lr": [lr], "ids": list(ids)}

    orig = _trace(tmp_path / "o", {k: step(f"p{k}") for k in range(6)}, states=(1, 3))
    same = _trace(tmp_path / "s", {k: step(f"p{k}") for k in (4, 5, 6)})  # step 6: the original has none
    assert verify_replay(same, orig) == (None, 2)
    other_param = _trace(tmp_path / "p", {4: step("p4"), 5: step("x")})
    assert verify_replay(other_param, orig) == ("step 5: param 'w' differs from the original run's", 2)
    other_lr = _trace(tmp_path / "l", {4: step("p4", lr=0.2)})
    assert verify_replay(other_lr, orig)[0] == "step 4: scalar 'lr' differs from the original run's"
    other_batch = _trace(tmp_path / "b", {4: step("p4", ids=(2, 1))})
    assert verify_replay(other_batch, orig)[0] == "step 4: the replay drew other batches than the original run"
    # a record only one side holds (a sentinel original has no activations) is not a disagreement
    more = _trace(tmp_path / "m", {4: {**step("p4"), "records": [("activation", "fc", "z"), *step("p4")["records"]]}})
    assert verify_replay(more, orig) == (None, 1)
    # the state a replay of step t starts from: the last one captured before t
    assert [last_state_before(orig, t) for t in (1, 2, 3, 4, 9)] == [None, 1, 1, 3, 3]


def test_launcher_replay_options_go_together():
    from reprobisect.errors import UsageError
    from reprobisect.runners.launch import parse_args

    with pytest.raises(UsageError, match="--replay-from and --replay-step go together"):
        parse_args(["--trace", "t", "--replay-from", "x", "--", "train.py"])
    ns, _ = parse_args(["--trace", "t", "--replay-from", "x", "--replay-step", "4", "--", "train.py"])
    assert (ns.replay_from, ns.replay_step) == ("x", 4)
