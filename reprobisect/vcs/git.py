"""The git layer: revisions, commit ranges, throwaway worktrees, a session lock, archives.

Built on GitPython (``import git``). Repository discovery, commit objects, ancestry,
commit metadata and submodules go through ``git.Repo``; the worktree pool, the archive
and the few commands GitPython has no object for (``git worktree``, ``git rev-parse``,
the diffstat shown in the answer) run through GitPython's command wrapper. Revisions are
parsed by git itself (``repo.git.rev_parse``): GitPython's own ``Repo.rev_parse`` does not
know all of git's revision grammar (``main@{2.days.ago}``, ``@{upstream}``), and a user's
``--good`` must mean what it means to ``git``. No ML framework is imported here.

Two cares the wrapper (``_Git``) adds to GitPython's ``git.Git``:

- ``GIT_DIR``, ``GIT_WORK_TREE`` and ``GIT_INDEX_FILE`` inherited from the environment (a
  git hook or alias sets them) never reach a git command: GitPython only adds variables
  to a command's environment, so when one of them is set, the command runs through
  ``env -u``. Otherwise ``git worktree add`` would write the new worktree's index over
  the user's.
- every command runs as ``git -C <its folder>``: GitPython runs a command whose folder
  is gone in the process's current directory (the user's checkout), where ``git clean``
  must never run.

GitPython keeps ``git cat-file`` processes alive for each ``git.Repo`` that reads objects,
so every ``Repo`` here is opened for one call and closed at its end (``_opened``): a long
search leaves no process or file handle behind, and the worktree pool can be removed.

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

DVC data at a revision lives in ``reprobisect.vcs.dvc``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import git as gitpy
except ImportError:  # GitPython refuses to import when it finds no git executable:
    os.environ["GIT_PYTHON_REFRESH"] = "quiet"  # report that at first use instead (UsageError)
    import git as gitpy
from git.exc import BadName, BadObject, GitCommandError, GitCommandNotFound, InvalidGitRepositoryError, NoSuchPathError

from reprobisect.errors import ProbeError, UsageError
from reprobisect.support.interrupt import in_use, pid_alive
from reprobisect.vcs.links import check_links, make_links, remove_links

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
    "checkout_state",
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


# --------------------------------------------------------------------------- GitPython, with care
_ENV_GUARDED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
_NO_GIT = "git is not installed or not on PATH; install git to search history"


class _Git(gitpy.Git):
    """GitPython's command wrapper for one folder: ``git -C <folder>``, no inherited GIT_DIR,
    GIT_WORK_TREE or GIT_INDEX_FILE, no credential prompt (module docstring)."""

    def __init__(self, working_dir: str | os.PathLike[str]) -> None:
        super().__init__(working_dir)
        # the folder as given: GitPython would expand $VARS and ~ in a str path
        self._working_dir = os.path.abspath(os.fspath(working_dir))
        self.set_persistent_git_options(C=self._working_dir)
        if "GIT_TERMINAL_PROMPT" not in os.environ:
            self.update_environment(GIT_TERMINAL_PROMPT="0")

    def execute(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        if not os.path.isdir(self._working_dir):
            raise UsageError(f"directory {self._working_dir} does not exist")
        if isinstance(command, (list, tuple)) and any(v in os.environ for v in _ENV_GUARDED):
            if shutil.which(command[0]) is None:
                raise GitCommandNotFound(command, _NO_GIT)
            unset = [a for v in _ENV_GUARDED for a in ("-u", v)]
            command = [shutil.which("env") or "/usr/bin/env", *unset, *command]
        return super().execute(command, *args, **kwargs)


class _Repo(gitpy.Repo):
    """``git.Repo`` whose commands go through ``_Git``."""

    GitCommandWrapperType = _Git


@dataclass(frozen=True)
class _Done:
    """What one git command returned."""

    status: int
    out: Any
    """stdout: text, or bytes with ``binary``."""
    err: str

    def last_line(self) -> str:
        lines = self.err.strip().splitlines()
        return lines[-1] if lines else str(self.status)


def _run(g: gitpy.Git, *args: str, check: bool = True, binary: bool = False) -> _Done:
    """``git <args>`` through GitPython's wrapper ``g``; with ``check``, a failure raises
    ``ProbeError`` naming the command, the folder and git's last line."""
    call = getattr(g, args[0].replace("-", "_"))
    try:
        status, out, err = call(
            *args[1:], with_extended_output=True, with_exceptions=False, stdout_as_string=not binary,
            strip_newline_in_stdout=False,
        )
    except GitCommandNotFound:
        raise UsageError(_NO_GIT) from None
    done = _Done(status, out, err.decode(errors="replace") if isinstance(err, bytes) else err or "")
    if check and status != 0:
        raise ProbeError(f"git {' '.join(args)} failed in {g.working_dir}: {done.last_line()}")
    return done


