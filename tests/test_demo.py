"""``bisect demo``: the generated repository, and the whole demo end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from reprobisect.workflows.demo import DEMO_COMMAND, build_demo_repo
from reprobisect.errors import UsageError


def _git(root, *args):
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def test_demo_repository_layout(tmp_path):
    repo = build_demo_repo(tmp_path / "r")
    assert len(repo.commits) == 21 and repo.good == repo.commits[0] and repo.bad == repo.commits[-1]
    assert _git(repo.path, "rev-list", "--count", "HEAD").strip() == "21"
    assert _git(repo.path, "status", "--porcelain") == ""
    # exactly one commit touches the LayerNorm eps, and it is the culprit
    touching = [c for c in repo.commits[1:] if "eps=" in _git(repo.path, "show", "--format=", c)]
    assert touching == [repo.culprit]
    # the broken commit has the typo'd import, the next one removes it
    assert len(repo.broken) == 1
    assert "from torch.nn import intit" in _git(repo.path, "show", f"{repo.broken[0]}:model.py")
    nxt = repo.commits[repo.commits.index(repo.broken[0]) + 1]
    assert "intit" not in _git(repo.path, "show", f"{nxt}:model.py")
    # realistic history: several authors, distinct subjects
    assert len(set(_git(repo.path, "log", "--format=%an").split("\n"))) >= 3
    assert len(set(repo.subjects)) == len(repo.subjects)
    # deterministic: the same generator gives the same hashes
    again = build_demo_repo(tmp_path / "r2")
    assert again.commits == repo.commits


def test_demo_repository_variants(tmp_path):
    b = build_demo_repo(tmp_path / "b", n_commits=6, culprit_at=3, broken_at=None, culprit_on_branch=True)
    assert b.culprit in b.branch_commits and b.broken == ()
    assert len(_git(b.path, "rev-list", "--merges", "HEAD").split()) == 1
    adj = build_demo_repo(tmp_path / "a", n_commits=5, culprit_at=3, broken_at=2)
    assert adj.commits.index(adj.culprit) == adj.commits.index(adj.broken[0]) + 1
    crash = build_demo_repo(tmp_path / "c", n_commits=3, culprit_at=2, broken_at=None, culprit_kind="crash")
    assert "save_checkpoint" in _git(crash.path, "show", f"{crash.culprit}:train.py")
    with pytest.raises(UsageError, match="not empty"):
        build_demo_repo(tmp_path / "c")


@pytest.mark.slow
@pytest.mark.torch
def test_bisect_demo_end_to_end(tmp_path):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "reprobisect", "demo", "--dir", str(tmp_path / "demo"), "--json"],
                       capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["found_planted"] is True
    # the envelope every --json document has, and the published schema (tests/test_json_schemas.py)
    assert (data["kind"], data["verdict"], data["exit_code"]) == ("demo", "found", r.returncode)
    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schemas" / "demo.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    res = data["result"]
    assert res["first_bad"]["hash"] == data["planted"]
    assert res["first_bad"]["subject"].startswith("model: hoist the LayerNorm eps")
    first = res["divergence"]["first"]
    assert (first["step"], first["kind"], first["name"], first["module"]) == (0, "activation", "net.1", "LayerNorm")
    assert res["recheck"] == "agreed"
    assert res["command"] == list(DEMO_COMMAND)
    # the broken commit was skipped if the search met it, never blamed
    assert all("skip" in s["reason"] for s in res["skipped"])
    print(f"bisect demo: {wall:.1f} s, {res['runs']} probe runs")


def test_bisect_demo_refuses_a_non_empty_dir(tmp_path):
    # a prebuilt --dir that is not empty is refused in one line
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    r = subprocess.run([sys.executable, "-m", "reprobisect", "demo", "--dir", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not empty" in r.stderr and "Traceback" not in r.stderr
