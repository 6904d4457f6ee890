"""DVC data at a revision (``reprobisect.vcs.dvc``) with real DVC in tmp git repositories:
a probe worktree gets the data of its own commit from the user's cache, the worktree stays
clean, a missing cache entry is reported (not raised), a repository without DVC says so."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect.vcs.dvc import _dvc_cache_of, dvc_pull_at
from reprobisect.vcs.git import WorktreePool, checkout

PYTHON = sys.executable


@pytest.fixture(autouse=True)
def _no_analytics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def plain_repo(tmp_path: Path, name: str) -> Path:
    repo = tmp_path / name
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    return repo


def test_no_dvc_project_and_the_cache_dir_from_config(tmp_path: Path) -> None:
    plain = plain_repo(tmp_path, "nodvc")
    with checkout(plain, "HEAD") as wt:
        r = dvc_pull_at(wt, plain)
        assert r and r.status == "none" and "no DVC project" in r.detail
    proj = tmp_path / "proj"
    (proj / ".dvc").mkdir(parents=True)
    assert _dvc_cache_of(proj) is None
    (proj / ".dvc" / "config").write_text("[cache]\n    dir = ../shared-cache\n")
    assert _dvc_cache_of(proj) == (proj / "shared-cache").resolve()
    (proj / ".dvc" / "config.local").write_text("[cache]\n    dir = '/abs/cache'\n")  # config.local wins
    assert _dvc_cache_of(proj) == Path("/abs/cache")


@pytest.mark.slow
def test_dvc_data_at_a_revision(tmp_path: Path) -> None:
    repo = tmp_path / "dvcrepo"
    repo.mkdir()
    git(repo, "init", "-q")
    dvc = [PYTHON, "-m", "dvc"]
    subprocess.run([*dvc, "init", "-q"], cwd=repo, check=True)
    git(repo, "commit", "-q", "-m", "dvc init")
    revs = []
    for v in ("v1", "v2"):
        (repo / "data.txt").write_text(v + "\n")
        subprocess.run([*dvc, "add", "-q", "data.txt"], cwd=repo, check=True)
        git(repo, "add", "data.txt.dvc", ".gitignore")
        git(repo, "commit", "-q", "-m", f"data {v}")
        revs.append(git(repo, "rev-parse", "HEAD"))
    before = snapshot_dvc(repo)
    with WorktreePool(repo) as pool:
        with pool.checkout(revs[0]) as wt:
            assert not (wt / "data.txt").exists()
            r = dvc_pull_at(wt, repo)
            assert r and r.status == "checked_out", r
            assert (wt / "data.txt").read_text() == "v1\n"
            assert git(wt, "status", "--porcelain") == ""  # config.local is ignored: still clean
        with pool.checkout(revs[1]) as wt:  # reused worktree: the other revision's data
            assert dvc_pull_at(wt, repo).status == "checked_out"
            assert (wt / "data.txt").read_text() == "v2\n"
            # the cache lacks what a commit needs and there is no remote: reported, not raised
            shutil.rmtree(repo / ".dvc" / "cache")
            (wt / "data.txt").unlink()
            bad = dvc_pull_at(wt, repo)
            assert not bad and bad.status == "failed" and "dvc pull" in bad.detail
    assert snapshot_dvc(repo)["status"] == before["status"]
    plain = plain_repo(tmp_path, "nodvc")
    with checkout(plain, "HEAD") as wt:
        assert dvc_pull_at(wt, plain).status == "none"


def snapshot_dvc(repo: Path) -> dict[str, str]:
    return {"status": git(repo, "status", "--porcelain"), "head": git(repo, "rev-parse", "HEAD")}
