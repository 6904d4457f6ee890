"""The git layer on real repositories in tmp dirs: revisions, ranges (with merges), worktrees
(the user's checkout never touched), submodules, the session lock across processes, archives.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from reprobisect.errors import ProbeError, UsageError
from reprobisect.vcs.archive import archive, extract
from reprobisect.vcs.git import (
    CommitInfo,
    WorktreePool,
    bisect_axis,
    checkout,
    commit_info,
    commit_parents,
    commit_range,
    default_cache_dir,
    is_ancestor,
    open_repo,
    resolve,
    session_lock,
)
from reprobisect.core.search import Bisection

PYTHON = sys.executable


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, files: dict[str, str], msg: str) -> str:
    for name, content in files.items():
        p = repo / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    git(repo, "add", *files)
    git(repo, "commit", "-q", "-m", msg)
    return git(repo, "rev-parse", "HEAD")


def make_linear(tmp: Path, n: int, name: str = "repo") -> tuple[Path, list[str]]:
    repo = tmp / name
    repo.mkdir()
    git(repo, "init", "-q")
    hashes = [commit(repo, {"value.txt": f"{i}\n", "src/lib.py": f"X = {i}\n"}, f"commit {i}") for i in range(n)]
    return repo, hashes


@pytest.fixture
def linear(tmp_path: Path) -> tuple[Path, list[str]]:
    return make_linear(tmp_path, 8)


def snapshot(repo: Path) -> dict[str, str]:
    """Everything about the user's checkout that a probe must never change."""
    return {
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "symbolic-ref", "-q", "HEAD"),
        "stash": git(repo, "stash", "list"),
        "staged": git(repo, "diff", "--cached"),
        "unstaged": git(repo, "diff"),
        "untracked": (repo / "notes.txt").read_text(),
        "tracked": (repo / "value.txt").read_text(),
    }


def dirty_up(repo: Path) -> None:
    """A user mid-work: a stash, a staged change, an unstaged change, an untracked file."""
    (repo / "value.txt").write_text("stashed\n")
    git(repo, "stash", "-q")
    (repo / "src/lib.py").write_text("X = 'staged'\n")
    git(repo, "add", "src/lib.py")
    (repo / "value.txt").write_text("unstaged edit\n")
    (repo / "notes.txt").write_text("my untracked notes\n")


# ----------------------------------------------------------------------------- revisions
def test_open_repo_from_subdir_and_linked_worktree(linear, tmp_path: Path) -> None:
    repo, _ = linear
    info = open_repo(repo / "src")
    assert info.root == repo.resolve() and info.subdir == "src"
    assert info.common_dir == (repo / ".git").resolve() and info.git_dir == info.common_dir
    assert open_repo(repo).subdir == "."
    assert open_repo(repo / "src" / "lib.py").subdir == "src"  # a file: its folder
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "linked"), "HEAD")
    linked = open_repo(tmp_path / "linked")
    assert linked.root == (tmp_path / "linked").resolve()
    assert linked.common_dir == info.common_dir and linked.git_dir != info.git_dir
    assert info.to_json()["subdir"] == "src"


def test_open_repo_errors(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError, match="not a git repository: .*plain"):
        open_repo(tmp_path / "plain")
    with pytest.raises(UsageError, match="does not exist"):
        open_repo(tmp_path / "missing")
    git(tmp_path, "init", "-q", "--bare", "bare.git")
    with pytest.raises(UsageError, match="bare repository"):
        open_repo(tmp_path / "bare.git")


def test_resolve(linear) -> None:
    repo, h = linear
    assert resolve(repo, "HEAD") == h[-1]
    assert resolve(repo, "HEAD~2") == h[-3]
    assert resolve(repo, h[3][:8]) == h[3]
    assert resolve(repo, "main") == h[-1]
    git(repo, "tag", "v1", h[2])
    assert resolve(open_repo(repo), "v1") == h[2]
    for bad in ("nope", "HEAD~99", "--all", ""):
        with pytest.raises(UsageError, match="unknown revision 'nope'|revision"):
            resolve(repo, bad)
    assert is_ancestor(repo, h[1], h[5]) and not is_ancestor(repo, h[5], h[1]) and is_ancestor(repo, h[2], h[2])


