"""The git layer: revisions, commit ranges, throwaway worktrees, a session lock, archives.

Everything here runs ``git`` as a subprocess (faster to start than gitpython's object
model, and what ``git bisect`` itself would do) and imports no ML framework.

DVC data at a revision: ``dvc_pull_at(worktree, repo)`` points the worktree's DVC at the
user's cache (``.dvc/config.local``, untracked) and runs ``dvc checkout``, then ``dvc
pull`` for what the cache lacks; best-effort, a failure is reported, not raised.

The user's checkout is never touched: no command here writes to the main working tree,
its index, HEAD, untracked files or stashes. Probes run in *detached linked worktrees*
(``git worktree add --detach``) under a cache folder, by default
``<common git dir>/reprobisect/worktrees`` — inside the repository's own git directory,
so it is on the same file system (worktree creation is a cheap local checkout), it is
shared by every linked worktree of the repository, and it disappears with the
repository. Each ``WorktreePool`` owns a subfolder named after its process id; folders
of pools whose process is gone (a killed session) are removed and ``git worktree prune``
runs when a pool starts.

Histories with merges: ``commit_range`` lists the commits between good and bad on the
ancestry path (``git rev-list --ancestry-path --topo-order --reverse``), oldest first,
and ``commit_parents`` gives their parents. Bisecting that list as a plain line is what
many tools do, and it can go wrong: with a culprit on a side branch, commits of the
other branch listed after it still test good, so a line search either names the merge
that brought the change in or meets a contradiction. So drivers pass the parents to
``search.Bisection(points, parents=...)``, which searches the graph as ``git bisect``
does (a bad commit keeps only its ancestors as candidates, a good one removes its
ancestors) and names a bad commit whose parents are all good. With
``first_parent=True`` only the mainline is listed, a plain line (the answer is then a
merge commit when the change came in through one).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from reprobisect.errors import ProbeError, UsageError

__all__ = [
    "RepoInfo",
    "CommitInfo",
    "open_repo",
    "resolve",
    "is_ancestor",
    "commit_info",
    "commit_range",
    "commit_parents",
    "bisect_axis",
    "has_submodules",
    "default_cache_dir",
    "WorktreePool",
    "checkout",
    "check_links",
    "make_links",
    "remove_links",
    "session_lock",
    "prune_stale_worktrees",
    "archive",
    "extract",
    "DvcResult",
    "dvc_pull_at",
]

@dataclass(frozen=True)
class RepoInfo:
    """Where a repository lives, as seen from one directory inside it."""

    root: Path
    """Top-level directory of the working tree that holds ``cwd``."""
    common_dir: Path
    """The git directory shared by every worktree of the repository (``.git`` of the main one)."""
    git_dir: Path
    """This worktree's own git directory (equals ``common_dir`` in the main worktree)."""
    subdir: str
    """``cwd`` relative to ``root`` (``"."`` at the top); commands run from the same place in a probe."""

    def to_json(self) -> dict[str, Any]:
        return {k: str(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class CommitInfo:
    """One commit as the answer names it."""

    hash: str
    short: str
    subject: str
    author: str
    email: str
    date: str
    """Author date, ISO 8601."""
    parents: tuple[str, ...]
    files_changed: int
    insertions: int
    deletions: int
    diffstat: str
    """``git show --stat`` body: one line per file and the summary line."""

    def __str__(self) -> str:
        return f"{self.short} {self.subject} ({self.author}, {self.date})"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["parents"] = list(self.parents)
        return d


# --------------------------------------------------------------------------- plumbing
def _git(args: list[str], cwd: str | os.PathLike[str], *, check: bool = True, input: bytes | None = None, text: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)  # never let an inherited variable point git at the user's checkout
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, input=input, capture_output=True, text=text if input is None else False, env=env
        )
    except FileNotFoundError as e:
        if e.filename == "git":
            raise UsageError("git is not installed or not on PATH; install git to search history") from None
        raise UsageError(f"directory {cwd} does not exist") from None
    if check and proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise ProbeError(f"git {' '.join(args)} failed in {cwd}: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}")
    return proc


def _root(repo: "RepoInfo | str | os.PathLike[str]") -> Path:
    return repo.root if isinstance(repo, RepoInfo) else Path(repo)


def _info(repo: "RepoInfo | str | os.PathLike[str]") -> RepoInfo:
    return repo if isinstance(repo, RepoInfo) else open_repo(repo)


# --------------------------------------------------------------------------- revisions
def open_repo(path: str | os.PathLike[str] = ".") -> RepoInfo:
    """Find the repository that holds ``path`` (a directory, usually the user's cwd).

    Raises ``UsageError`` for a path that does not exist, is not inside a git repository,
    or is inside a bare repository (no working tree to take the command's place from).
    """
    p = Path(path).resolve()
    if not p.exists():
        raise UsageError(f"directory {path} does not exist")
    if p.is_file():
        p = p.parent
    proc = _git(["rev-parse", "--is-bare-repository", "--is-inside-git-dir", "--absolute-git-dir", "--git-common-dir"], p, check=False)
    if proc.returncode != 0:
        raise UsageError(f"not a git repository: {p} (run from inside a repository or pass its path)")
    lines = proc.stdout.splitlines()
    if len(lines) < 4 or "true" in lines[:2]:
        raise UsageError(f"{p} is a bare repository or inside a git directory: run from a working tree of it")
    top = _git(["rev-parse", "--show-toplevel"], p, check=False)
    if top.returncode != 0 or not top.stdout.strip():
        raise UsageError(f"{p} has no working tree: run from a working tree of the repository")
    lines = [lines[0], lines[2], lines[3], top.stdout.strip()]
    git_dir = Path(lines[1]).resolve()
    common = Path(lines[2])
    common = (common if common.is_absolute() else p / common).resolve()
    root = Path(lines[3]).resolve()
    sub = os.path.relpath(p, root)
    return RepoInfo(root=root, common_dir=common, git_dir=git_dir, subdir=sub)


def resolve(repo: "RepoInfo | str | os.PathLike[str]", rev: str) -> str:
    """The full hash of commit ``rev`` (a branch, tag, short hash, ``HEAD~3``...).

    Raises ``UsageError`` naming ``rev`` when git does not know it as a commit.
    """
    if not rev or rev.startswith("-"):
        raise UsageError(f"'{rev}' is not a revision")
    proc = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], _root(repo), check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise UsageError(f"unknown revision '{rev}' in {_root(repo)} (check the name, or fetch it first)")
    return proc.stdout.strip()