def _stderr_of(e: GitCommandError) -> str:
    """git's own stderr out of GitPython's formatted ``"\\n  stderr: '...'"``."""
    text = str(e.stderr or "").strip()
    if text.startswith("stderr: '") and text.endswith("'"):
        text = text[len("stderr: '"):-1]
    return text.strip()


def _root(repo: "RepoInfo | str | os.PathLike[str]") -> Path:
    return repo.root if isinstance(repo, RepoInfo) else Path(repo)


def _info(repo: "RepoInfo | str | os.PathLike[str]") -> RepoInfo:
    return repo if isinstance(repo, RepoInfo) else open_repo(repo)


@contextlib.contextmanager
def _opened(repo: "RepoInfo | str | os.PathLike[str]") -> Iterator[_Repo]:
    """A ``git.Repo`` of ``repo`` for one call, closed after it (its ``cat-file`` processes end)."""
    root = _root(repo)
    try:
        r = _Repo(root, search_parent_directories=True, expand_vars=False)
    except NoSuchPathError:
        raise UsageError(f"directory {root} does not exist") from None
    except InvalidGitRepositoryError:
        raise UsageError(f"not a git repository: {root} (run from inside a repository or pass its path)") from None
    try:
        yield r
    except GitCommandNotFound:
        raise UsageError(_NO_GIT) from None
    except GitCommandError as e:  # a command GitPython ran for an object or a walk
        args = [str(a) for a in (e.command if isinstance(e.command, (list, tuple)) else [e.command])]
        args = args[3:] if args[1:2] == ["-C"] else args[1:]  # less `git -C <folder>`
        raise ProbeError(f"git {' '.join(args)} failed in {root}: {_stderr_of(e) or e.status}") from None
    finally:
        r.close()


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
    with _opened(p) as r:
        git_dir = Path(r.git_dir).resolve()
        common = Path(r.common_dir).resolve()
        # inside this worktree's own git directory (a pool's worktrees live under the common one)
        if r.bare or p.is_relative_to(git_dir):
            raise UsageError(f"{p} is a bare repository or inside a git directory: run from a working tree of it")
        if not r.working_tree_dir:
            raise UsageError(f"{p} has no working tree: run from a working tree of the repository")
        root = Path(r.working_tree_dir).resolve()
    return RepoInfo(root=root, common_dir=common, git_dir=git_dir, subdir=os.path.relpath(p, root))


def resolve(repo: "RepoInfo | str | os.PathLike[str]", rev: str) -> str:
    """The full hash of commit ``rev`` (a branch, tag, short hash, ``HEAD~3``...).

    Raises ``UsageError`` naming ``rev`` when git does not know it as a commit.
    """
    if not rev or rev.startswith("-"):
        raise UsageError(f"'{rev}' is not a revision")
    done = _run(_Git(_root(repo)), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    if done.status != 0 or not done.out.strip():
        raise UsageError(f"unknown revision '{rev}' in {_root(repo)} (check the name, or fetch it first)")
    return done.out.strip()


def _is_ancestor(r: _Repo, a: str, d: str) -> bool:
    try:
        return r.is_ancestor(a, d)
    except GitCommandError as e:
        raise ProbeError(f"git merge-base --is-ancestor {a} {d} failed: {_stderr_of(e)}") from None


def is_ancestor(repo: "RepoInfo | str | os.PathLike[str]", ancestor: str, descendant: str) -> bool:
    """True when ``ancestor`` is reachable from ``descendant`` (a commit is its own ancestor)."""
    a, d = resolve(repo, ancestor), resolve(repo, descendant)
    with _opened(repo) as r:
        return _is_ancestor(r, a, d)


def _subject(message: str | bytes) -> str:
    """git's ``%s``: the message's first paragraph, its lines joined by a space."""
    text = message.decode(errors="replace") if isinstance(message, bytes) else message
    lines: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.rstrip())
    return " ".join(lines)