def test_commit_info(linear) -> None:
    repo, h = linear
    info = commit_info(repo, h[3])
    assert isinstance(info, CommitInfo)
    assert info.hash == h[3] and info.short and h[3].startswith(info.short)
    assert info.subject == "commit 3" and info.author == "Test Author" and info.email == "author@example.com"
    assert info.date[:4].isdigit() and "T" in info.date
    assert info.parents == (h[2],)
    assert info.files_changed == 2 and info.insertions == 2 and info.deletions == 2
    assert "value.txt" in info.diffstat and "2 files changed" in info.diffstat
    root = commit_info(repo, h[0])
    assert root.parents == () and root.files_changed == 2 and root.deletions == 0
    assert info.to_json()["parents"] == [h[2]] and "commit 3" in str(info)


# ----------------------------------------------------------------------------- ranges
def test_commit_range_linear(linear) -> None:
    repo, h = linear
    assert commit_range(repo, h[2], h[6]) == h[3:7]
    assert commit_range(repo, h[2], h[6], first_parent=True) == h[3:7]
    assert commit_range(repo, h[6], h[7]) == [h[7]]
    points, parents = bisect_axis(repo, h[0], "HEAD")
    assert points == h and parents is None


def test_commit_range_errors(linear) -> None:
    repo, h = linear
    with pytest.raises(UsageError, match="are the same commit"):
        commit_range(repo, h[3], h[3][:10])
    with pytest.raises(UsageError, match=r"--good .* is not an ancestor of --bad .* is older; swap --good and --bad"):
        commit_range(repo, h[5], h[2])
    with pytest.raises(UsageError, match="unknown revision 'nosuch'"):
        commit_range(repo, "nosuch", h[2])
    with pytest.raises(UsageError, match="unknown revision 'nosuch'"):
        commit_range(repo, h[1], "nosuch")
    git(repo, "checkout", "-q", "-b", "side", h[3])
    side = commit(repo, {"side.txt": "s\n"}, "side work")
    git(repo, "checkout", "-q", "main")
    with pytest.raises(UsageError, match=rf"diverged branches; .*merge base {h[3][:12]}"):
        commit_range(repo, side, h[6])


def make_merge_history(tmp: Path, culprit: str) -> tuple[Path, dict[str, str]]:
    """main: A B C M D; side from A: S1 S2, merged at M. ``culprit`` sets value=1 (2 with S2's own line)."""
    repo = tmp / "merges"
    repo.mkdir()
    git(repo, "init", "-q")
    c: dict[str, str] = {}

    def step(name: str, extra: dict[str, str] | None = None) -> None:
        files = {f"{name}.txt": name + "\n"}
        if name == culprit:
            files["value.txt"] = "1\n"
        files.update(extra or {})
        c[name] = commit(repo, files, f"commit {name}")

    step("A", {"value.txt": "0\n"})
    git(repo, "checkout", "-q", "-b", "side")
    step("S1")
    step("S2")
    git(repo, "checkout", "-q", "main")
    step("B")
    step("C")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    c["M"] = git(repo, "rev-parse", "HEAD")
    step("D")
    return repo, c


def value_at(repo: Path, commit_: str) -> str:
    return git(repo, "show", f"{commit_}:value.txt")


