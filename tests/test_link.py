"""``--link PATH``: data git does not track (ignored datasets, untracked configs) reaches every
probe's worktree as a symlink, and the user's copy survives every way a worktree goes away.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprobisect.errors import ProbeError, UsageError
from reprobisect.vcs.git import WorktreePool, check_links, checkout, default_cache_dir
from reprobisect.core.hints import missing_link_hint
from reprobisect.cli.options import build_options
from reprobisect.core.options import ProbeOptions


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(tmp: Path) -> tuple[Path, str]:
    """A repository whose data/ is ignored (but data/README.md is tracked) and whose
    local.yaml is untracked; returns (root, HEAD)."""
    repo = tmp / "repo"
    (repo / "data").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("data/*\n!data/README.md\ncache/\n")
    (repo / "data" / "README.md").write_text("tracked readme\n")
    (repo / "train.py").write_text("print('hi')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "init")
    (repo / "data" / "train.csv").write_text("1,2,3\n")
    (repo / "data" / "raw").mkdir()
    (repo / "data" / "raw" / "big.bin").write_bytes(b"\x00" * 1000)
    (repo / "cache").mkdir()
    (repo / "cache" / "tok.json").write_text("{}")
    (repo / "local.yaml").write_text("lr: 0.1\n")
    return repo, git(repo, "rev-parse", "HEAD")


def user_data(repo: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(repo.rglob("*")):
        if ".git" in p.relative_to(repo).parts or not p.is_file():
            continue
        out[p.relative_to(repo).as_posix()] = p.read_bytes()
    return out


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    return make_repo(tmp_path)


def test_check_links_normalises_and_refuses_in_one_line(repo) -> None:
    root, _ = repo
    assert check_links(root, ["data", "./local.yaml", "data/raw", str(root / "cache")]) == ("cache", "data", "local.yaml")
    for bad, msg in [("nope", "does not exist"), ("../x", "not inside the repository"), ("/etc", "not inside"),
                     (".", "root itself"), (".git/config", "inside .git"), ("", "relative to the repository root")]:
        with pytest.raises(UsageError, match=msg) as e:
            check_links(root, [bad])
        assert "\n" not in str(e.value)


def test_linked_paths_appear_as_symlinks_and_survive_worktree_removal(repo) -> None:
    root, head = repo
    before = user_data(root)
    status = git(root, "status", "--porcelain", "--ignored")
    links = check_links(root, ["data", "cache", "local.yaml"])
    with WorktreePool(root, reuse=False) as pool:
        with pool.checkout(head, links=links) as wt:
            # the commit's own file wins; what it lacks is linked inside the tracked folder
            assert not (wt / "data").is_symlink() and (wt / "data" / "README.md").read_text() == "tracked readme\n"
            assert (wt / "data" / "train.csv").is_symlink() and (wt / "data" / "train.csv").read_text() == "1,2,3\n"
            assert (wt / "data" / "raw").is_symlink() and (wt / "data" / "raw" / "big.bin").stat().st_size == 1000
            assert (wt / "cache").is_symlink() and (wt / "local.yaml").read_text() == "lr: 0.1\n"
        assert not wt.exists()
    assert user_data(root) == before
    assert git(root, "status", "--porcelain", "--ignored") == status


@pytest.mark.parametrize("how", ["reuse", "exception", "git-remove", "rmtree-fallback", "stale-pool"])
def test_user_data_survives_every_cleanup_path(repo, how) -> None:
    """Removing a worktree unlinks; nothing deletes through a link, whichever path removes it."""
    root, head = repo
    before = user_data(root)
    links = check_links(root, ["data/raw", "cache", "local.yaml"])
    if how == "reuse":
        with WorktreePool(root, reuse=True) as pool:
            with pool.checkout(head, links=links) as wt:
                (wt / "scratch.txt").write_text("probe output")
            assert not (wt / "cache").exists() and not os.path.lexists(wt / "local.yaml")
            with pool.checkout(head) as wt2:  # reused, cleaned with git clean -ffdx
                assert wt2 == wt and not os.path.lexists(wt2 / "cache")
    elif how == "exception":
        with pytest.raises(KeyboardInterrupt):
            with WorktreePool(root) as pool:
                with pool.checkout(head, links=links):
                    raise KeyboardInterrupt
    elif how == "git-remove":  # a link left behind (a crash before unlinking): git must not follow it
        with checkout(root, head) as wt:
            os.symlink(root / "cache", wt / "cache")
            os.symlink(root / "data" / "raw", wt / "data" / "raw")
            git(wt, "clean", "-ffdxq")
            assert not os.path.lexists(wt / "cache")
            os.symlink(root / "cache", wt / "cache")
        assert not wt.exists()
    elif how == "rmtree-fallback":  # what _remove does when `git worktree remove` fails half-way
        import shutil

        with WorktreePool(root) as pool:
            with pool.checkout(head, links=links) as wt:
                made = pool._links.pop(wt)  # forget them: the fallback must still not follow a link
                assert made
                shutil.rmtree(wt)
                assert not wt.exists()
    else:  # a killed session's folder, removed by the next pool
        script = textwrap.dedent(f"""
            import os
            from reprobisect.vcs.git import WorktreePool
            pool = WorktreePool({str(root)!r})
            cm = pool.checkout({head!r}, links={list(links)!r})
            print(cm.__enter__(), flush=True)
            os._exit(0)
        """)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        wt = Path(out.stdout.strip())
        assert (wt / "cache").is_symlink()
        WorktreePool(root).close()  # prune_stale removes the dead session's folder
        assert not wt.exists()
    assert user_data(root) == before


def test_link_paths_from_a_config_file_and_the_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "probe.yaml"
    cfg.write_text("steps: 2\nlink: [data, local.yaml]\n")
    assert build_options({}, cfg).link == ("data", "local.yaml")
    assert build_options({"link": ("cache",)}, cfg).link == ("cache",)  # the flag wins, as for every option
    cfg.write_text("link: 3\n")
    with pytest.raises(UsageError, match="'link' has a bad value"):
        build_options({}, cfg)
    assert ProbeOptions().link == ()


def test_missing_file_hint_names_the_link(repo, tmp_path: Path) -> None:
    root, head = repo
    with checkout(root, head) as wt:
        err = "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'"
        hint = missing_link_hint(err, wt, root)
        assert hint is not None and "--link data/train.csv" in hint  # data/ is tracked: link the file
        err = f"FileNotFoundError: [Errno 2] No such file or directory: '{wt}/cache/tok.json'"
        assert "--link cache" in missing_link_hint(err, wt, root)
        # run from a subfolder: the path is relative to it
        (wt / "sub").mkdir()
        assert "--link local.yaml" in missing_link_hint("No such file or directory: '../local.yaml'", wt, root, "sub")
        # a file the user's checkout lacks too, or one the worktree has: no hint
        assert missing_link_hint("No such file or directory: 'nope.txt'", wt, root) is None
        assert missing_link_hint("No such file or directory: 'train.py'", wt, root) is None
        assert missing_link_hint("ValueError: 'data/train.csv' is odd", wt, root) is None
    # a file git tracks in the user's checkout (a newer commit added it) is code, not data: no hint
    (root / "new.py").write_text("x = 1\n")
    git(root, "add", "new.py")
    git(root, "commit", "-q", "-m", "new")
    with checkout(root, head) as wt:
        assert missing_link_hint("No such file or directory: 'new.py'", wt, root) is None
        assert "--link local.yaml" in missing_link_hint("No such file or directory: 'local.yaml'", wt, root)


# --------------------------------------------------------------------------- bisect runs, end to end

TRAIN = """\
import torch
scale = float(open("data/scale.txt").read())
torch.manual_seed(0)
m = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr={lr})
x = torch.ones(8, 4) * scale
for _ in range(3):
    opt.zero_grad()
    m(x).pow(2).mean().backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def data_repo(tmp_path_factory) -> tuple[Path, list[str]]:
    repo = tmp_path_factory.mktemp("link") / "proj"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "T")
    (repo / ".gitignore").write_text("data/\n")
    hashes = []
    for i, lr in enumerate(["0.1", "0.1", "0.2"]):
        (repo / "train.py").write_text(TRAIN.format(lr=lr) + f"# {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i} lr {lr}")
        hashes.append(git(repo, "rev-parse", "HEAD"))
    (repo / "data").mkdir()
    (repo / "data" / "scale.txt").write_text("0.5\n")
    return repo, hashes


