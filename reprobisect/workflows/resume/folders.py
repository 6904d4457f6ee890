"""Each of ``bisect resume``'s runs in its own copy of the working folder, and what each wrote.

The three runs must not see each other's files: a resumed run that loads a checkpoint the
uninterrupted run left (the interrupted run never wrote it, or wrote it under another name)
judges an artefact of the tool, not the user's checkpoint. So the uninterrupted run works in
one copy of the user's folder, the interrupted run in another, and every resumed run in a
fresh copy of the folder as the interrupted run left it. The user's own folder is only read.

What a run wrote is the difference between snapshots of its folder (size, mtime, inode)
before and after it; a path the resume arguments name is checked against that before the
resumed run starts (``check_named``): a file the interrupted run did not write is refused in
one line — missing, stale (the user's own older file), or Lightning's version-counted
``last-v1.ckpt`` written because ``last.ckpt`` already existed.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from reprobisect.errors import UsageError

__all__ = ["LINK_BYTES", "Wrote", "check_named", "copy_folder", "named_paths", "snapshot", "written"]

LINK_BYTES = 64 * 2**20
"""A file this large is linked into the copies, not copied (a data set, read-only in practice)."""

_LINKED_DIRS = {".git", ".hg", ".svn", "node_modules"}
"""Folders linked into a copy, never copied: version control, installed packages."""
_SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".ipynb_checkpoints"}
"""Caches left out of a copy."""

_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".tar", ".pkl", ".pickle", ".h5", ".keras",
                        ".npz", ".msgpack")
"""A resume argument ending so names a checkpoint even when no run wrote it (a missing one)."""
_VERSIONED = re.compile(r"^(?P<stem>.+)-v(?P<n>\d+)(?P<suffix>\.[^./]+)?$")


def _linked(entry: os.DirEntry) -> bool:
    if entry.name in _LINKED_DIRS:
        return True
    return entry.is_dir(follow_symlinks=False) and os.path.exists(os.path.join(entry.path, "pyvenv.cfg"))


def copy_folder(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """A copy of ``src`` at ``dst`` (created) for one run to write in: caches left out, version
    control, virtual environments and files over ``LINK_BYTES`` linked; symlinks kept as links."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    with os.scandir(src) as it:
        entries = list(it)
    for e in entries:
        target = dst / e.name
        if e.name in _SKIPPED_DIRS:
            continue
        if e.is_symlink():  # a link within the folder stays relative; one out of it points where it did
            link = os.readlink(e.path)
            inside = os.path.realpath(e.path).startswith(os.path.realpath(src) + os.sep)
            os.symlink(link if os.path.isabs(link) or inside else os.path.realpath(e.path), target)
        elif _linked(e):
            os.symlink(os.path.abspath(e.path), target)
        elif e.is_dir():
            copy_folder(e.path, target)
        elif e.is_file():
            if e.stat().st_size >= LINK_BYTES:
                os.symlink(os.path.abspath(e.path), target)
            else:
                shutil.copy2(e.path, target)
    return dst