@pytest.mark.parametrize("culprit", ["S1", "S2", "B", "C", "D"])
def test_merge_history_graph_search_agrees_with_git_bisect(tmp_path: Path, culprit: str) -> None:
    repo, c = make_merge_history(tmp_path, culprit)
    name = {v: k for k, v in c.items()}
    rng = commit_range(repo, c["A"], c["D"])
    assert {name[x] for x in rng} == {"S1", "S2", "B", "C", "M", "D"}
    assert rng[-1] == c["D"] and rng.index(c["M"]) > max(rng.index(c[x]) for x in ("S1", "S2", "B", "C"))
    assert [name[x] for x in commit_range(repo, c["A"], c["D"], first_parent=True)] == ["B", "C", "M", "D"]
    parents = commit_parents(repo, rng)
    assert parents[c["M"]] == (c["C"], c["S2"]) and parents[c["S1"]] == (c["A"],)
    merge = commit_info(repo, c["M"])
    assert merge.parents == (c["C"], c["S2"]) and merge.subject == "merge side"
    # the diffstat of a merge is what it brought in against its first parent
    assert merge.files_changed == 2 + culprit.startswith("S") and "S1.txt" in merge.diffstat

    points, par = bisect_axis(repo, c["A"], c["D"])
    assert par is not None and points[0] == c["A"]
    b = Bisection(points, parents=par)
    while not b.done:
        for p in b.next(2):
            b.mark(p, "bad" if value_at(repo, p) == "1" else "good")
    ours = b.result().first_bad
    assert ours == c[culprit]

    # git bisect itself, in a throwaway clone (never in the user's checkout), agrees
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "bisect", "start", c["D"], c["A"])
    out = git(clone, "bisect", "run", "sh", "-c", "test \"$(cat value.txt)\" != 1")
    assert f"{c[culprit]} is the first bad commit" in out

    # --first-parent: a side-branch culprit comes in through the merge
    fp_points, fp_par = bisect_axis(repo, c["A"], c["D"], first_parent=True)
    assert fp_par is None
    lb = Bisection(fp_points)
    while not lb.done:
        for p in lb.next():
            lb.mark(p, "bad" if value_at(repo, p) == "1" else "good")
    assert lb.result().first_bad == (c["M"] if culprit.startswith("S") else c[culprit])


def test_first_parent_refuses_good_off_the_mainline(tmp_path: Path) -> None:
    repo, c = make_merge_history(tmp_path, "B")
    assert [x for x in commit_range(repo, c["S1"], c["D"])]  # fine without --first-parent
    with pytest.raises(UsageError, match="not on its first-parent .* drop --first-parent"):
        commit_range(repo, c["S1"], c["D"], first_parent=True)


# ----------------------------------------------------------------------------- worktrees
def registered(repo: Path) -> list[str]:
    out = git(repo, "worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


def test_checkout_is_detached_clean_and_removed(linear) -> None:
    repo, h = linear
    dirty_up(repo)
    before = snapshot(repo)
    with checkout(repo, h[2]) as wt:
        assert wt.is_dir() and wt != repo
        assert str(wt).startswith(str(default_cache_dir(repo)))
        assert git(wt, "rev-parse", "HEAD") == h[2]
        assert (wt / "value.txt").read_text() == "2\n"
        assert not (wt / "notes.txt").exists()  # nothing of the user's uncommitted work
        assert subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=wt).returncode != 0  # detached
        (wt / "value.txt").write_text("probe scribbles\n")
        assert len(registered(repo)) == 2
    assert not wt.exists()
    assert registered(repo) == [str(repo.resolve())]
    assert snapshot(repo) == before


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_checkout_cleans_up_on_exception_and_ctrl_c(linear, exc) -> None:
    repo, h = linear
    dirty_up(repo)
    before = snapshot(repo)
    with pytest.raises(exc):
        with WorktreePool(repo) as pool:
            with pool.checkout(h[1]) as wt:
                raise exc()
    assert not wt.exists() and registered(repo) == [str(repo.resolve())]
    assert list(default_cache_dir(repo).iterdir()) == []
    assert snapshot(repo) == before


def test_real_ctrl_c_in_another_process_cleans_up(linear) -> None:
    repo, h = linear
    dirty_up(repo)
    before = snapshot(repo)
    script = textwrap.dedent(
        f"""
        import time
        from reprobisect.vcs.git import WorktreePool
        with WorktreePool({str(repo)!r}) as pool:
            with pool.checkout({h[2]!r}) as wt:
                print(wt, flush=True)
                time.sleep(60)
        """
    )
    proc = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wt = Path(proc.stdout.readline().strip())
    assert wt.is_dir()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert not wt.exists() and registered(repo) == [str(repo.resolve())]
    assert snapshot(repo) == before


