"""``bisect resume`` on a GradScaler the resume forgot and on an evaluation that is not continued.

A GradScaler restarted at its initial scale overflows and skips the optimizer step: a skipped step
records no learning rate, which is no learning-rate evidence; the scale that differs first is the
cause, named in the run's own time (the scaler decides before the optimizer and the scheduler), and
a learning rate that lags by the skipped steps is said as its consequence. An averaged copy of the
weights (an EMA) rebuilt after the load leaves training bitwise while every evaluation after the
resume gives other outputs: that is not "resume OK".

Real torch on CPU (fp16 autocast, ``torch.amp.GradScaler("cpu")``), one tiny script in tmp_path and
the real library: its uninterrupted and interrupted runs are recorded once (``record_reference``) and
judged against three resumes (``judge_resumed``); the last tests are the pure rules on hand-made
traces."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.executors import executor_for
from reprobisect.render.resume import render_resume
from reprobisect.trace.format import Manifest, Record, Step
from reprobisect.trace.reader import Trace
from reprobisect.workflows.resume import diagnose, judge_resumed, record_reference

SCRIPT = """
import argparse, copy
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--resume")
p.add_argument("--steps", type=int, default=8)
p.add_argument("--fresh-scaler", action="store_true")  # the resume forgets scaler.load_state_dict
p.add_argument("--rebuild-ema", action="store_true")  # the averaged copy is built again after the load
a = p.parse_args()
torch.manual_seed(0)
x = torch.randn(40, 5) * 4
y = x.sum(1, keepdim=True) * 3
held = torch.randn(8, 5)
net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")  # backs off from 65536 to 1024 over steps 0..5 (overflows)
ema = copy.deepcopy(net).eval()
start = 0
if a.resume:
    ck = torch.load(a.resume)
    net.load_state_dict(ck["net"]); opt.load_state_dict(ck["opt"]); ema.load_state_dict(ck["ema"])
    if not a.fresh_scaler:
        scaler.load_state_dict(ck["scaler"])
    if a.rebuild_ema:
        ema = copy.deepcopy(net).eval()
    start = ck["step"]
for step in range(start, a.steps):
    rows = slice(step * 5 % 40, step * 5 % 40 + 5)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = net(x[rows])
    loss = ((out.float() - y[rows]) ** 2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    with torch.no_grad():
        for e, w in zip(ema.parameters(), net.parameters()):
            e.mul_(0.9).add_(w, alpha=0.1)
        ema(held)
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "ema": ema.state_dict(),
                "scaler": scaler.state_dict(), "step": step + 1}, "ckpt.pt")
