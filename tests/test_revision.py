"""``manifest.revision``: the commit (and dirty flag) of the repository the command's script
lives in, recorded by ``bisect capture`` (issue 9 item 6): a real repository, a real capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect.runners.environment import revision_of

pytestmark = pytest.mark.torch

TRAIN = """\
import torch
torch.manual_seed(0)
m = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    m(torch.ones(4, 2)).sum().backward()
    opt.step()
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "proj"
    r.mkdir()
    git(r, "init", "-q")
    git(r, "config", "user.email", "t@example.com")
    git(r, "config", "user.name", "T")
    (r / "train.py").write_text(TRAIN)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "train")
    return r


def capture(cwd: Path, out: Path, *cmd: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "reprobisect", "capture", "-o", str(out), "--steps", "2", "--", *cmd],
                       cwd=cwd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.slow
def test_capture_records_the_scripts_revision(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    m = capture(repo, tmp_path / "t1", "python", "train.py")
    assert m["revision"] is not None, m["revision"]
    assert m["revision"]["commit"] == head and m["revision"]["dirty"] is False
    # run from outside the repository: the script's repository counts, not the cwd
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    m = capture(outside, tmp_path / "t2", "python", str(repo / "train.py"))
    assert m["revision"]["commit"] == head and Path(m["revision"]["root"]) == repo.resolve()
    # a tracked change makes it dirty
    (repo / "train.py").write_text(TRAIN + "# edited\n")
    m = capture(repo, tmp_path / "t3", "python", "train.py")
    assert m["revision"]["commit"] == head and m["revision"]["dirty"] is True


def test_revision_of_untracked_script_and_outside_git(repo: Path, tmp_path: Path) -> None:
    (repo / "scratch.py").write_text("pass\n")
    assert revision_of(repo / "scratch.py")["dirty"] is True  # the commit alone does not hold it
    assert revision_of(repo / "train.py")["dirty"] is False
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "x.py").write_text("pass\n")
    assert revision_of(plain / "x.py") is None