def snapshot(folder: str | os.PathLike) -> dict[str, tuple[int, int, int]]:
    """``{relative path: (size, mtime_ns, inode)}`` of the files under ``folder`` (links not followed)."""
    out: dict[str, tuple[int, int, int]] = {}
    root = str(folder)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS and not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def written(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> tuple[str, ...]:
    """The files new or changed between two snapshots, sorted."""
    return tuple(sorted(p for p, st in after.items() if before.get(p) != st))


@dataclass(frozen=True)
class Wrote:
    """What the uninterrupted and the interrupted runs wrote in their folders (relative paths),
    and the wall-clock spans they ran in (for a file outside the folders: which run wrote it)."""

    uninterrupted: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()
    spans: tuple[tuple[float, float], ...] = ()
    """(start, end) of the uninterrupted and the interrupted run, ``time.time()``."""


def named_paths(resume_args: list[str], folder: Path, wrote: Wrote) -> list[str]:
    """The arguments (or ``--flag=value`` values) that may name a checkpoint: a path with a
    checkpoint's suffix, one a run wrote (a file, or a folder holding one), or one in ``folder``."""
    out = []
    written_any = tuple(sorted(set(wrote.uninterrupted) | set(wrote.interrupted)))
    for arg in resume_args:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if not value or value.startswith("-"):
            continue
        if _checkpoint_like(value) or _wrote_under(value, written_any) or (folder / value).exists():
            out.append(value)
    return out


def _checkpoint_like(value: str) -> bool:
    return value.lower().endswith(_CHECKPOINT_SUFFIXES)


def _wrote_under(rel: str, files: tuple[str, ...]) -> bool:
    rel = os.path.normpath(rel)
    return rel in files or any(p.startswith(rel.rstrip(os.sep) + os.sep) for p in files)


def _listing(files: tuple[str, ...], n: int = 5) -> str:
    if not files:
        return "it wrote no file in its folder"
    shown = ", ".join(files[:n]) + (f" (+{len(files) - n} more)" if len(files) > n else "")
    return f"it wrote: {shown}"


def _version_of(rel: str, files: tuple[str, ...]) -> str | None:
    """A file the run wrote that Lightning's version counter named after ``rel`` (``last-v1.ckpt``)."""
    head, base = os.path.split(os.path.normpath(rel))
    stem, suffix = os.path.splitext(base)
    for p in files:
        h, b = os.path.split(p)
        m = _VERSIONED.match(b)
        if h == head and m and m.group("stem") == stem and (m.group("suffix") or "") == suffix:
            return p
    return None


def check_named(resume_args: list[str], folder: Path, wrote: Wrote, at: int) -> None:
    """Refuse (``UsageError``, one line) a resume that would read a checkpoint the interrupted run
    (which ran in ``folder``) did not write: missing, the user's older file at a path the command
    writes (the uninterrupted run wrote it), a version-counted twin. A path no run wrote that is
    there is an input (a config, pretrained weights) and passes."""
    for value in named_paths(resume_args, folder, wrote):
        path = Path(value) if os.path.isabs(value) else folder / value
        if not path.resolve().is_relative_to(folder.resolve()):
            _check_outside(value, path, wrote)
            continue
        rel = os.path.relpath(path, folder)
        if _wrote_under(rel, wrote.interrupted):
            continue
        twin = _version_of(rel, wrote.interrupted)
        if twin is not None:
            raise UsageError(
                f"the interrupted run wrote {twin} because {rel} already existed in your folder (Lightning's "
                f"ModelCheckpoint counts versions); --resume-args reads {rel}, a stale file: remove the old {rel} "
                "or set ModelCheckpoint(enable_version_counter=False)")
        if path.exists() and _wrote_under(rel, wrote.uninterrupted):
            raise UsageError(
                f"--resume-args reads {rel}, but the interrupted run (after {at} step(s)) did not write it: it is "
                f"your folder's own older file, a stale checkpoint ({_listing(wrote.interrupted)}); name the file "
                "the run saves, or move the old one away")
        if path.exists() or not (_checkpoint_like(rel) or _wrote_under(rel, wrote.uninterrupted)):
            continue  # an input the command only reads (a config, pretrained weights), or not a path
        later = " (the uninterrupted run wrote it later: no save came before the interruption; use an --at after a save)" \
            if _wrote_under(rel, wrote.uninterrupted) else ""
        raise UsageError(f"--resume-args names {rel} but the interrupted run (after {at} step(s)) wrote no such file "
                         f"({_listing(wrote.interrupted)}){later}; name the file it writes")


def _check_outside(value: str, path: Path, wrote: Wrote) -> None:
    """A checkpoint outside the runs' folders (an absolute path): all runs share it, so which run
    wrote it last is told from its mtime against the runs' spans."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        raise UsageError(f"--resume-args names {value} but the interrupted run wrote no such file; name the file "
                         "it writes") from None
    if len(wrote.spans) == 2:
        (a0, a1), (b0, b1) = wrote.spans
        if a0 <= mtime <= a1 + 1 and not b0 <= mtime:
            raise UsageError(
                f"the resumed run would read {value}, written by the uninterrupted run, not the interrupted one: a "
                "path outside the working folder is shared by the runs; save checkpoints under the working folder "
                "(a relative path) so that each run has its own")