def is_ancestor(repo: "RepoInfo | str | os.PathLike[str]", ancestor: str, descendant: str) -> bool:
    """True when ``ancestor`` is reachable from ``descendant`` (a commit is its own ancestor)."""
    a, d = resolve(repo, ancestor), resolve(repo, descendant)
    proc = _git(["merge-base", "--is-ancestor", a, d], _root(repo), check=False)
    if proc.returncode not in (0, 1):
        raise ProbeError(f"git merge-base --is-ancestor {a} {d} failed: {proc.stderr.strip()}")
    return proc.returncode == 0


def commit_info(repo: "RepoInfo | str | os.PathLike[str]", rev: str) -> CommitInfo:
    """Hash, subject, author, date, parents and diffstat of one commit."""
    h = resolve(repo, rev)
    sep = "\x1f"
    fmt = sep.join(["%H", "%h", "%s", "%an", "%ae", "%aI", "%P"])
    head = _git(["show", "-s", f"--format={fmt}", h], _root(repo)).stdout.rstrip("\n").split(sep)
    # --first-parent diff for merges (what the merge brought in); --root for the first commit
    stat = _git(["show", "--stat=200", "--format=", "--first-parent", "--root", "-m", h], _root(repo)).stdout
    num = _git(["show", "--numstat", "--format=", "--first-parent", "--root", "-m", h], _root(repo)).stdout
    files = ins = dels = 0
    for line in num.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            files += 1
            ins += int(parts[0]) if parts[0].isdigit() else 0
            dels += int(parts[1]) if parts[1].isdigit() else 0
    return CommitInfo(
        hash=head[0], short=head[1], subject=head[2], author=head[3], email=head[4], date=head[5],
        parents=tuple(head[6].split()) if len(head) > 6 and head[6] else (),
        files_changed=files, insertions=ins, deletions=dels, diffstat=stat.strip("\n"),
    )