@pytest.mark.torch
@pytest.mark.slow
def test_runs_without_link_names_the_missing_data_and_with_link_finds_the_culprit(data_repo) -> None:
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    repo, h = data_repo
    before = user_data(repo)
    cfg = dict(repo=str(repo), cwd=str(repo), good=h[0], bad=h[2], command=("python", "train.py"))
    with pytest.raises(ProbeError) as e:
        find_first_bad(RunsConfig(**cfg, options=ProbeOptions(quiet=True)))
    msg = str(e.value)
    assert "data/scale.txt" in msg and "--link data" in msg, msg
    assert "pick a good revision" not in msg
    result = find_first_bad(RunsConfig(**cfg, options=ProbeOptions(quiet=True, jobs=2, link=("data",))))
    assert result.first_bad is not None and result.first_bad.hash == h[2], str(result)
    assert user_data(repo) == before
    assert list(default_cache_dir(repo).iterdir()) == []


@pytest.mark.torch
@pytest.mark.slow
def test_cli_link_flag_and_refusal(data_repo) -> None:
    repo, h = data_repo
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "reprobisect", "runs", "--good", h[0], "--bad", h[2], "--link", "nope",
                        "-q", "--", "python", "train.py"], cwd=repo, capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "--link nope" in r.stderr and "does not exist" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
