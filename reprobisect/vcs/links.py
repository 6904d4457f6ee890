"""Paths a worktree needs from the user's checkout that git does not hold (``--link PATH``).

Each probe's worktree gets a symlink to the user's copy (never a copy): made before the
probe, unlinked before the worktree is cleaned or removed, so the user's data is never
deleted through it. Moved out of ``vcs/git.py`` (which re-exports these) to keep it a size
one can read; nothing here runs git.
"""

from __future__ import annotations

import os
from pathlib import Path

from reprobisect.errors import ProbeError, UsageError

__all__ = ["check_links", "make_links", "remove_links"]


def _root(repo: "object") -> Path:
    """The repository root of a ``RepoInfo`` or a path."""
    if isinstance(repo, (str, os.PathLike)):  # (a Path's own .root is "/": ask for a path first)
        return Path(repo)
    return Path(repo.root)  # type: ignore[attr-defined]


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
