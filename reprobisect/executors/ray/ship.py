"""What ships a revision to the Ray workers: the code as a tar, and its unpacking.

The commit reaches the worker as a ``git archive`` (tar) put once into the object store
and passed to the task; the worker extracts it into its own temp folder, so workers need
no shared file system and no git. The tar header carries the commit id; the worker
reports it and the controller checks it equals the spec's revision (stale code can never
pass unnoticed: a mismatch is outcome ``infra``). A spec without a revision (``repro`` in
the user's checkout) ships the folder itself (git-tracked and untracked-but-not-ignored
files, at most ``max_ship_bytes``), or runs in place with ``shared_fs=True``.
``--link`` paths (ignored data) are never shipped: the worker links them
(``reprobisect.executors.ray.worker``).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from reprobisect.core.probe import ProbeSpec
from reprobisect.errors import UsageError
from reprobisect.vcs.archive import archive, extract
from reprobisect.vcs.git import resolve

__all__ = ["archive_commit", "payload"]


def archive_commit(repo: str | os.PathLike, commit: str) -> bytes:
    """A tar of ``commit`` (``reprobisect.vcs.archive.archive``) whose pax header names the commit.

    ``git archive`` writes the commit id into the tar's global header; when the archive
    was rebuilt (submodule content added) the header is written again here, so the
    worker can always read back which commit it unpacked.
    """
    full = resolve(repo, commit)
    data = archive(repo, full)
    if _tar_commit(data) == full:
        return data
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, tarfile.open(
        fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": full}
    ) as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out.getvalue()


def _tar_commit(data: bytes) -> str | None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        commit = tar.pax_headers.get("comment")
    return commit if commit and re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", commit) else None


def _tar_folder(folder: Path, limit: int) -> bytes:
    """A tar of ``folder`` for a probe without a revision: git-visible files, or all but .git."""
    r = subprocess.run(
        ["git", "-C", str(folder), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
    )
    if r.returncode == 0:
        names = [n for n in r.stdout.decode(errors="surrogateescape").split("\0") if n]
    else:
        names = []
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d not in (".git", "__pycache__")]
            names += [os.path.relpath(os.path.join(root, f), folder) for f in files]
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(names):
            p = folder / name
            if not p.is_file() or p.is_symlink():
                continue
            total += p.stat().st_size
            if total > limit:
                raise UsageError(
                    f"'{folder}' holds more than {limit / 2**20:g} MiB to ship to the Ray workers; "
                    "probe a commit instead (it ships as a git archive) or pass shared_fs=True "
                    "when every node sees this folder"
                )
            tar.add(str(p), arcname=name, recursive=False)
    return buf.getvalue()


def _extract(data: bytes, dest: Path) -> str | None:
    """Extract a tar into ``dest``; return the commit id its pax header carries, if any."""

    extract(data, dest)
    return _tar_commit(data)


def payload(spec: ProbeSpec, archives: dict[tuple[str, str], Any], *, shared_fs: bool,
            max_ship_bytes: int) -> tuple[str, Any]:
    """How ``spec``'s code travels: ``('archive', ref)`` for a commit (one object-store copy
    per (repository, commit), kept in ``archives``), ``('shared', path)`` to run in place,
    or ``('tree', ref)``: the folder itself, at most ``max_ship_bytes``."""
    import ray

    if spec.repo and spec.revision:
        key = (str(spec.repo), spec.revision)
        if key not in archives:
            archives[key] = ray.put(archive_commit(spec.repo, spec.revision))
        return ("archive", archives[key])
    folder = Path(spec.workdir) if spec.workdir else Path.cwd()
    if shared_fs or spec.in_place:
        return ("shared", str(folder.resolve()))
    return ("tree", ray.put(_tar_folder(folder, max_ship_bytes)))