def test_pool_reuses_worktrees_and_cleans_between_probes(linear) -> None:
    repo, h = linear
    (repo / ".gitignore").write_text("*.pyc\nbuild/\n")
    commit(repo, {".gitignore": "*.pyc\nbuild/\n"}, "ignore")
    head = git(repo, "rev-parse", "HEAD")
    dirty_up(repo)
    before = snapshot(repo)
    with WorktreePool(repo) as pool:
        with pool.checkout(head) as wt1:
            (wt1 / "build").mkdir()
            (wt1 / "build" / "out.pyc").write_text("ignored artefact")
            (wt1 / "untracked.txt").write_text("x")
            (wt1 / "value.txt").write_text("edited")
        with pool.checkout(h[4]) as wt2:
            assert wt2 == wt1  # reused
            assert git(wt2, "rev-parse", "HEAD") == h[4]
            assert (wt2 / "value.txt").read_text() == "4\n"
            assert not (wt2 / "build").exists() and not (wt2 / "untracked.txt").exists()
            assert git(wt2, "status", "--porcelain", "--ignored") == ""
            with pool.checkout(h[5]) as wt3:  # a second concurrent probe gets its own tree
                assert wt3 != wt2 and (wt3 / "value.txt").read_text() == "5\n"
        assert len(pool.worktrees) == 2
    assert registered(repo) == [str(repo.resolve())]
    assert snapshot(repo) == before


def test_unwritable_cache_folder_is_one_line(linear, tmp_path: Path) -> None:
    repo, _ = linear
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(UsageError, match="cannot create the worktree cache folder .*a-file/wt.*--cache-dir"):
        WorktreePool(repo, cache_dir=blocker / "wt")


def test_pool_without_reuse_removes_each_tree(linear) -> None:
    repo, h = linear
    with WorktreePool(repo, reuse=False) as pool:
        with pool.checkout(h[1]) as wt:
            pass
        assert not wt.exists() and pool.worktrees == ()


def test_checkout_unknown_revision(linear) -> None:
    repo, _ = linear
    with pytest.raises(UsageError, match="unknown revision 'nope'"):
        with checkout(repo, "nope"):
            pass
    with WorktreePool(repo) as pool:
        with pytest.raises(UsageError, match=f"unknown revision '{'0' * 40}'"):
            with pool.checkout("0" * 40):  # a full hash skips the look-up: still one clear line
                pass
        assert pool.worktrees == ()
    assert registered(repo) == [str(repo.resolve())]
    assert list(default_cache_dir(repo).iterdir()) == []
    with pytest.raises(ProbeError, match="pool is closed"):
        with pool.checkout("HEAD"):
            pass


def test_stale_worktrees_of_a_killed_session_are_pruned(linear, tmp_path: Path) -> None:
    repo, h = linear
    script = textwrap.dedent(
        f"""
        import os, sys
        from reprobisect.vcs.git import WorktreePool
        pool = WorktreePool({str(repo)!r})
        with pool.checkout({h[3]!r}) as wt:
            print(wt, flush=True)
            os._exit(0)   # killed: no cleanup at all
        """
    )
    out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    stale = Path(out)
    assert stale.exists() and str(stale) in registered(repo)
    with WorktreePool(repo) as pool:
        assert not stale.exists() and not stale.parent.exists()
        assert str(stale) not in registered(repo)
        with pool.checkout(h[3]) as wt:
            assert (wt / "value.txt").read_text() == "3\n"


def test_a_live_sessions_worktrees_are_left_alone(linear) -> None:
    repo, h = linear
    with WorktreePool(repo) as one:
        with one.checkout(h[1]) as wt:
            with WorktreePool(repo) as two:  # e.g. another process, same pid here: still alive
                with two.checkout(h[2]) as wt2:
                    assert wt.exists() and wt2 != wt
            assert wt.exists() and (wt / "value.txt").read_text() == "1\n"


def test_worktree_from_a_linked_worktree_session(linear, tmp_path: Path) -> None:
    repo, h = linear
    git(repo, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "linked"), h[5])
    with checkout(tmp_path / "linked", h[2]) as wt:
        assert (wt / "value.txt").read_text() == "2\n"
        assert str(wt).startswith(str((repo / ".git").resolve()))
    assert git(tmp_path / "linked", "rev-parse", "HEAD") == h[5]


