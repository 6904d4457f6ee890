"""DVC data in probes, with real DVC (``python -m dvc``) in tmp git repositories and a local
remote folder (``reprobisect.vcs.dvc``, ``reprobisect.vcs.dvcfiles``, the ``data`` group of the
environment record and its diff):

- a probe's checkout gets the data of its own commit from the user's cache, linked (the
  same inode as the cache object, or a symlink into the cache), never copied;
- ``bisect runs`` over a history where one commit changes the DVC-tracked data names that
  commit, and its answer and environment diff show the data version change first;
- a commit whose data the cache lacks, with no default remote: the probe is ``skip`` with
  the reason, and that verdict is not cached; with a default remote: pulled;
- the user's working tree, ``.dvc/config`` and ``.dvc/config.local`` are unchanged after all of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprobisect.core.envdiff import data_changes, diff_environments
from reprobisect.core.options import ProbeOptions
from reprobisect.core.probe import ProbeSpec
from reprobisect.core.session import ResultCache
from reprobisect.executors.local import LocalExecutor
from reprobisect.vcs.dvc import _dvc_cache_of, data_mode, data_skip, dvc_pull_at, enabled, user_cache
from reprobisect.vcs.dvcfiles import cache_file, data_version, tracked_outs
from reprobisect.vcs.git import WorktreePool, checkout

PYTHON = sys.executable
DVC = [PYTHON, "-m", "dvc"]

TRAIN = textwrap.dedent("""\
    import json, os, sys
    import torch

    path = "data/train.csv"
    st = os.lstat(path)
    log = os.environ.get("DVC_PROBE_LOG")
    if log:  # how the data reached this checkout, for the test
        info = {"cwd": os.getcwd(), "ino": os.stat(path).st_ino, "nlink": os.stat(path).st_nlink,
                "symlink": os.path.islink(path), "real": os.path.realpath(path), "text": open(path).read()}
        with open(os.path.join(log, f"{os.getpid()}.json"), "w") as f:
            json.dump(info, f)
    x = torch.tensor([float(v) for v in open(path).read().split()]).reshape(-1, 1)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        loss = ((model(x) - 1.0) ** 2).mean()
        loss.backward()
        opt.step()
    """)
CHECK = "import sys; print(open('data/train.csv').read())\n"


@pytest.fixture(autouse=True)
def _no_analytics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def dvc(cwd: Path, *args: str) -> None:
    subprocess.run([*DVC, *args], cwd=cwd, check=True, capture_output=True, text=True,
                   env={**os.environ, "DVC_NO_ANALYTICS": "1"})


def commit_data(repo: Path, text: str, message: str) -> str:
    (repo / "data" / "train.csv").write_text(text)
    dvc(repo, "add", "-q", "data/train.csv")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def commit_docs(repo: Path, text: str) -> str:
    (repo / "README.md").write_text(text)
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", f"docs: {text.strip()}")
    return git(repo, "rev-parse", "HEAD")


def snapshot(repo: Path, worktrees: bool = True) -> dict[str, str]:
    """What the user has: status (ignored files too), HEAD, the DVC config files, the data
    (and the worktrees git knows: the probes' are registered while an executor holds them)."""
    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "(absent)"
    status = git(repo, "status", "--porcelain", "--ignored", "--untracked-files=all").splitlines()
    return {"status": "\n".join(ln for ln in status if not ln.startswith("!! .dvc/cache/")),  # a pull fills the cache
            "head": git(repo, "rev-parse", "HEAD"), "config": sha(repo / ".dvc" / "config"),
            "config.local": sha(repo / ".dvc" / "config.local"), "data": sha(repo / "data" / "train.csv"),
            "worktrees": git(repo, "worktree", "list") if worktrees else ""}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """c0 data v1 (good) · c1 docs · c2 data v2 (the culprit) · c3 docs (bad) · c4 data v3, pushed
    to the local remote and then dropped from the user's cache. The remote is in the tracked
    config under a relative URL, not the default: a probe pulls only once the user makes it so."""
    root = tmp_path_factory.mktemp("dvc")
    repo, remote = root / "repo", root / "remote"
    repo.mkdir()
    remote.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    dvc(repo, "init", "-q")
    dvc(repo, "remote", "add", "storage", "../remote")  # stored relative to .dvc: ../../remote
    (repo / "data").mkdir()
    (repo / "train.py").write_text(TRAIN)
    (repo / "check.py").write_text(CHECK)
    (repo / "README.md").write_text("v0\n")
    c = {"c0": commit_data(repo, "1 2 3 4\n", "data v1")}
    c["c1"] = commit_docs(repo, "v1")
    c["c2"] = commit_data(repo, "1 2 3 5\n", "data v2")
    c["c3"] = commit_docs(repo, "v2")
    c["c4"] = commit_data(repo, "9 9 9 9\n", "data v3")
    dvc(repo, "push", "-q", "-r", "storage", "data/train.csv.dvc")
    outs = {k: tracked_outs_at(repo, v) for k, v in c.items()}
    v3 = cache_file(user_cache(repo), outs["c4"])
    assert v3 is not None and v3.is_file()
    v3.chmod(0o644)
    v3.unlink()  # the user's cache lacks the data of c4; the remote has it
    return {"repo": repo, "remote": remote, "commits": c, "outs": outs}


def tracked_outs_at(repo: Path, commit: str):
    with checkout(repo, commit) as wt:
        (out,) = tracked_outs(wt)
    return out


# --------------------------------------------------------------------------- no DVC, files, config


def test_no_dvc_project_and_the_cache_dir_from_config(tmp_path: Path) -> None:
    plain = tmp_path / "nodvc"
    plain.mkdir()
    git(plain, "init", "-q")
    (plain / "a.txt").write_text("a\n")
    git(plain, "add", "a.txt")
    git(plain, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "a")
    with checkout(plain, "HEAD") as wt:
        r = dvc_pull_at(wt, plain)
        assert r and r.status == "none" and "no DVC project" in r.detail
    proj = tmp_path / "proj"
    (proj / ".dvc").mkdir(parents=True)
    assert _dvc_cache_of(proj) is None or os.environ.get("DVC_GLOBAL_CONFIG_DIR")
    (proj / ".dvc" / "config").write_text("[cache]\n    dir = ../shared-cache\n")
    assert _dvc_cache_of(proj) == (proj / "shared-cache").resolve()
    (proj / ".dvc" / "config.local").write_text("[cache]\n    dir = '/abs/cache'\n")  # config.local wins
    assert _dvc_cache_of(proj) == Path("/abs/cache")


def test_data_version_reads_dvc_files_and_locks_anywhere(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv.dvc").write_text(
        "outs:\n- md5: 0123456789abcdef0123456789abcdef\n  size: 3\n  hash: md5\n  path: train.csv\n")
    (tmp_path / "old.dvc").write_text("outs:\n- md5: fedcba9876543210fedcba9876543210.dir\n  path: images\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "dvc.lock").write_text(textwrap.dedent("""\
        schema: '2.0'
        stages:
          prep:
            cmd: python prep.py
            deps:
            - path: prep.py
              hash: md5
              md5: 11111111111111111111111111111111
            outs:
            - path: out/a.csv
              hash: md5
              md5: 22222222222222222222222222222222
        """))
    assert data_version(tmp_path) == {"dvc": {
        "data/train.csv.dvc": {"data/train.csv": "0123456789abcdef0123456789abcdef"},
        "old.dvc": {"images": "fedcba9876543210fedcba9876543210.dir"},
        "sub/dvc.lock": {"sub/out/a.csv": "22222222222222222222222222222222"},  # outputs only: prep.py is code
    }}
    legacy = [o for o in tracked_outs(tmp_path) if o.dvcfile == "old.dvc"][0]
    assert legacy.legacy and legacy.is_dir and cache_file("/c", legacy) == Path("/c/fe/dcba9876543210fedcba9876543210.dir")
    # the diff reads as a data version change, first among the numerics changes
    a = {"git": {"commit": "x"}, "data": data_version(tmp_path)}
    (tmp_path / "data" / "train.csv.dvc").write_text(
        "outs:\n- md5: 7b0d44e2000000000000000000000000\n  size: 3\n  hash: md5\n  path: train.csv\n")
    b = {"git": {"commit": "y"}, "data": data_version(tmp_path)}
    changes = diff_environments(a, b)
    assert [str(c) for c in changes] == [
        "data: data/train.csv.dvc md5 01234567… -> 7b0d44e2…", "git.commit: 'x' -> 'y'"]
    assert changes[0].numerics and data_changes(changes) == changes[:1]
    assert [str(c) for c in diff_environments({"data": None}, b)] == [
        "data: data/train.csv.dvc md5 (absent) -> 7b0d44e2…", "data: old.dvc md5 (absent) -> fedcba98….dir",
        "data: sub/dvc.lock md5 (absent) -> 22222222…", "git.commit: (absent) -> 'y'"]
    # where envs / repro / compare show environment differences: the data version first
    from reprobisect.render.comparison import render_env
    from reprobisect.render.envs import format_changes

    shown = render_env(tuple(changes))
    assert shown[1] == "  data: data/train.csv.dvc md5 01234567… -> 7b0d44e2…", shown
    assert format_changes(changes).splitlines()[1] == "  data: data/train.csv.dvc md5 01234567… -> 7b0d44e2…"
    assert not enabled({"REPROBISECT_DVC": "0"}) and enabled({}) and data_mode(tmp_path) is None


# --------------------------------------------------------------------------- data at a revision


def linked_into(path: Path, cache: Path, out) -> bool:
    """``path`` is the cache object itself (a hard link or a reflink is not a copy we can see:
    a hard link shares the inode) or a symlink into the cache."""
    obj = cache_file(cache, out)
    return path.is_symlink() and Path(os.path.realpath(path)) == obj.resolve() or os.path.samefile(path, obj)


def test_checkout_links_the_commits_data_and_leaves_the_user_alone(history: dict) -> None:
    repo, c, outs = history["repo"], history["commits"], history["outs"]
    before = snapshot(repo)
    cache = user_cache(repo)
    with WorktreePool(repo) as pool:
        with pool.checkout(c["c0"]) as wt:
            assert not (wt / "data" / "train.csv").exists()
            r = dvc_pull_at(wt, repo)
            assert r and r.status == "checked_out" and r.outs == ("data/train.csv",), r
            assert (wt / "data" / "train.csv").read_text() == "1 2 3 4\n"
            assert r.link in ("hardlink", "symlink", "reflink") and linked_into(wt / "data" / "train.csv", cache, outs["c0"])
            assert git(wt, "status", "--porcelain") == ""  # config.local and the data are ignored: still clean
            local = (wt / ".dvc" / "config.local").read_text()
            assert str(cache) in local and "copy" not in local
        with pool.checkout(c["c2"], links=("README.md",)) as wt:  # a reused worktree: the other revision's data
            assert dvc_pull_at(wt, repo, links=("README.md",)).status == "checked_out"
            assert (wt / "data" / "train.csv").read_text() == "1 2 3 5\n"
            linked = dvc_pull_at(wt, repo, links=("data",))  # a --link over the output: DVC leaves it alone
            assert linked.status == "none" and linked.skipped == ("data/train.csv",)
    assert snapshot(repo) == before


def test_missing_data_is_a_skip_not_cached_and_a_default_remote_pulls_it(history: dict, tmp_path: Path) -> None:
    repo, c, outs = history["repo"], history["commits"], history["outs"]
    cache = user_cache(repo)
    assert not cache_file(cache, outs["c4"]).exists()
    spec = ProbeSpec(key="c4", argv=("python", "check.py"), repo=str(repo), revision=c["c4"], steps=1, timeout=120)
    before = snapshot(repo)
    with LocalExecutor(jobs=1, cache_dir=tmp_path / "cache") as ex:
        res = ex.submit(spec).result()
        assert res.outcome.status == "skip" and data_skip(res.outcome.detail), res.outcome
        assert "data/train.csv (md5" in res.outcome.detail and "no DVC remote is configured" in res.outcome.detail
        # the search does not cache it: once the data is there, the same probe runs
        from reprobisect.workflows.runs import Prober, RunsConfig

        cfg = RunsConfig(good=c["c0"], bad=c["c4"], command=("python", "check.py"), options=ProbeOptions(steps=1))
        prober = Prober(cfg, repo, ".", ex, ResultCache(tmp_path / "results"), None)
        j = prober.judge(c["c4"])
        assert j.verdict == "skip" and "not in the DVC cache" in j.reason and prober.cache.get(prober.key(c["c4"])) is None
        assert snapshot(repo, worktrees=False) == snapshot(repo, worktrees=False) | {
            k: v for k, v in before.items() if k != "worktrees"}
        # the user makes the remote (a relative URL in the tracked config) the default one
        (repo / ".dvc" / "config.local").write_text("[core]\n    remote = storage\n")
        before = snapshot(repo, worktrees=False)
        res = ex.submit(spec).result()
    assert "data/train.csv" not in (res.outcome.detail or "") or not data_skip(res.outcome.detail), res.outcome
    assert res.outcome.status in ("no_steps", "ok"), res.outcome
    assert "9 9 9 9" in res.output_tail  # the probe read c4's data, pulled into the user's cache
    assert cache_file(cache, outs["c4"]).is_file()
    assert snapshot(repo, worktrees=False) == before


# --------------------------------------------------------------------------- bisect runs


@pytest.mark.slow
@pytest.mark.torch
def test_runs_names_the_data_commit_and_shows_the_data_version(history: dict, tmp_path: Path) -> None:
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    repo, c, outs = history["repo"], history["commits"], history["outs"]
    before = snapshot(repo)
    log = tmp_path / "log"
    log.mkdir()
    cfg = RunsConfig(repo=str(repo), cwd=str(repo), good=c["c0"], bad=c["c3"], command=("python", "train.py"),
                     options=ProbeOptions(jobs=2, quiet=True, steps=3), env={"DVC_PROBE_LOG": str(log)},
                     cache_dir=str(tmp_path / "cache"))
    r = find_first_bad(cfg)
    assert r and r.first_bad is not None and r.first_bad.hash == c["c2"], str(r)
    # the answer says the data version changed before it names a tensor
    text = str(r)
    assert "data: data/train.csv.dvc md5 " + outs["c0"].value[:8] + "… -> " + outs["c2"].value[:8] + "…" in text, text
    after = text.index("first divergence against")
    assert text.index("data: data/train.csv.dvc", after) < text.index("step 0", after), text
    env = (r.divergence or {}).get("environment") or []
    assert env and env[0]["path"] == "data.data/train.csv.dvc" and env[0]["a"] == outs["c0"].value
    assert env[0]["b"] == outs["c2"].value and env[0]["category"] == "numerics"
    # every probe read its own commit's data, linked from the user's cache (no copy)
    seen = [json.loads(p.read_text()) for p in log.glob("*.json")]
    assert len(seen) >= 3
    cache = user_cache(repo)
    by_text = {"1 2 3 4\n": outs["c0"], "1 2 3 5\n": outs["c2"]}
    for s in seen:
        obj = cache_file(cache, by_text[s["text"]])
        assert s["cwd"] != str(repo) and (
            (s["symlink"] and Path(s["real"]) == obj.resolve()) or s["ino"] == obj.stat().st_ino), s
    assert snapshot(repo) == before


def test_ray_worker_path_links_the_data_into_its_unpacked_tree(history: dict, tmp_path: Path) -> None:
    """The Ray worker's own code path (``_run_unpacked``: the commit's archive unpacked, no
    ``.git``, then ``run_in_dir``) without a cluster: the data is linked from the user's cache
    where the worker sees it (a local Ray instance, a shared file system); a node that does not
    see the user's repository and has no default remote skips, saying so."""
    from dataclasses import replace

    from reprobisect.executors.ray import _run_unpacked, archive_commit

    repo, c, outs = history["repo"], history["commits"], history["outs"]
    spec = ProbeSpec(key="ray-c2", argv=("python", "check.py"), repo=str(repo), revision=c["c2"], steps=1, timeout=120)
    tar = archive_commit(repo, c["c2"])
    res, commit = _run_unpacked(spec, spec, "archive", tar, tmp_path / "work", tmp_path / "trace", None)
    assert commit == c["c2"] and res.outcome.status in ("no_steps", "ok"), res.outcome
    assert "1 2 3 5" in res.output_tail and not (tmp_path / "work").exists()
    assert cache_file(user_cache(repo), outs["c2"]).is_file()  # the tree went, the cache object stays
    far = replace(spec, repo=str(tmp_path / "elsewhere" / "repo"))  # the controller's path, not on this node
    res, _ = _run_unpacked(far, far, "archive", tar, tmp_path / "work2", tmp_path / "trace2", None)
    assert res.outcome.status == "skip" and "not visible on" in res.outcome.detail, res.outcome