def commit_range(repo: "RepoInfo | str | os.PathLike[str]", good: str, bad: str, *, first_parent: bool = False) -> list[str]:
    """Commits after ``good`` up to and including ``bad``, oldest first (full hashes).

    Without ``first_parent`` these are the commits on the ancestry path from ``good`` to
    ``bad`` in topological order (``git rev-list --ancestry-path --topo-order --reverse
    good..bad``): every commit that descends from ``good`` and leads to ``bad``. With it,
    only ``bad``'s first-parent chain down to ``good``. Prepend ``good`` to get a search
    axis whose first point is the known-good one.

    Raises ``UsageError`` for unknown revisions, ``good == bad``, ``good`` not an ancestor
    of ``bad`` (or not on its first-parent chain), each message saying what to change.
    """
    g, b = resolve(repo, good), resolve(repo, bad)
    if g == b:
        raise UsageError(f"--good {good} and --bad {bad} are the same commit {g[:12]}: nothing to search")
    if not is_ancestor(repo, g, b):
        if is_ancestor(repo, b, g):
            raise UsageError(
                f"--good {good} is not an ancestor of --bad {bad}: {bad} is older; swap --good and --bad "
                "(or use other terms to hunt the commit that fixed it)"
            )
        raise UsageError(
            f"--good {good} is not an ancestor of --bad {bad}: they are on diverged branches; pick a --good "
            f"on {bad}'s history (e.g. their merge base {_merge_base(repo, g, b)[:12]})"
        )
    if first_parent:
        out = _git(["rev-list", "--first-parent", f"{g}..{b}"], _root(repo)).stdout.split()
        out.reverse()
        # the chain must reach good itself: rev-list stops at good's ancestors, so check
        # that good is the first parent of the oldest listed commit
        oldest = out[0]
        parent = _git(["rev-parse", f"{oldest}^1"], _root(repo), check=False).stdout.strip()
        if parent != g:
            raise UsageError(
                f"--good {good} is an ancestor of --bad {bad} but not on its first-parent (mainline) history; "
                "drop --first-parent, or pick a --good on the mainline"
            )
        return out
    out = _git(["rev-list", "--ancestry-path", "--topo-order", "--reverse", f"{g}..{b}"], _root(repo)).stdout.split()
    return out


def commit_parents(repo: "RepoInfo | str | os.PathLike[str]", commits: list[str]) -> dict[str, tuple[str, ...]]:
    """Parents (full hashes) of each of ``commits``, for ``search.Bisection(parents=...)``."""
    if not commits:
        return {}
    proc = _git(["rev-list", "--no-walk=unsorted", "--parents", "--stdin"], _root(repo), input=("\n".join(commits) + "\n").encode())
    out: dict[str, tuple[str, ...]] = {}
    for line in proc.stdout.decode().splitlines():
        parts = line.split()
        if parts:
            out[parts[0]] = tuple(parts[1:])
    return out


def bisect_axis(
    repo: "RepoInfo | str | os.PathLike[str]", good: str, bad: str, *, first_parent: bool = False
) -> tuple[list[str], dict[str, tuple[str, ...]] | None]:
    """The search axis for ``search.Bisection``: ``[good, ...range..., bad]`` and the parents.

    Parents are None with ``first_parent`` (the axis is a line) and for a range without
    merges; otherwise pass them as ``Bisection(points, parents=parents)``.
    """
    g = resolve(repo, good)
    commits = commit_range(repo, good, bad, first_parent=first_parent)  # its messages name what the user typed
    points = [g, *commits]
    if first_parent:
        return points, None
    parents = commit_parents(repo, commits)
    if all(len(p) == 1 for p in parents.values()):
        return points, None
    return points, parents


def _merge_base(repo: "RepoInfo | str | os.PathLike[str]", a: str, b: str) -> str:
    proc = _git(["merge-base", a, b], _root(repo), check=False)
    return proc.stdout.strip() or "(none)"


def has_submodules(repo: "RepoInfo | str | os.PathLike[str]", commit: str) -> bool:
    """True when ``commit`` has a ``.gitmodules`` file at its top level."""
    proc = _git(["cat-file", "-e", f"{commit}:.gitmodules"], _root(repo), check=False)
    return proc.returncode == 0


