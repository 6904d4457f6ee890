"""What a checkout's DVC files declare: the data version of a commit, read as YAML.

DVC records each tracked output's hash in a ``*.dvc`` file next to it (``dvc add``) or in
``dvc.lock`` (pipeline outputs). ``tracked_outs(root)`` reads them all, so that the data
version of a checkout is known without DVC itself (never imported here: it is an optional
extra, and the environment record is collected inside the user's training process).

``data_version(root)`` is that version as the environment record keeps it
(``reprobisect.runners.environment``, group ``data``): ``{"dvc": {FILE: {OUT: HASH}}}``, FILE
the DVC file and OUT the output, both POSIX paths relative to ``root``. Only outputs are
read: a stage's dependencies are code (in git) or other outputs (read where declared).
``cache_file(cache, out)`` is where DVC's cache keeps an output's content, so a caller can
say which outputs the cache lacks before asking DVC to check them out.

Standard library and PyYAML only; no git import (``git ls-files`` runs as a subprocess).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["DvcOut", "cache_file", "data_version", "dvc_files", "missing_from_cache", "project_root", "tracked_outs"]

_HASH_KEYS = ("md5", "etag", "checksum")
_WALK_LIMIT = 5000
"""Folders searched for DVC files outside git (a checkout without ``.git``: a Ray worker's copy)."""
_SKIP_DIRS = {".git", ".dvc", "node_modules", "__pycache__", ".venv", "venv"}


@dataclass(frozen=True)
class DvcOut:
    """One DVC-tracked output of a checkout, as its DVC file declares it."""

    dvcfile: str
    """The ``*.dvc`` file or ``dvc.lock`` that declares it (POSIX, relative to the root)."""
    path: str
    """The output (POSIX, relative to the root): a file, or a folder when ``value`` ends in ``.dir``."""
    hash: str
    """The hash kind: ``md5`` (the local cache's), ``etag`` or ``checksum`` (cloud versioning)."""
    value: str
    """The hash itself; a folder's ends in ``.dir`` (its listing is a cache object of its own)."""
    legacy: bool = False
    """Written by DVC 2 (no ``hash: md5`` field): its object lives in the cache's old layout."""

    @property
    def is_dir(self) -> bool:
        return self.value.endswith(".dir")


def _run_git(args: list[str], cwd: Path) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30,
                           env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def project_root(start: str | os.PathLike[str]) -> Path | None:
    """The nearest folder at or above ``start`` that holds a ``.dvc`` folder (a DVC project), or None."""
    p = Path(start).resolve()
    for d in (p, *p.parents):
        if (d / ".dvc").is_dir():
            return d
    return None


def dvc_files(root: str | os.PathLike[str]) -> list[str]:
    """The ``*.dvc`` files and ``dvc.lock`` files under ``root`` (POSIX, relative, sorted).

    Inside a git checkout: the ones git tracks plus untracked ones it does not ignore (``git
    ls-files``; fast, and ignored folders such as the data itself are never walked).
    Elsewhere (an exported tree): a walk of at most ``_WALK_LIMIT`` folders, hidden ones skipped.
    """
    base = Path(root)
    out = _run_git(["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.dvc", "*dvc.lock"], base)
    if out is not None:
        names = {n for n in out.split("\0") if n}
    else:
        names = set()
        for n, (dirpath, dirs, files) in enumerate(os.walk(base)):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")]
            if n >= _WALK_LIMIT:
                break
            rel = Path(dirpath).relative_to(base)
            names.update((rel / f).as_posix() for f in files if f.endswith(".dvc") or f == "dvc.lock")
    keep = [n for n in names if PurePosixPath(n).name == "dvc.lock" or (n.endswith(".dvc") and PurePosixPath(n).name != ".dvc")]
    return sorted(n[2:] if n.startswith("./") else n for n in keep if (base / n).is_file())


def _outs_of(node: Any) -> list[dict[str, Any]]:
    """The output entries of a parsed DVC file: ``outs`` of a ``.dvc`` file, of every stage of a lock."""
    if not isinstance(node, dict):
        return []
    found = [o for o in node.get("outs") or () if isinstance(o, dict)]
    stages = node.get("stages")
    if isinstance(stages, dict):
        for stage in stages.values():
            if isinstance(stage, dict):
                found += [o for o in stage.get("outs") or () if isinstance(o, dict)]
    return found


def _norm(base: PurePosixPath, path: str) -> str:
    return os.path.normpath((base / path).as_posix()).replace(os.sep, "/")


_REGEX_OUT = re.compile(r"^\s*-?\s*(md5|etag|checksum)\s*:\s*(\S+)", re.M)


def read_outs(root: str | os.PathLike[str], dvcfile: str) -> list[DvcOut]:
    """The outputs ``dvcfile`` (relative to ``root``) declares; paths made relative to ``root``."""
    text = (Path(root) / dvcfile).read_text()
    base = PurePosixPath(dvcfile).parent
    try:
        import yaml  # a core dependency

        data = yaml.load(text, Loader=getattr(yaml, "CBaseLoader", yaml.BaseLoader))  # every scalar a string:
        # a hash of digits stays the hash
    except ImportError:  # no YAML reader: the hashes alone, named by the file
        return [DvcOut(dvcfile, dvcfile, m.group(1), m.group(2)) for m in _REGEX_OUT.finditer(text)]
    outs = []
    for o in _outs_of(data):
        path = o.get("path")
        kind = next((k for k in _HASH_KEYS if isinstance(o.get(k), str)), None)
        if not isinstance(path, str) or kind is None:
            continue
        outs.append(DvcOut(dvcfile, _norm(base, path), kind, o[kind], legacy=kind == "md5" and o.get("hash") != "md5"))
    return outs


def tracked_outs(root: str | os.PathLike[str]) -> list[DvcOut]:
    """Every output the DVC files under ``root`` declare (``dvc_files`` order)."""
    outs: list[DvcOut] = []
    for f in dvc_files(root):
        outs += read_outs(root, f)
    return outs


def data_version(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The data version of the checkout at ``root``: ``{"dvc": {FILE: {OUT: HASH}}}``, or
    None when it has no DVC files. A file that cannot be read records ``{"error": ...}``."""
    files = dvc_files(root)
    if not files:
        return None
    version: dict[str, Any] = {}
    for f in files:
        try:
            version[f] = {o.path: o.value for o in read_outs(root, f)}
        except Exception as e:  # noqa: BLE001 - a record, not a check: say what went wrong
            version[f] = {"error": f"{type(e).__name__}: {e}"}
    return {"dvc": version}


def cache_file(cache: str | os.PathLike[str], out: DvcOut) -> Path | None:
    """Where the cache at ``cache`` keeps ``out``'s object (a folder's: its ``.dir`` listing);
    None for a hash the local cache does not key by (cloud ``etag``/``checksum``)."""
    if out.hash != "md5" or len(out.value) < 3:
        return None
    base = Path(cache) if out.legacy else Path(cache) / "files" / "md5"
    return base / out.value[:2] / out.value[2:]


def missing_from_cache(cache: str | os.PathLike[str], out: DvcOut) -> bool:
    """Whether the cache lacks ``out`` (for a folder: its listing or any file it lists)."""
    f = cache_file(cache, out)
    if f is None:
        return False  # not keyed by the local cache: DVC decides
    if not f.is_file():
        return True
    if not out.is_dir:
        return False
    try:
        entries = json.loads(f.read_text())
    except (OSError, ValueError):
        return True
    for e in entries if isinstance(entries, list) else ():
        h = e.get("md5") if isinstance(e, dict) else None
        if isinstance(h, str) and missing_from_cache(cache, DvcOut(out.dvcfile, out.path, "md5", h, out.legacy)):
            return True
    return False
