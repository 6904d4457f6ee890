"""DVC data at a revision: restore a probe worktree's DVC-tracked files from the user's cache.

``dvc_pull_at(worktree, repo)`` points the worktree's DVC at the user's cache
(``.dvc/config.local``, untracked) and runs ``dvc checkout``, then ``dvc pull`` for what
the cache lacks; best-effort, a failure is reported, not raised. DVC is an optional
dependency (the ``dvc`` extra): it runs as a subprocess (``python -m dvc``) and is never
imported here. Moved out of ``reprobisect.vcs.git``; nothing calls it yet (issue 11).
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reprobisect.vcs.git import RepoInfo, open_repo

__all__ = ["DvcResult", "dvc_pull_at"]


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
    main_project = (repo if isinstance(repo, RepoInfo) else open_repo(repo)).root / rel
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