# --------------------------------------------------------------------------- worktrees
def default_cache_dir(repo: "RepoInfo | str | os.PathLike[str]") -> Path:
    """``<common git dir>/reprobisect/worktrees``: shared by all worktrees of one repository."""
    return _info(repo).common_dir / "reprobisect" / "worktrees"


def _is_full_hash(rev: str) -> bool:
    return len(rev) in (40, 64) and all(c in "0123456789abcdef" for c in rev)


def prune_stale_worktrees(repo: "RepoInfo | str | os.PathLike[str]", cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove worktree folders of dead sessions under ``cache_dir`` (default
    ``default_cache_dir(repo)``), then ``git worktree prune``; returns what was removed.

    Only folders named ``<this host>-<pid>-<token>`` (a ``WorktreePool``'s) whose pid is
    dead are removed, and not while a live process still works in one (a probe orphaned
    by a SIGKILL'd session: its folder goes at a later start, once that probe has ended).
    Runs when a pool starts and when ``bisect runs`` starts (its probes may all be cached).
    """
    from reprobisect.support.interrupt import in_use, pid_alive

    info = _info(repo)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(info)
    removed: list[Path] = []
    host = socket.gethostname()
    for d in cache.iterdir() if cache.is_dir() else ():
        h, _, _token = d.name.rpartition("-")  # host-pid-token
        h, _, pid = h.rpartition("-")
        if h != host or not pid.isdigit() or pid_alive(int(pid)) or in_use(d):
            continue
        for wt in sorted(d.iterdir()) if d.is_dir() else ():
            _git(["worktree", "remove", "--force", str(wt)], info.root, check=False)
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    _git(["worktree", "prune"], info.root, check=False)
    return removed


class WorktreePool:
    """Detached worktrees for probes, created on demand and reused across commits.

    ``with pool.checkout(commit) as path:`` yields a clean checkout of ``commit`` (with
    submodules initialised when the commit has a ``.gitmodules``); on leaving the block the
    worktree goes back to the pool (``reuse=True``) or is removed. A reused worktree is
    switched with ``git checkout --detach --force`` and ``git clean -ffdx``, so nothing a
    previous probe wrote survives. ``close()`` (or leaving ``with WorktreePool(...)``)
    removes every worktree of the pool, also after an exception or KeyboardInterrupt.
    Thread-safe: K probes may check out K worktrees at once.

    Args:
        repo: the repository (``RepoInfo`` or a path inside it).
        cache_dir: where worktrees go; default ``default_cache_dir(repo)``.
        reuse: keep worktrees between checkouts (cheaper when the tree is large or has
            submodules) instead of adding and removing one per checkout.
        submodules: initialise submodules (``git submodule update --init --recursive``).
    """

    def __init__(self, repo: "RepoInfo | str | os.PathLike[str]", *, cache_dir: str | os.PathLike[str] | None = None, reuse: bool = True, submodules: bool = True) -> None:
        import threading

        self.repo = _info(repo)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(self.repo)
        self.reuse = reuse
        self.submodules = submodules
        self._lock = threading.Lock()
        self._free: list[Path] = []
        self._all: list[Path] = []
        self._n = 0
        self._closed = False
        self._links: dict[Path, list[Path]] = {}  # worktree -> symlinks/folders make_links made there
        self._home = self.cache_dir / f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self.prune_stale()
            self._home.mkdir()
        except OSError as e:
            raise UsageError(
                f"cannot create the worktree cache folder {self.cache_dir}: {e.strerror or e}; "
                "give a writable cache folder (--cache-dir)"
            ) from None

    # -- lifecycle
    def __enter__(self) -> "WorktreePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prune_stale(self) -> list[Path]:
        """Remove folders left by pools whose process is gone (``prune_stale_worktrees``)."""
        return prune_stale_worktrees(self.repo, self.cache_dir)

    def close(self) -> None:
        """Remove every worktree of this pool and its folder (idempotent)."""
        with self._lock:
            self._closed = True
            trees, self._all, self._free = self._all, [], []
        for wt in trees:
            self._remove(wt)
        shutil.rmtree(self._home, ignore_errors=True)
        _git(["worktree", "prune"], self.repo.root, check=False)

    @property
    def worktrees(self) -> tuple[Path, ...]:
        """Worktrees this pool holds now (in use or free)."""
        return tuple(self._all)

    # -- checkout
    @contextlib.contextmanager
    def checkout(self, commit: str, *, links: "tuple[str, ...] | list[str]" = ()) -> Iterator[Path]:
        """A clean detached checkout of ``commit``; yields its top-level directory.

        ``links``: paths relative to the repository root (``check_links``) that appear in
        the worktree as symlinks to the user's checkout; unlinked when the block ends.
        """
        h = commit if _is_full_hash(commit) else resolve(self.repo, commit)
        wt = self._acquire(h)
        try:
            if links:
                made = make_links(wt, self.repo.root, links)
                with self._lock:
                    self._links[wt] = made
            yield wt
        finally:
            self._drop_links(wt)
            self._release(wt)

    def _drop_links(self, wt: Path) -> None:
        with self._lock:
            made = self._links.pop(wt, None)
        if made:
            remove_links(made)

    def _acquire(self, commit: str) -> Path:
        with self._lock:
            if self._closed:
                raise ProbeError("this worktree pool is closed")
            wt = self._free.pop() if self._free else None
            if wt is None:
                self._n += 1
                wt = self._home / f"wt{self._n}"
                self._all.append(wt)
                new = True
            else:
                new = False
        try:
            if new:
                _git(["worktree", "add", "--detach", "--force", str(wt), commit], self.repo.root)
            else:
                _git(["checkout", "--detach", "--force", "--quiet", commit], wt)
                _git(["clean", "-ffdxq"], wt)
            if self.submodules and (wt / ".gitmodules").is_file():
                _git(["submodule", "update", "--init", "--recursive", "--force", "--quiet"], wt)
                if not new:
                    _git(["submodule", "foreach", "--recursive", "--quiet", "git clean -ffdxq"], wt, check=False)
        except BaseException as e:
            with self._lock:
                if wt in self._all:
                    self._all.remove(wt)
            self._remove(wt)
            if isinstance(e, ProbeError):
                resolve(self.repo, commit)  # an unknown commit is the user's mistake: say so
            raise
        return wt

    def _release(self, wt: Path) -> None:
        with self._lock:
            if self.reuse and not self._closed and wt in self._all:
                self._free.append(wt)
                return
            if wt in self._all:
                self._all.remove(wt)
        self._remove(wt)

    def _remove(self, wt: Path) -> None:
        self._drop_links(wt)  # unlink the user's data first: removal never goes through a link
        if wt.exists():
            _git(["worktree", "remove", "--force", "--force", str(wt)], self.repo.root, check=False)
        if wt.exists():  # removal failed half-way: drop the registration of the gone folder
            shutil.rmtree(wt, ignore_errors=True)
            _git(["worktree", "prune"], self.repo.root, check=False)


@contextlib.contextmanager
def checkout(repo: "RepoInfo | str | os.PathLike[str]", commit: str, *, cache_dir: str | os.PathLike[str] | None = None, submodules: bool = True) -> Iterator[Path]:
    """One detached worktree of ``commit``, removed when the block ends (even on Ctrl-C)."""
    with WorktreePool(repo, cache_dir=cache_dir, reuse=False, submodules=submodules) as pool:
        with pool.checkout(commit) as wt:
            yield wt


# --------------------------------------------------------------------------- linked paths
def check_links(repo: "RepoInfo | str | os.PathLike[str]", paths: "tuple[str, ...] | list[str]") -> tuple[str, ...]:
    """The ``--link`` paths as POSIX paths relative to the repository root, checked.

    Each path is relative to the repository root (an absolute path inside the checkout is
    accepted too). Raises ``UsageError`` with one line for a path that does not exist in
    the checkout, lies outside it (``..``, a symlink out of it is fine: its target is the
    user's), is the root itself or inside ``.git``. Duplicates and paths under another
    linked folder are dropped; the result is sorted.
    """
    root = _root(repo)
    out: list[str] = []
    for raw in paths:
        text = str(raw).strip()
        if not text:
            raise UsageError("--link takes a path relative to the repository root, e.g. --link data")
        p = Path(text)
        full = p if p.is_absolute() else root / p
        # normalise without following symlinks: `data` may itself link elsewhere (the user's choice)
        norm = Path(os.path.normpath(full))
        if p.is_absolute() and not norm.is_relative_to(root) and norm.parent.exists():
            norm = norm.parent.resolve() / norm.name  # an absolute path through a symlinked prefix (/tmp -> /private/tmp)
        try:
            rel = norm.relative_to(root)
        except ValueError:
            raise UsageError(
                f"--link {text}: not inside the repository {root}; give a path relative to its root (e.g. --link data)"
            ) from None
        if str(rel) in ("", "."):
            raise UsageError(f"--link {text}: the repository root itself cannot be linked; name the folders or files (e.g. --link data)")
        if rel.parts[0] == ".git":
            raise UsageError(f"--link {text}: paths inside .git cannot be linked")
        if not os.path.lexists(norm):
            raise UsageError(f"--link {text}: {rel.as_posix()} does not exist in {root} (paths are relative to the repository root)")
        out.append(rel.as_posix())
    keep: list[str] = []
    for r in sorted(set(out)):
        if not any(r.startswith(k + "/") for k in keep):
            keep.append(r)
    return tuple(keep)


def make_links(worktree: str | os.PathLike[str], source_root: str | os.PathLike[str], links: "tuple[str, ...] | list[str]") -> list[Path]:
    """Make each of ``links`` (relative paths) in ``worktree`` a symlink to ``source_root/path``.

    A path the worktree already has (the commit tracks it) keeps the commit's content; when
    both are folders, the entries of the user's folder that the commit lacks are linked
    inside it, recursively. Missing parent folders are created. Returns what was made
    (symlinks and created folders, in creation order) for ``remove_links``; on an error,
    removes what it made and raises ``ProbeError``.
    """
    wt = Path(worktree)
    src_root = Path(source_root)
    made: list[Path] = []

    def link(src: Path, dst: Path) -> None:
        if not os.path.lexists(dst):
            os.symlink(src, dst, target_is_directory=src.is_dir())
            made.append(dst)
        elif dst.is_dir() and not dst.is_symlink() and src.is_dir():
            for child in sorted(os.listdir(src)):
                if child == ".git":
                    continue
                link(src / child, dst / child)
        # else: the commit has its own file here; the probe tests the commit's version

    try:
        for rel in links:
            parts = Path(rel).parts
            parent = wt
            for part in parts[:-1]:
                parent = parent / part
                if parent.is_symlink() or (os.path.lexists(parent) and not parent.is_dir()):
                    break  # a tracked file or link in the way: the commit decides this path
                if not parent.exists():
                    parent.mkdir()
                    made.append(parent)
            else:
                link(src_root / rel, wt / rel)
    except OSError as e:
        remove_links(made)
        raise ProbeError(f"cannot link {rel} into the worktree {wt}: {e.strerror or e}") from None
    return made


def remove_links(made: "list[Path]") -> None:
    """Undo ``make_links``: unlink each symlink (never following it) and remove the folders it
    created when they are empty. Never deletes anything a link points to."""
    for p in reversed(made):
        try:
            if p.is_symlink():
                os.unlink(p)
            elif p.is_dir():
                os.rmdir(p)  # only empty: anything the probe wrote there goes with the worktree
        except OSError:
            pass


# --------------------------------------------------------------------------- session lock
@contextlib.contextmanager
def session_lock(
    repo: "RepoInfo | str | os.PathLike[str]",
    *,
    timeout: float = 30.0,
    on_wait: Callable[[str], None] | None = None,
    what: str = "",
    option: str | None = None,
) -> Iterator[Path]:
    """Hold the repository's session lock for the duration of the block.

    The lock is an ``fcntl.flock`` on ``<common git dir>/reprobisect/core/session.lock``, so
    two sessions started from different worktrees of one repository exclude each other,
    and a killed session releases it (the kernel drops the lock with the process). A
    second session calls ``on_wait`` once with a message naming the holder, waits up to
    ``timeout`` seconds (0: fail at once), then raises ``UsageError`` saying who holds it.
    Yields the lock file's path. ``what`` describes this session for the next waiter;
    ``option`` is the command-line option that sets ``timeout`` (named in that error).
    """
    info = _info(repo)
    path = info.common_dir / "reprobisect" / "session.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UsageError(f"cannot create the session lock {path}: {e.strerror or e}; is the repository writable?") from None
    try:
        deadline = time.monotonic() + max(timeout, 0.0)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            holder = _read_holder(path)
            if time.monotonic() >= deadline:
                how = f"with {option} SECONDS" if option else "(session_lock's timeout)"
                raise UsageError(
                    f"another reprobisect session holds the lock on {info.root}{holder}; wait for it to finish "
                    f"(or give a longer lock timeout than {timeout:g} s {how})"
                )
            if not told and on_wait is not None:
                on_wait(f"waiting for another reprobisect session on {info.root}{holder}")
                told = True
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0.0)) or 0.01)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "what": what}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_holder(path: Path) -> str:
    try:
        d = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return ""
    if not d:
        return ""
    bits = [f"pid {d.get('pid')}"]
    if d.get("host"):
        bits.append(f"on {d['host']}")
    if d.get("started"):
        bits.append(f"since {d['started']}")
    if d.get("what"):
        bits.append(str(d["what"]))
    return " (" + ", ".join(bits) + ")"


# --------------------------------------------------------------------------- archives
def archive(repo: "RepoInfo | str | os.PathLike[str]", commit: str, *, submodules: bool = True) -> bytes:
    """The tree of ``commit`` as an uncompressed tar (``git archive --format=tar``).

    For workers without a shared file system. The tar's pax global header carries the
    commit id (``comment``), as ``git archive`` writes it. With ``submodules`` (default), the content
    of each submodule at the commit it is pinned to is added under its path, read from
    the submodule's repository in the user's checkout (``.git/modules``), recursively.
    Raises ``ProbeError`` naming the submodule when that commit is not available locally
    (fix: ``git submodule update --init --recursive`` in the repository).
    """
    info = _info(repo)
    h = resolve(info, commit)
    data = _git(["archive", "--format=tar", h], info.root, text=False).stdout
    if not submodules or not has_submodules(info, h):
        return data
    out = io.BytesIO()
    # keep what git archive writes: the commit id in the pax global header ("comment")
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": h}) as dst:
        _copy_tar(data, dst, "")
        _add_submodules(info.root, h, "", dst)
    return out.getvalue()


def _copy_tar(data: bytes, dst: tarfile.TarFile, prefix: str) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as src:
        for m in src.getmembers():
            if m.type == tarfile.XGLTYPE or m.name == "pax_global_header":
                continue
            f = src.extractfile(m) if m.isfile() else None
            if prefix:
                m.name = prefix + m.name
            dst.addfile(m, f)


def _add_submodules(repo_dir: Path, commit: str, prefix: str, dst: tarfile.TarFile) -> None:
    tree = _git(["ls-tree", "-r", "-z", commit], repo_dir).stdout
    for entry in tree.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, kind, sub_commit = meta.split()
        if mode != "160000":
            continue
        sub_dir = repo_dir / path
        proc = _git(["cat-file", "-e", f"{sub_commit}^{{commit}}"], sub_dir, check=False) if (sub_dir / ".git").exists() else None
        if proc is None or proc.returncode != 0:
            raise ProbeError(
                f"submodule {prefix}{path} at {sub_commit[:12]} is not available in {repo_dir}; run "
                "'git submodule update --init --recursive' there, or use an executor with a shared file system"
            )
        data = _git(["archive", "--format=tar", sub_commit], sub_dir, text=False).stdout
        _copy_tar(data, dst, f"{prefix}{path}/")
        if _git(["cat-file", "-e", f"{sub_commit}:.gitmodules"], sub_dir, check=False).returncode == 0:
            _add_submodules(sub_dir, sub_commit, f"{prefix}{path}/", dst)


def extract(data: bytes, dest: str | os.PathLike[str]) -> Path:
    """Unpack an ``archive`` tar into ``dest`` (created if needed); refuses paths outside it.

    Uses tarfile's ``tar`` filter: member names may not leave ``dest``, but symlinks keep
    their targets (a repository's ``data -> /mnt/datasets`` link checks out as git would).
    """
    d = Path(dest)
    d.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tf:
        try:
            tf.extractall(d, filter="tar")
        except tarfile.FilterError as e:
            raise ProbeError(f"refusing to extract an archive member outside {d}: {e}") from None
    return d


# --------------------------------------------------------------------------- DVC
@dataclass(frozen=True)
class DvcResult:
    """What ``dvc_pull_at`` did; truthy unless DVC data was expected and could not be restored."""

    status: str
    """``none`` (no DVC project), ``checked_out`` (from the shared cache), ``pulled`` (from a remote), ``failed``."""
    detail: str = ""
    wall_s: float = 0.0

    def __bool__(self) -> bool:
        return self.status != "failed"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _dvc_cache_of(project: Path) -> Path | None:
    """The cache dir a DVC project uses when set in its config files (relative to ``.dvc``)."""
    import configparser

    for name in ("config.local", "config"):
        cfg = configparser.ConfigParser()
        try:
            cfg.read(project / ".dvc" / name)
        except configparser.Error:
            continue
        d = cfg.get("cache", "dir", fallback=None) if cfg.has_section("cache") else None
        if d:
            d = d.strip().strip("'\"")
            return (project / ".dvc" / d).resolve() if not os.path.isabs(d) else Path(d)
    return None


def dvc_pull_at(
    worktree: str | os.PathLike[str],
    repo: "RepoInfo | str | os.PathLike[str]",
    *,
    subdir: str = ".",
    pull: bool = True,
    timeout: float | None = 600.0,
) -> DvcResult:
    """Restore the DVC-tracked data of a probe worktree, best-effort.

    Finds the DVC project (``.dvc``) at or above ``subdir`` inside ``worktree``, points its
    cache at the user's (``repo``'s) cache through ``.dvc/config.local`` (untracked, so the
    worktree stays clean), runs ``dvc checkout``, and when the cache lacks something and
    ``pull`` is set, ``dvc pull``. Never raises for a DVC failure: the result says
    ``failed`` with DVC's last line, and the caller decides (a probe would ``skip``).
    Needs the ``dvc`` extra (``pip install 'reprobisect[dvc]'``).
    """
    import importlib.util
    import sys

    t0 = time.monotonic()
    wt = Path(worktree).resolve()
    start = (wt / subdir).resolve()
    project = None
    for d in (start, *start.parents):
        if (d / ".dvc").is_dir():
            project = d
            break
        if d == wt:
            break
    if project is None:
        return DvcResult("none", "no DVC project in the worktree", time.monotonic() - t0)
    if importlib.util.find_spec("dvc") is None:
        return DvcResult("failed", "DVC data needs the extra: pip install 'reprobisect[dvc]'", time.monotonic() - t0)
    rel = project.relative_to(wt)
    main_project = _info(repo).root / rel
    cache = _dvc_cache_of(main_project) or (main_project / ".dvc" / "cache")
    # config.local overrides the tracked config and is ignored by DVC's own .gitignore
    (project / ".dvc" / "config.local").write_text(f"[cache]\n    dir = {cache}\n")
    env = dict(os.environ, DVC_NO_ANALYTICS="1")

    def dvc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project, capture_output=True, text=True, env=env, timeout=timeout)

    def last_line(p: subprocess.CompletedProcess) -> str:
        lines = (p.stderr or p.stdout or "").strip().splitlines()
        return lines[-1] if lines else f"exit {p.returncode}"

    try:
        co = dvc("checkout", "-q")
        if co.returncode == 0:
            return DvcResult("checked_out", f"from the cache {cache}", time.monotonic() - t0)
        if not pull:
            return DvcResult("failed", f"dvc checkout: {last_line(co)}", time.monotonic() - t0)
        pl = dvc("pull", "-q")
        if pl.returncode == 0:
            return DvcResult("pulled", "from the DVC remote", time.monotonic() - t0)
        return DvcResult("failed", f"dvc checkout: {last_line(co)}; dvc pull: {last_line(pl)}", time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        return DvcResult("failed", f"dvc did not finish within {timeout:g} s", time.monotonic() - t0)