def commit_info(repo: "RepoInfo | str | os.PathLike[str]", rev: str) -> CommitInfo:
    """Hash, subject, author, date, parents and diffstat of one commit."""
    h = resolve(repo, rev)
    with _opened(repo) as r:
        c = r.commit(h)
        # the short hash git would print, numstat and the --stat body, in one command;
        # --first-parent diff for merges (what the merge brought in); --root for the first commit
        show = _run(r.git, "show", "--format=%h", "--numstat", "--stat=200", "--first-parent", "--root", "-m", h).out
        short, _, body = show.partition("\n")
        files = ins = dels = 0
        stat: list[str] = []
        for line in body.splitlines():
            parts = line.split("\t")
            if len(parts) >= 3:  # numstat: added, deleted, path (a --stat line has no tab: git quotes it)
                files += 1
                ins += int(parts[0]) if parts[0].isdigit() else 0
                dels += int(parts[1]) if parts[1].isdigit() else 0
            elif line.strip():
                stat.append(line)
        return CommitInfo(
            hash=c.hexsha, short=short.strip(), subject=_subject(c.message), author=c.author.name or "",
            email=c.author.email or "", date=c.authored_datetime.isoformat(),
            parents=tuple(p.hexsha for p in c.parents),
            files_changed=files, insertions=ins, deletions=dels, diffstat="\n".join(stat),
        )