"""


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict:
    """The script recorded once (8 steps, interrupted after 6) and judged against three resumes."""
    work = tmp_path_factory.mktemp("scaler-eval") / "work"
    work.mkdir()
    (work / "train.py").write_text(textwrap.dedent(SCRIPT))
    argv, opts = ["python", "train.py"], ProbeOptions(steps=8, quiet=True, env={"OMP_NUM_THREADS": "1"})
    resumes = {"scaler": ["--resume", "ckpt.pt", "--fresh-scaler"], "ema": ["--resume", "ckpt.pt", "--rebuild-ema"],
               "ok": ["--resume", "ckpt.pt"]}
    with executor_for(opts) as ex, tempfile.TemporaryDirectory(prefix="resume-scaler-eval-") as scratch:
        ref = record_reference(argv, at=6, options=opts, executor=ex, cwd=work, scratch=scratch)
        assert not ref.reason, ref.reason
        return {k: judge_resumed(ref, argv, args, options=opts, executor=ex, cwd=work) for k, args in resumes.items()}


@pytest.mark.slow
def test_a_gradscaler_restarted_at_its_init_scale_is_named_before_the_learning_rate(judged):
    r = judged["scaler"]
    f = r.finding
    assert r.verdict == "diverged" and r.exit_code == 1, render_resume(r)
    assert f.component == "GradScaler" and f.step == 6, f
    assert "1024.0 vs 65536.0" in f.what and "init_scale, 2**16 by default" in f.what, f.what
    assert "skipped this step's optimizer.step()" in f.what, f.what
    # the checkpoint held the scaler's state (noted at the save): not loaded, not "not saved"
    assert "saved ckpt.pt with the GradScaler's state" in f.why and "did not load it" in f.why, f.why
    assert any("no learning rate recorded at step 6" in x and "consequence" in x for x in f.also), f.also
    assert "scheduler" not in f.why


@pytest.mark.slow
def test_an_ema_rebuilt_after_the_load_is_an_evaluation_difference_not_resume_ok(judged):
    r = judged["ema"]
    f = r.finding
    assert r.verdict == "diverged" and r.exit_code == 1, render_resume(r)
    assert f.component == "evaluation" and f.step == 6, f
    assert "training continues bitwise" in f.what and "evaluation (no_grad) after step 6" in f.what, f.what
    assert "other outputs" in f.what and "EMA/averaged copy" in f.why, f
    assert render_resume(r).startswith("resume differs at step 6: evaluation")


@pytest.mark.slow
def test_a_resume_that_restores_the_scaler_and_the_ema_is_bitwise(judged):
    r = judged["ok"]
    assert r.verdict == "bitwise" and r.exit_code == 0, render_resume(r)


# -- the rules on hand-made traces: no process -------------------------------------------------------


def _rec(kind: str, name: str, fp: str) -> Record:
    return Record(name=name, kind=kind, dtype="float32", shape=(2,), fingerprint=fp)


def _trace(steps: list[Step]) -> Trace:
    return Trace(path=Path("t"), manifest=Manifest(status="complete", command=[], environment={},
                                                   policy={"detail": "full"}), steps=steps)


def _step(k: int, w: str, *, scale: float = 1024.0, lr: float | None = 0.1, skipped: bool = False,
          init: str | None = None, ev: str | None = None, grad: str = "g", shift: int = 0) -> Step:
    """Step ``k`` (batch ``k + shift``: a resumed run's step k is the uninterrupted run's k + shift)."""
    recs = (_rec("init", "w", init),) if init else ()
    recs += (_rec("loss", "loss", f"l{w}"), _rec("grad", "w", grad))
    if not skipped:
        recs += (_rec("param", "w", w),)
    scalars = {"scaler_scale": scale, **({"lr": [lr]} if not skipped else {"scaler_skipped": True})}
    if ev is not None:
        scalars["eval"] = [{"phase": "no_grad", "after_step": k - 1, "forwards": 1, "batches": 0, "samples": None,
                            "ids_fingerprint": None, "outputs_fingerprint": ev, "outputs_fingerprinted": 1}]
    return Step(step=k, records=recs, batch_ids=[k + shift], scalars=scalars)


def _uninterrupted() -> Trace:
    """Steps 0..2 skipped while the scale backs off from 65536; 3..5 real updates at 8192."""
    return _trace([_step(k, f"w{k}", scale=65536.0 / 2 ** k if k < 3 else 8192.0, skipped=k < 3,
                         init="w-init" if k == 0 else None) for k in range(6)])


def test_a_learning_rate_missing_on_a_skipped_step_is_not_named_the_scheduler():
    """The scale differs at step 3 and the resumed run skipped: the GradScaler, and the checkpoint
    that held no scaler state says "not saved"; the missing lr is its consequence."""
    a = _uninterrupted()
    c = _trace([_step(0, "x0", scale=65536.0, skipped=True, init="w2", grad="gc", shift=3),
                _step(1, "x1", scale=32768.0, grad="gc", shift=3)])
    saved = ({"file": "/tmp/x/ckpt.pt", "optimizer_steps": 3, "schedulers": [], "scheduler_steps_after": 0,
              "scheduled_optimizer": True, "scaler_scales": []},)
    f = diagnose(a, c, 3, saved=saved)
    assert f.component == "GradScaler" and f.step == 3, f
    assert "8192.0 vs 65536.0" in f.what and "the scale the uninterrupted run started with" in f.what, f.what
    assert "was not saved" in f.why and "(ckpt.pt)" in f.why and "scheduler" not in f.why, f.why
    assert any("no learning rate recorded" in x for x in f.also), f.also


def test_a_step_skipped_in_one_run_only_at_the_same_scale_is_not_the_gradscaler():
    """Same scale, the resumed run's gradients overflowed and the uninterrupted run's did not: the
    gradients differ first (not the scaler's state), and the missing lr is no scheduler evidence."""
    a = _uninterrupted()
    c = _trace([_step(0, "x0", scale=8192.0, skipped=True, init="w2", grad="gc", shift=3)])
    f = diagnose(a, c, 3)
    assert f.component not in ("GradScaler", "learning rate / scheduler"), f


def test_evaluations_recorded_in_one_run_only_are_not_compared_and_agreeing_ones_are_bitwise():
    a = _trace([_step(k, f"w{k}", init="w-init" if k == 0 else None, ev=f"e{k}" if k else None) for k in range(5)])
    c = _trace([_step(j, f"w{3 + j}", init="w2" if j == 0 else None, ev=f"e{3 + j}" if j else None, shift=3)
                for j in range(2)])
    assert diagnose(a, c, 3) is None  # A's evaluation after step 2 was the interrupted run's: not compared
    c2 = _trace([*c.steps[:1], _step(1, "w4", ev="other", shift=3)])
    f = diagnose(a, c2, 3)
    assert f.component == "evaluation" and f.step == 3 and "gives other outputs" in f.what, f
