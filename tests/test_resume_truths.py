"""``bisect resume`` judges the user's checkpoint, not an artefact of the tool (issue 36, item 2):
end-of-epoch code runs before the interruption, each run sees only its own files, a missing or
stale checkpoint is named as such, and a scheduler saved before it stepped is not "not saved".
Real torch on CPU, tiny scripts in tmp_path, the real library and CLI."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.workflows.resume import check_resume
from reprobisect.workflows.resume.folders import Wrote, check_named
from tests.test_resume import _bisect

_HEAD = """
import argparse, os
import torch
from torch.utils.data import DataLoader, TensorDataset
p = argparse.ArgumentParser()
p.add_argument("--resume", default=None)
a = p.parse_args()
torch.manual_seed(0)
data = TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
loader = DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
def state(**kw):
    return {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
            "gen": loader.generator.get_state(), **kw}
def load(path):
    ck = torch.load(path)
    model.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"]); sched.load_state_dict(ck["sched"])
    loader.generator.set_state(ck["gen"])
    return ck
"""

EPOCH_END = _HEAD + """
val = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
start = load(a.resume)["epoch"] + 1 if a.resume else 0
for epoch in range(start, 4):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    sched.step()
    model.eval()
    for x, y in val:  # validation with gradients on: model.eval() only
        torch.nn.functional.mse_loss(model(x), y).item()
    torch.save(state(epoch=epoch), "ckpt.pt")  # a checkpoint per epoch, after validation
"""

SAVE_BEFORE_SCHED = _HEAD + """
loader = DataLoader(data, batch_size=4, generator=torch.Generator())  # one order every epoch: only the schedule matters
step = 0
if a.resume:
    step = load(a.resume)["step"]
while True:
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        torch.save(state(step=step), "ckpt.pt")  # saved after the update, before the scheduler steps
        sched.step()
"""


def _script(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent(text))
    return p


def _opts(steps: int) -> ProbeOptions:
    return ProbeOptions(steps=steps, quiet=True, env={"OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_a_per_epoch_checkpoint_at_an_epoch_boundary_resumes_bitwise(tmp_path):
    # epochs of 3 steps, interrupted after 3: the epoch's end (scheduler, validation, save) must run;
    # with 7 steps the uninterrupted run saved epoch 1's checkpoint too, which must not be read
    work = tmp_path / "work"
    work.mkdir()
    script = _script(tmp_path, EPOCH_END)
    r = check_resume(["python", str(script)], ["--resume", "ckpt.pt"], at=3, options=_opts(7), cwd=work)
    assert r.verdict == "bitwise" and r.exit_code == 0, (r.reason, r.finding)
    assert r.compared_steps == (3, 6)
    assert "the next training batch" in r.runs[1].detail
    assert list(work.iterdir()) == []  # the runs worked in copies: the user's folder is untouched


@pytest.mark.slow
def test_each_run_works_in_its_own_copy_and_the_user_folder_is_kept(tmp_path):
    # the user's folder holds an old ckpt.pt of another run: it is copied, never written or deleted
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    script = _script(tmp_path, EPOCH_END)
    r = check_resume(["python", str(script)], ["--resume", "ckpt.pt"], at=3, options=_opts(4), cwd=work)
    assert r.verdict == "bitwise", (r.reason, r.finding)
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"] and (work / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_checkpoint_the_interrupted_run_did_not_write_is_named_missing_in_one_line(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = _script(tmp_path, EPOCH_END)
    with pytest.raises(UsageError, match=r"--resume-args names last\.ckpt but the interrupted run \(after 3 step\(s\)\) "
                                         r"wrote no such file \(it wrote: ckpt\.pt\)"):
        check_resume(["python", str(script)], ["--resume", "last.ckpt"], at=3, options=_opts(4), cwd=work)


@pytest.mark.slow
def test_the_cli_says_missing_in_one_line_exit_2(tmp_path):
    script = _script(tmp_path, EPOCH_END)
    p = _bisect("resume", "--steps", "4", "--at", "2", "--resume-args", "--resume ckpt.pt", "--", "python", str(script),
                cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("resume")]
    assert "Traceback" not in p.stderr
    assert any("names ckpt.pt but the interrupted run (after 2 step(s)) wrote no such file (it wrote no file in its "
               "folder) (the uninterrupted run wrote it later" in ln for ln in lines), p.stderr


def _wrote(**kw) -> Wrote:
    return Wrote(**kw)


def test_lightning_version_counted_last_v1_is_named(tmp_path):
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "last.ckpt").write_text("old")
    wrote = _wrote(uninterrupted=("ckpts/last-v1.ckpt",), interrupted=("ckpts/last-v1.ckpt",))
    with pytest.raises(UsageError, match=r"the interrupted run wrote ckpts/last-v1\.ckpt because ckpts/last\.ckpt "
                                         r"already existed .*--resume-args reads ckpts/last\.ckpt, a stale file"):
        check_named(["--ckpt-path", "ckpts/last.ckpt"], tmp_path, wrote, 3)


def test_an_older_file_at_a_path_the_command_writes_is_stale_and_inputs_pass(tmp_path):
    (tmp_path / "ckpt.pt").write_text("old")
    (tmp_path / "config.yaml").write_text("lr: 1")
    wrote = _wrote(uninterrupted=("ckpt.pt",), interrupted=("other.pt",))
    with pytest.raises(UsageError, match=r"--resume-args reads ckpt\.pt, but the interrupted run .* did not write it: "
                                         r"it is your folder's own older file, a stale checkpoint \(it wrote: other\.pt\)"):
        check_named(["--resume", "ckpt.pt"], tmp_path, wrote, 3)
    check_named(["--config", "config.yaml", "--init_from", "resume"], tmp_path, wrote, 3)  # inputs, not checkpoints
    check_named(["--resume=other.pt"], tmp_path, wrote, 3)


def test_a_checkpoint_outside_the_folder_written_by_the_uninterrupted_run_is_named(tmp_path):
    ck = tmp_path / "shared.pt"
    ck.write_text("x")
    t = os.stat(ck).st_mtime
    wrote = _wrote(spans=((t - 1, t + 0.5), (t + 10, t + 20)))
    with pytest.raises(UsageError, match=r"the resumed run would read .*shared\.pt, written by the uninterrupted run, "
                                         r"not the interrupted one"):
        check_named(["--resume", str(ck)], tmp_path / "run", wrote, 3)


@pytest.mark.slow
def test_a_scheduler_saved_before_it_stepped_is_named_so_not_unsaved(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = _script(tmp_path, SAVE_BEFORE_SCHED)
    # at an epoch's end (3 batches an epoch) so that the data order carries over
    r = check_resume(["python", str(script)], ["--resume", "ckpt.pt"], at=3, options=_opts(5), cwd=work)
    assert r.verdict == "diverged" and r.exit_code == 1, r.reason
    f = r.finding
    assert (f.component, f.step) == ("learning rate / scheduler", 3), f
    assert "learning rate [0.0125] vs [0.025]" in f.what and "one step behind its optimizer" in f.what, f.what
    assert f.why.startswith("saved before the scheduler stepped, not unsaved: the interrupted run saved ckpt.pt after "
                            "3 optimizer step(s) with the scheduler at last_epoch 2, then called scheduler.step() 1 "
                            "more time(s)"), f.why
    assert "not saved" not in f.why.replace("not unsaved", "")