def _check_range(r: _Repo, good: str, bad: str, g: str, b: str) -> None:
    if g == b:
        raise UsageError(f"--good {good} and --bad {bad} are the same commit {g[:12]}: nothing to search")
    if _is_ancestor(r, g, b):
        return
    if _is_ancestor(r, b, g):
        raise UsageError(
            f"--good {good} is not an ancestor of --bad {bad}: {bad} is older; swap --good and --bad "
            "(or use other terms to hunt the commit that fixed it)"
        )
    bases = r.merge_base(g, b)
    base = bases[0].hexsha if bases and bases[0] is not None else "(none)"
    raise UsageError(
        f"--good {good} is not an ancestor of --bad {bad}: they are on diverged branches; pick a --good "
        f"on {bad}'s history (e.g. their merge base {base[:12]})"
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
    with _opened(repo) as r:
        _check_range(r, good, bad, g, b)
        if not first_parent:
            return [c.hexsha for c in r.iter_commits(f"{g}..{b}", ancestry_path=True, topo_order=True, reverse=True)]
        chain = list(r.iter_commits(f"{g}..{b}", first_parent=True))
        chain.reverse()
        # the chain must reach good itself: rev-list stops at good's ancestors, so check
        # that good is the first parent of the oldest listed commit
        parents = chain[0].parents
        if not parents or parents[0].hexsha != g:
            raise UsageError(
                f"--good {good} is an ancestor of --bad {bad} but not on its first-parent (mainline) history; "
                "drop --first-parent, or pick a --good on the mainline"
            )
        return [c.hexsha for c in chain]


def commit_parents(repo: "RepoInfo | str | os.PathLike[str]", commits: list[str]) -> dict[str, tuple[str, ...]]:
    """Parents (full hashes) of each of ``commits``, for ``search.Bisection(parents=...)``."""
    if not commits:
        return {}
    with _opened(repo) as r:
        try:
            return {c: tuple(p.hexsha for p in gitpy.Commit(r, bytes.fromhex(c)).parents) for c in commits}
        except (ValueError, BadObject) as e:
            raise ProbeError(f"cannot read the parents of a commit in {_root(repo)}: {e}") from None


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


def _has_gitmodules(r: _Repo, commit: str) -> bool:
    try:
        r.commit(commit).tree / ".gitmodules"
    except (BadName, BadObject, ValueError, KeyError):
        return False
    return True


def has_submodules(repo: "RepoInfo | str | os.PathLike[str]", commit: str) -> bool:
    """True when ``commit`` has a ``.gitmodules`` file at its top level."""
    with _opened(repo) as r:
        return _has_gitmodules(r, commit)


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
    info = _info(repo)
    g = _Git(info.root)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(info)
    removed: list[Path] = []
    host = socket.gethostname()
    for d in cache.iterdir() if cache.is_dir() else ():
        h, _, _token = d.name.rpartition("-")  # host-pid-token
        h, _, pid = h.rpartition("-")
        if h != host or not pid.isdigit() or pid_alive(int(pid)) or in_use(d):
            continue
        for wt in sorted(d.iterdir()) if d.is_dir() else ():
            _run(g, "worktree", "remove", "--force", str(wt), check=False)
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    _run(g, "worktree", "prune", check=False)
    return removed


class WorktreePool:
    """Detached worktrees for probes, created on demand and reused across commits.

    ``with pool.checkout(commit) as path:`` yields a clean checkout of ``commit`` (with
    submodules initialised when the commit has a ``.gitmodules``); on leaving the block the
    worktree goes back to the pool (``reuse=True``) or is removed. A reused worktree is
    switched with ``git checkout --detach --force`` and ``git clean -ffdx``, so nothing a
    previous probe wrote survives. ``close()`` (or leaving ``with WorktreePool(...)``)
    removes every worktree of the pool, also after an exception or KeyboardInterrupt.
    Thread-safe: K probes may check out K worktrees at once. Git commands run through
    GitPython's command wrapper (``_Git``); the pool holds no ``git.Repo``, so no process.

    Args:
        repo: the repository (``RepoInfo`` or a path inside it).
        cache_dir: where worktrees go; default ``default_cache_dir(repo)``.
        reuse: keep worktrees between checkouts (cheaper when the tree is large or has
            submodules) instead of adding and removing one per checkout.
        submodules: initialise submodules (``git submodule update --init --recursive``).
    """

    def __init__(self, repo: "RepoInfo | str | os.PathLike[str]", *, cache_dir: str | os.PathLike[str] | None = None, reuse: bool = True, submodules: bool = True) -> None:
        self.repo = _info(repo)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(self.repo)
        self.reuse = reuse
        self.submodules = submodules
        self._git = _Git(self.repo.root)
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
        _run(self._git, "worktree", "prune", check=False)

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

    def _take(self) -> tuple[Path, bool]:
        """A free worktree of the pool, or the path of a new one; and whether it is new."""
        with self._lock:
            if self._closed:
                raise ProbeError("this worktree pool is closed")
            if self._free:
                return self._free.pop(), False
            self._n += 1
            wt = self._home / f"wt{self._n}"
            self._all.append(wt)
            return wt, True

    def _acquire(self, commit: str) -> Path:
        wt, new = self._take()
        try:
            if new:
                _run(self._git, "worktree", "add", "--detach", "--force", str(wt), commit)
            g = _Git(wt)
            if not new:
                _run(g, "checkout", "--detach", "--force", "--quiet", commit)
                _run(g, "clean", "-ffdxq")
            if self.submodules and (wt / ".gitmodules").is_file():
                _run(g, "submodule", "update", "--init", "--recursive", "--force", "--quiet")
                if not new:
                    _run(g, "submodule", "foreach", "--recursive", "--quiet", "git clean -ffdxq", check=False)
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
            _run(self._git, "worktree", "remove", "--force", "--force", str(wt), check=False)
        if wt.exists():  # removal failed half-way: drop the registration of the gone folder
            shutil.rmtree(wt, ignore_errors=True)
            _run(self._git, "worktree", "prune", check=False)


@contextlib.contextmanager
def checkout(repo: "RepoInfo | str | os.PathLike[str]", commit: str, *, cache_dir: str | os.PathLike[str] | None = None, submodules: bool = True) -> Iterator[Path]:
    """One detached worktree of ``commit``, removed when the block ends (even on Ctrl-C)."""
    with WorktreePool(repo, cache_dir=cache_dir, reuse=False, submodules=submodules) as pool:
        with pool.checkout(commit) as wt:
            yield wt


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

    The lock is an ``fcntl.flock`` on ``<common git dir>/reprobisect/session.lock``, so
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


# --------------------------------------------------------------------------- checkout state
def checkout_state(repo: "RepoInfo | str | os.PathLike[str]", script: str | os.PathLike[str] | None = None) -> tuple[str | None, bool]:
    """(the full hash HEAD names, None in a repository without commits; whether the checkout
    holds uncommitted changes), judged as a trace's ``revision`` records them
    (``reprobisect.runners.environment.revision_of``): tracked files differ from HEAD
    (``git status --porcelain --untracked-files=no``), or ``script`` is not tracked.

    Reads only: the zoom asks it whether the user's checkout still holds a dirty trace's
    changes before it re-runs that trace in place.
    """
    g = _Git(_root(repo))
    head = _run(g, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
    dirty = bool(_run(g, "status", "--porcelain", "--untracked-files=no").out.strip())
    if script is not None and not dirty:
        dirty = _run(g, "ls-files", "--error-unmatch", "--", str(script), check=False).status != 0
    return (head.out.strip() or None) if head.status == 0 else None, dirty
