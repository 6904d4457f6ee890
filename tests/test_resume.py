"""``bisect resume`` end to end: real torch on CPU, the example script's own checkpoint code,
one planted resume bug per case, each named as its state component."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.executors.local import LocalExecutor
from reprobisect.render.resume import render_resume, resume_json
from reprobisect.workflows.resume import judge_resumed, record_reference

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "resume" / "train.py"
PY = sys.executable


def _bisect(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([PY, "-m", "reprobisect", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


CASES = {
    # bug planted in the resume code -> (component, first differing step)
    "scheduler": ("learning rate / scheduler", 4),  # the optimizer's own lr is right at step 3; StepLR's count is not
    "dataloader": ("data order", 3),
    "rng": ("RNG", 3),
    "scaler": ("GradScaler", 3),
    "step": ("step counter", 3),
    "optimizer": ("optimizer state", 3),
    "model": ("model parameters", 3),
}


def _judge_all(folder: Path, script_args: list[str], variants: dict[str, list[str]], detail: str = "full") -> dict:
    """Runs 1 and 2 once, then each resume variant from the interrupted run's checkpoint (each
    resumed run starts from a fresh copy of the folder the interrupted run left)."""
    folder.mkdir(parents=True, exist_ok=True)
    opts = ProbeOptions(steps=6, quiet=True, detail=detail)
    argv = ["python", str(SCRIPT), "--total", "6", *script_args]
    out = {}
    with LocalExecutor(jobs=1) as ex:
        ref = record_reference(argv, at=3, options=opts, executor=ex, cwd=folder, scratch=folder.parent / "runs")
        assert not ref.reason, ref.reason
        for name, args in variants.items():
            out[name] = judge_resumed(ref, argv, args, options=opts, executor=ex, cwd=folder)
    return out


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    variants = {bug: ["--resume", "ckpt.pt", "--bug", bug] for bug in ["none", *CASES]}
    variants["crash"] = ["--resume", "missing"]  # no checkpoint's name: passed on, and the script crashes
    return _judge_all(tmp_path_factory.mktemp("plain"), [], variants)


def test_a_correct_resume_is_bitwise(verdicts):
    r = verdicts["none"]
    assert r and r.exit_code == 0 and r.verdict == "bitwise" and r.finding is None and r.compared == 3
    assert [(s.role, s.status, s.steps) for s in r.runs] == [("uninterrupted", "ok", 6), ("interrupted", "ok", 3),
                                                             ("resumed", "ok", 3)]


@pytest.mark.parametrize("bug", sorted(CASES))
def test_each_planted_bug_is_named_as_its_component(verdicts, bug):
    r = verdicts[bug]
    component, step = CASES[bug]
    assert not r and r.exit_code == 1 and r.verdict == "diverged", r
    assert (r.finding.component, r.finding.step) == (component, step), r.finding


def test_the_findings_say_what_differs(verdicts):
    assert "restarted at the start of the epoch" in verdicts["dataloader"].finding.what
    assert "Dropout" in verdicts["rng"].finding.what
    assert "one step later" in verdicts["step"].finding.what
    assert "momentum_buffer" in verdicts["optimizer"].finding.what


def test_a_resumed_run_that_crashes_is_inconclusive_with_its_last_line(verdicts):
    r = verdicts["crash"]
    assert not r and r.exit_code == 1 and r.verdict == "inconclusive"
    assert "no checkpoint at missing" in r.reason and r.runs[2].status == "crashed"
    assert "resume inconclusive" in render_resume(r) and resume_json(r)["exit_code"] == 1


def test_stateful_dataloader_resume_and_its_restart_bug(tmp_path):
    out = _judge_all(tmp_path, ["--stateful"], {"ok": ["--resume", "ckpt.pt"],
                                                "bad": ["--resume", "ckpt.pt", "--bug", "dataloader"]})
    assert out["ok"].verdict == "bitwise", out["ok"]
    assert out["bad"].finding.component == "data order" and "restarted" in out["bad"].finding.what


def test_sentinel_detail_names_rng_from_the_loss_and_says_so(tmp_path):
    out = _judge_all(tmp_path, [], {"ok": ["--resume", "ckpt.pt"], "rng": ["--resume", "ckpt.pt", "--bug", "rng"]},
                     detail="sentinel")
    assert out["ok"].verdict == "bitwise" and out["ok"].detail == "sentinel"
    f = out["rng"].finding
    assert f.component == "RNG" and "loss" in f.what and "--detail full" in out["rng"].reason


def test_the_command_line_end_to_end(tmp_path):
    """The CLI runs all three and prints the JSON document (``--resume-args=ARGS`` form)."""
    p = _bisect("resume", "--quiet", "--json", "--steps", "4", "--at", "2", "--resume-args=--resume ckpt.pt --bug scaler",
                "--", "python", str(SCRIPT), "--total", "4", cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["verdict"] == "diverged" and doc["finding"]["component"] == "GradScaler", doc
    assert doc["compared_steps"] == [2, 3] and [r["role"] for r in doc["runs"]] == ["uninterrupted", "interrupted", "resumed"]


@pytest.mark.parametrize("args, says", [
    (["--steps", "4", "--resume-args", "--resume c.pt", "--", "python", "t.py"], "give --at K"),
    (["--steps", "4", "--at", "4", "--resume-args", "--resume c.pt", "--", "python", "t.py"], "--at 4 leaves no step"),
    (["--steps", "4", "--at", "2", "--resume-args", "  ", "--", "python", "t.py"], "--resume-args is empty"),
    (["--steps", "4", "--at", "2", "--", "python", "t.py"], "give --resume-args"),
    (["--steps", "4", "--at", "2", "--resume-args", "--resume 'c.pt", "--", "python", "t.py"], "fix the quotes"),
    (["--steps", "4", "--at", "2", "--resume-args", "--resume c.pt"], "give the training command after --"),
    (["--steps", "4", "--at", "0", "--resume-args", "--resume c.pt", "--", "python", "t.py"], "--at takes"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    p = _bisect("resume", *args, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in p.stderr
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_a_command_shorter_than_steps_is_bad_input(tmp_path):
    p = _bisect("resume", "--quiet", "--steps", "6", "--at", "3", "--resume-args", "--resume ckpt.pt", "--",
                "python", str(SCRIPT), "--total", "2", cwd=tmp_path)
    assert p.returncode == 2 and "ran only 2 step(s)" in p.stderr, p.stdout + p.stderr


def test_help():
    p = _bisect("resume", "--help", cwd=ROOT)
    assert p.returncode == 0 and "--resume-args" in p.stdout and "--at" in p.stdout