# ----------------------------------------------------------------------------- submodules
@pytest.fixture
def with_submodule(tmp_path: Path, monkeypatch) -> tuple[Path, list[str], list[str]]:
    # local file:// submodules are refused by default since git 2.38.1; allow them for tests
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.file.allow")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "always")
    sub = tmp_path / "sub"
    sub.mkdir()
    git(sub, "init", "-q")
    s = [commit(sub, {"weights.txt": f"w{i}\n"}, f"sub {i}") for i in range(2)]
    repo = tmp_path / "main"
    repo.mkdir()
    git(repo, "init", "-q")
    m = [commit(repo, {"value.txt": "0\n"}, "no submodule yet")]
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "vendor/sub")
    git(repo, "-C", "vendor/sub", "checkout", "-q", s[0])
    git(repo, "add", "vendor/sub")
    m.append(commit(repo, {"value.txt": "1\n"}, "add submodule at s0"))
    git(repo, "-C", "vendor/sub", "checkout", "-q", s[1])
    git(repo, "add", "vendor/sub")
    m.append(commit(repo, {"value.txt": "2\n"}, "bump submodule to s1"))
    return repo, m, s


def test_submodules_initialised_in_worktrees(with_submodule) -> None:
    repo, m, s = with_submodule
    with WorktreePool(repo) as pool:
        with pool.checkout(m[1]) as wt:
            assert (wt / "vendor/sub/weights.txt").read_text() == "w0\n"
            (wt / "vendor/sub/scratch").write_text("junk")
        with pool.checkout(m[2]) as wt2:  # reused: submodule moved, scratch gone
            assert wt2 == wt
            assert (wt2 / "vendor/sub/weights.txt").read_text() == "w1\n"
            assert not (wt2 / "vendor/sub/scratch").exists()
        with pool.checkout(m[0]) as wt3:  # before the submodule existed: no trace of it
            assert wt3 == wt and (wt3 / "value.txt").read_text() == "0\n"
            assert not (wt3 / "vendor").exists() and not (wt3 / ".gitmodules").exists()
            assert git(wt3, "status", "--porcelain", "--ignored") == ""
        with pool.checkout(m[1]) as wt4:  # and back again
            assert (wt4 / "vendor/sub/weights.txt").read_text() == "w0\n"
    assert registered(repo) == [str(repo.resolve())]
    with WorktreePool(repo, submodules=False) as pool:
        with pool.checkout(m[2]) as wt:
            assert not (wt / "vendor/sub/weights.txt").exists()


def test_archive_includes_submodules(with_submodule, tmp_path: Path) -> None:
    repo, m, s = with_submodule
    data = archive(repo, m[2])
    out = extract(data, tmp_path / "x")
    assert (out / "value.txt").read_text() == "2\n"
    assert (out / "vendor/sub/weights.txt").read_text() == "w1\n"
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.pax_headers.get("comment") == m[2]  # the commit id survives the rebuild
    plain = extract(archive(repo, m[2], submodules=False), tmp_path / "y")
    assert (plain / "vendor/sub").is_dir() and not (plain / "vendor/sub/weights.txt").exists()


def test_archive_names_a_missing_submodule(with_submodule, tmp_path: Path) -> None:
    repo, m, s = with_submodule
    clone = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(repo), str(clone))  # submodule not initialised
    with pytest.raises(ProbeError, match="submodule vendor/sub at .* is not available.*submodule update --init"):
        archive(clone, m[2])


# ----------------------------------------------------------------------------- archives
def test_archive_round_trip(linear, tmp_path: Path) -> None:
    repo, h = linear
    os.symlink("/mnt/datasets/imagenet", repo / "data")  # absolute links survive, as in a checkout
    os.symlink("src/lib.py", repo / "lib_link.py")
    git(repo, "add", "data", "lib_link.py")
    git(repo, "commit", "-q", "-m", "links")
    linked = git(repo, "rev-parse", "HEAD")
    dirty_up(repo)
    before = snapshot(repo)
    data = archive(repo, linked)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.pax_headers.get("comment") == linked
    out = extract(data, tmp_path / "links")
    assert os.readlink(out / "data") == "/mnt/datasets/imagenet"
    assert (out / "lib_link.py").read_text() == "X = 7\n"
    out = extract(archive(repo, h[3]), tmp_path / "unpacked")
    assert (out / "value.txt").read_text() == "3\n" and (out / "src/lib.py").read_text() == "X = 3\n"
    assert not (out / "notes.txt").exists() and not (out / ".git").exists()
    assert snapshot(repo) == before


