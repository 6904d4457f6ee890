"""A commit as a tar archive (submodules included) and its extraction: how a revision is
shipped to a machine that has no copy of the repository (``executors/ray/ship.py``).

Moved out of ``vcs/git.py`` to keep that module a size one can read; it uses git.py's
runner (``_run``/``_Git``) one way (git.py never imports this module).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from reprobisect.errors import ProbeError, UsageError
from reprobisect.vcs.git import RepoInfo, _Git, _info, _opened, _run, has_submodules, resolve

__all__ = ["archive", "extract"]


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
    data = _run(_Git(info.root), "archive", "--format=tar", h, binary=True).out
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


def _gitlinks(repo_dir: Path, commit: str) -> list[tuple[str, str]]:
    """(path, pinned commit) of every submodule entry in ``commit``'s tree."""
    with _opened(repo_dir) as r:
        tree = r.commit(commit).tree
        return [(sm.path, sm.hexsha) for sm in tree.traverse(predicate=lambda i, _d: i.type == "submodule")]


def _has_commit(sub_dir: Path, sha: str) -> bool:
    """True when the repository checked out at ``sub_dir`` (its own ``.git``) holds commit ``sha``."""
    if not (sub_dir / ".git").exists():
        return False
    try:
        with _opened(sub_dir) as r:  # its own .git is found first
            return r.commit(sha).type == "commit"
    except (UsageError, BadName, BadObject, ValueError):
        return False


def _add_submodules(repo_dir: Path, commit: str, prefix: str, dst: tarfile.TarFile) -> None:
    for path, sub_commit in _gitlinks(repo_dir, commit):
        sub_dir = repo_dir / path
        if not _has_commit(sub_dir, sub_commit):
            raise ProbeError(
                f"submodule {prefix}{path} at {sub_commit[:12]} is not available in {repo_dir}; run "
                "'git submodule update --init --recursive' there, or use an executor with a shared file system"
            )
        data = _run(_Git(sub_dir), "archive", "--format=tar", sub_commit, binary=True).out
        _copy_tar(data, dst, f"{prefix}{path}/")
        if has_submodules(sub_dir, sub_commit):
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