def test_extract_refuses_paths_outside(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ProbeError, match="outside"):
        extract(buf.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


# ----------------------------------------------------------------------------- session lock
HOLDER = """
import sys, time
from reprobisect.vcs.git import session_lock
with session_lock(sys.argv[1], what="bisect runs (test holder)"):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([PYTHON, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_session_lock_excludes_a_second_process(linear, tmp_path: Path) -> None:
    repo, h = linear
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "linked"), h[1])
    holder = hold_lock(repo, 60)
    try:
        messages: list[str] = []
        t0 = time.monotonic()
        # from a linked worktree of the same repository: same lock (common git dir)
        with pytest.raises(UsageError, match=rf"another reprobisect session holds the lock .*pid {holder.pid}.*test holder"):
            with session_lock(tmp_path / "linked", timeout=0.5, on_wait=messages.append):
                pass
        assert time.monotonic() - t0 >= 0.4
        assert len(messages) == 1 and "waiting for another reprobisect session" in messages[0]
        with pytest.raises(UsageError, match="longer lock timeout"):
            with session_lock(repo, timeout=0):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed session releases its lock
        holder.wait()
    with session_lock(repo, timeout=5) as path:
        assert path.parent == (repo / ".git" / "reprobisect").resolve()


def test_session_lock_waits_for_the_holder_to_finish(linear) -> None:
    repo, _ = linear
    holder = hold_lock(repo, 0.5)
    messages: list[str] = []
    with session_lock(repo, timeout=30, on_wait=messages.append):
        assert holder.poll() is not None or holder.wait(5) == 0
    holder.wait()
    assert messages and "pid" in messages[0]


def test_session_locks_of_two_repositories_are_independent(tmp_path: Path) -> None:
    a, _ = make_linear(tmp_path, 2, "a")
    b, _ = make_linear(tmp_path, 2, "b")
    with session_lock(a, timeout=0):
        with session_lock(b, timeout=0):
            pass


# ----------------------------------------------------------------------------- GitPython with care
def test_inherited_git_env_never_reaches_the_users_checkout(linear, tmp_path: Path, monkeypatch) -> None:
    """A hook or alias sets GIT_DIR/GIT_WORK_TREE/GIT_INDEX_FILE to the user's checkout: no
    command of the git layer may act on it (a worktree add would write the user's index)."""
    repo, h = linear
    dirty_up(repo)
    before = snapshot(repo)
    decoy, dh = make_linear(tmp_path, 2, "decoy")
    with monkeypatch.context() as m:
        m.setenv("GIT_DIR", str(repo / ".git"))
        m.setenv("GIT_WORK_TREE", str(repo))
        m.setenv("GIT_INDEX_FILE", str(repo / ".git" / "index"))
        assert resolve(decoy, "HEAD") == dh[-1] and open_repo(decoy).root == decoy.resolve()
        assert commit_info(repo, h[3]).parents == (h[2],)
        assert bisect_axis(repo, h[0], h[4])[0] == h[:5]
        with WorktreePool(repo) as pool:
            for c in (h[1], h[2]):  # a new worktree, then the reused one
                with pool.checkout(c) as wt:
                    assert (wt / "value.txt").read_text() == f"{h.index(c)}\n"
        out = extract(archive(repo, h[2]), tmp_path / "x")
        assert (out / "value.txt").read_text() == "2\n"
    assert snapshot(repo) == before
    assert registered(repo) == [str(repo.resolve())]


def _git_children() -> list[str]:
    """Command lines of this process's child processes that run git."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and any(b"git" in a for a in argv[:3]):
            out.append(" ".join(a.decode(errors="replace") for a in argv))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_no_git_process_outlives_a_call(with_submodule, tmp_path: Path) -> None:
    """GitPython keeps cat-file processes per Repo: every call closes what it opened."""
    repo, m, s = with_submodule
    assert _git_children() == []
    keep = [commit_info(repo, m[2]), bisect_axis(repo, m[0], m[2]), commit_parents(repo, m[1:]),
            is_ancestor(repo, m[0], m[2]), archive(repo, m[2]), open_repo(repo)]
    with WorktreePool(repo) as pool:
        with pool.checkout(m[2]):
            pass
    assert keep and _git_children() == []


def test_a_vanished_worktree_never_turns_into_the_users_checkout(linear, monkeypatch) -> None:
    """GitPython runs a command whose folder is gone in the current directory: a reused
    worktree deleted behind the pool's back must not get its checkout/clean run in the
    user's checkout (the cwd of a `bisect runs`)."""
    repo, h = linear
    dirty_up(repo)
    before = snapshot(repo)
    monkeypatch.chdir(repo)
    with WorktreePool(repo) as pool:
        with pool.checkout(h[1]) as wt:
            pass
        shutil.rmtree(wt)
        with pytest.raises(UsageError, match=f"directory {wt} does not exist"):
            with pool.checkout(h[2]):
                pass
    assert snapshot(repo) == before


def test_missing_git_is_one_line(linear, tmp_path: Path, monkeypatch) -> None:
    repo, h = linear
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UsageError, match="git is not installed or not on PATH"):
        resolve(repo, "HEAD")
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))  # the path through env -u
    with pytest.raises(UsageError, match="git is not installed or not on PATH"):
        resolve(repo, "HEAD")
    # GitPython refuses to import without a git executable: the layer still imports, and says so at use
    code = ("import reprobisect.vcs.git as g\ntry:\n    g.resolve('.', 'HEAD')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_PYTHON_REFRESH")}
    env["PATH"] = str(tmp_path / "empty")
    out = subprocess.run([PYTHON, "-c", code], cwd=repo, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "UsageError git is not installed or not on PATH; install git to search history", out.stderr


def raw(cwd: Path, *args: str) -> str:
    """git's stdout without its surrounding newlines (``git`` above strips spaces too)."""
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip("\n")


def test_commit_info_matches_git_show(tmp_path: Path, monkeypatch) -> None:
    """The metadata read through git.Repo is what ``git show``'s formats print: a subject
    whose first paragraph spans lines, a non-UTC author date, a rename, a merge."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    monkeypatch.setenv("GIT_AUTHOR_DATE", "2024-03-04T05:06:07+05:30")
    commit(repo, {"a.txt": "1\n2\n3\n4\n5\n", "b.txt": "b\n"}, "first")
    git(repo, "mv", "a.txt", "c.txt")
    (repo / "b.txt").write_text("b\nmore\n")
    git(repo, "add", "b.txt")
    monkeypatch.setenv("GIT_AUTHOR_DATE", "2024-03-04T05:06:07-08:00")
    git(repo, "commit", "-q", "-m", "rename a  \nand grow b\n\nthe body\nsays more")
    git(repo, "checkout", "-q", "-b", "side", "HEAD~1")
    commit(repo, {"s.txt": "s\n"}, "side")
    git(repo, "checkout", "-q", "main")
    monkeypatch.setenv("GIT_AUTHOR_DATE", "2024-03-04T05:06:07+00:00")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    for rev in ("HEAD", "HEAD^1", "HEAD^2", "HEAD~2"):
        info = commit_info(repo, rev)
        fields = raw(repo, "show", "-s", "--format=%H%x1f%h%x1f%s%x1f%an%x1f%ae%x1f%aI%x1f%P", rev).split("\x1f")
        assert [info.hash, info.short, info.subject, info.author, info.email, info.date, " ".join(info.parents)] == fields
        show = ["show", "--format=", "--first-parent", "--root", "-m", rev]
        assert info.diffstat == raw(repo, *show[:1], "--stat=200", *show[1:])
        num = [line.split("\t") for line in git(repo, *show[:1], "--numstat", *show[1:]).splitlines()]
        assert info.files_changed == len(num)
        assert (info.insertions, info.deletions) == (sum(int(n[0]) for n in num), sum(int(n[1]) for n in num))
    renamed = commit_info(repo, "HEAD^1")
    assert renamed.subject == "rename a and grow b" and renamed.files_changed == 2 and "=>" in renamed.diffstat


def test_a_repository_path_with_a_dollar_and_a_tilde(tmp_path: Path) -> None:
    """Paths are used as given (GitPython expands $VARS and ~ in a path unless told not to)."""
    repo, h = make_linear(tmp_path, 3, "my$HOME ~dir")
    assert open_repo(repo).root == repo.resolve() and resolve(repo, "HEAD") == h[-1]
    assert commit_info(repo, h[1]).parents == (h[0],) and bisect_axis(repo, h[0], h[2])[0] == h
    with WorktreePool(repo) as pool:
        with pool.checkout(h[1]) as wt:
            assert (wt / "value.txt").read_text() == "1\n"
