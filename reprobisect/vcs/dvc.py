"""DVC data at a revision: a probe's checkout gets its own commit's data from the user's cache.

``dvc_pull_at(worktree, repo)`` makes the DVC-tracked outputs that the checkout's ``*.dvc``
files and ``dvc.lock`` declare (``reprobisect.vcs.dvcfiles``) appear in the checkout, taken
from the user's DVC cache, never copied:

1. It writes the checkout's ``.dvc/config.local`` (untracked, ignored by DVC's own
   ``.gitignore``; the user's checkout and ``.dvc/config`` are never written): the user's
   cache folder as ``cache.dir``, and as ``cache.type`` the user's link types without
   ``copy``, then ``reflink,hardlink,symlink`` (so a file is a reflink, a hard link or a
   symbolic link into the cache: no second copy of a dataset per probe). The user's own
   ``.dvc/config.local`` (remotes, credentials) is carried over; a remote whose URL is a
   relative folder is made absolute against the user's project, where it was meant.
   A checkout without ``.git`` (a Ray worker's unpacked archive) also gets ``core.no_scm``.
2. It reads which outputs the cache lacks (no DVC call). Nothing lacking: ``dvc checkout``.
   Something lacking and a default remote configured (``core.remote``, at any level DVC
   reads): ``dvc pull`` into the user's cache, once per cache at a time. Lacking and no
   remote: status ``missing``, naming the outputs and the fix, without running DVC.
3. Outputs at, under or above a ``--link`` path (``links``) are left alone: the link is
   the user's file, and DVC must never write through it.

The result (``DvcResult``) is falsy when the data could not be restored (``missing``,
``failed``): the probe is then ``skip`` with the result's detail
(``reprobisect.executors.process``), never good or bad on data it did not have, and not
cached (``data_skip``): the same probe runs again once the data is there. DVC is an
optional dependency (the ``dvc`` extra): it runs as a subprocess (``python -m dvc``) and
is never imported here. ``REPROBISECT_DVC=0`` turns the whole step off.

Never raises for a DVC failure. Hard links and symbolic links share the cache's bytes:
DVC makes cache files read-only, and a probe must not write to its data (DVC's own rule
for these link types; a reflink is copy-on-write and safe).
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from reprobisect.vcs.dvcfiles import DvcOut, cache_file, missing_from_cache, project_root, tracked_outs

__all__ = ["DATA_SKIP", "DvcResult", "data_mode", "data_skip", "dvc_pull_at", "enabled", "user_cache"]

DATA_SKIP = "DVC data"
"""How the detail of a probe skipped for its data begins (``data_skip``)."""
LINK_TYPES = ("reflink", "hardlink", "symlink")
"""Link types that never copy, in the order tried after the user's own."""
PULL_TIMEOUT_S = 3600.0
"""Default limit for one DVC command (a pull of a large dataset may take a while)."""

_PULL_LOCKS: dict[str, threading.Lock] = {}
_PULL_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True)
class DvcResult:
    """What ``dvc_pull_at`` did; truthy unless DVC data was expected and could not be restored."""

    status: str
    """``none`` (no DVC-tracked output here, or all under ``--link`` paths), ``checked_out``
    (from the user's cache), ``pulled`` (from the remote into the user's cache), ``missing``
    (not in the cache and no remote), ``failed`` (DVC failed or is not installed)."""
    detail: str = ""
    wall_s: float = 0.0
    outs: tuple[str, ...] = ()
    """The outputs restored (or, when ``missing``, those the cache lacks)."""
    link: str = ""
    """How the first restored file reached the checkout: ``hardlink``, ``symlink`` or ``reflink``."""
    cache: str = ""
    """The cache the data came from."""
    skipped: tuple[str, ...] = field(default=())
    """Outputs left alone because a ``--link`` path covers them."""

    def __bool__(self) -> bool:
        return self.status not in ("missing", "failed")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def data_skip(detail: str | None) -> bool:
    """Whether a probe's outcome detail says it was skipped for its DVC data (not cached:
    the data may be there next time)."""
    return bool(detail) and str(detail).startswith(DATA_SKIP)


def enabled(env: dict[str, str] | None = None) -> bool:
    """False when ``REPROBISECT_DVC`` is ``0``/``off``/``false`` (in ``env`` or this process's)."""
    v = (env or {}).get("REPROBISECT_DVC", os.environ.get("REPROBISECT_DVC", "1"))
    return v.strip().lower() not in ("0", "off", "false", "no")


def data_mode(start: str | os.PathLike[str], env: dict[str, str] | None = None) -> str | None:
    """What a probe starting in ``start`` (the user's checkout) does with DVC data: ``dvc``
    (restored), ``dvc off`` (``REPROBISECT_DVC=0``), None (no DVC project there). Part of a
    probe's cache key, so a verdict reached without the data is never reused with it."""
    if project_root(start) is None:
        return None
    return "dvc" if enabled(env) else "dvc off"


# --------------------------------------------------------------------------- DVC's config files


def _unquote(v: str) -> str:
    v = v.strip()
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"" else v


def _read_config(path: Path) -> dict[str, dict[str, str]]:
    """A DVC config file as {section: {key: value}}; section names unquoted (``remote "s3"``)."""
    cfg = configparser.RawConfigParser(strict=False)
    cfg.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        cfg.read(path)
    except (configparser.Error, UnicodeDecodeError):
        return {}
    return {_unquote(s): {k: _unquote(v) for k, v in cfg.items(s)} for s in cfg.sections()}


def _global_dirs() -> list[Path]:
    """DVC's global (per user) and system config folders, as DVC finds them."""
    out = []
    g = os.environ.get("DVC_GLOBAL_CONFIG_DIR")
    if not g:
        home = Path.home()
        g = (str(home / "Library" / "Application Support" / "dvc") if sys.platform == "darwin"
             else str(Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "dvc"))
    out.append(Path(g))
    s = os.environ.get("DVC_SYSTEM_CONFIG_DIR") or (
        "/Library/Application Support/dvc" if sys.platform == "darwin" else "/etc/xdg/dvc")
    out.append(Path(s))
    return out


def _levels(project: Path) -> list[tuple[Path, dict[str, dict[str, str]]]]:
    """(folder a relative path is resolved against, config) for each level, strongest first."""
    files = [project / ".dvc" / "config.local", project / ".dvc" / "config", *(d / "config" for d in _global_dirs())]
    return [(f.parent, _read_config(f)) for f in files if f.is_file()]


def _lookup(levels: list[tuple[Path, dict[str, dict[str, str]]]], section: str, key: str) -> tuple[Path, str] | None:
    for base, cfg in levels:
        v = cfg.get(section, {}).get(key)
        if v:
            return base, v
    return None


def _dvc_cache_of(project: Path) -> Path | None:
    """The cache folder a DVC project's config sets (``cache.dir``, relative to the file that sets it)."""
    found = _lookup(_levels(project), "cache", "dir")
    if found is None:
        return None
    base, d = found
    return Path(d) if os.path.isabs(d) else (base / d).resolve()


def user_cache(project: str | os.PathLike[str]) -> Path:
    """The user's DVC cache for the project at ``project``: ``cache.dir``, else ``.dvc/cache``."""
    p = Path(project)
    return _dvc_cache_of(p) or (p / ".dvc" / "cache").resolve()


def _link_types(levels: list[tuple[Path, dict[str, dict[str, str]]]]) -> list[str]:
    """The user's ``cache.type`` without ``copy``, then the other types that never copy."""
    found = _lookup(levels, "cache", "type")
    given = [t.strip() for t in (found[1] if found else "").split(",") if t.strip()]
    out = [t for t in given if t in LINK_TYPES]
    return out + [t for t in LINK_TYPES if t not in out]


def _is_local_path(url: str) -> bool:
    return "://" not in url and not (len(url) > 1 and url[1] == ":" and url[0].isalpha() and os.sep == "\\")


def _local_config(project: Path, user_project: Path, cache: Path, git: bool) -> tuple[str, bool]:
    """The checkout's ``.dvc/config.local`` text, and whether a default remote is configured."""
    user = _read_config(user_project / ".dvc" / "config.local")
    tracked = _read_config(project / ".dvc" / "config")
    sections: dict[str, dict[str, str]] = {s: dict(kv) for s, kv in user.items()}
    for s in set(tracked) | set(user):  # a relative remote folder: against the user's project, where it was meant
        url = user.get(s, {}).get("url") or tracked.get(s, {}).get("url")
        if s.startswith("remote ") and url and _is_local_path(url) and not os.path.isabs(url):
            sections.setdefault(s, {})["url"] = str((user_project / ".dvc" / url).resolve())
    core = sections.setdefault("core", {})
    core["check_update"] = "false"
    core["site_cache_dir"] = str(project / ".dvc" / "tmp" / "site-cache")  # goes with the checkout
    if not git:
        core["no_scm"] = "true"
    sections.setdefault("cache", {}).update(dir=str(cache), type=",".join(_link_types(_levels(user_project))))
    outside = [(d, _read_config(d / "config")) for d in _global_dirs() if (d / "config").is_file()]
    remote = _lookup([(project / ".dvc", sections), (project / ".dvc", tracked), *outside], "core", "remote")
    lines = []
    for s, kv in sections.items():
        lines.append(f"['{s}']" if '"' in s else f"[{s}]")
        lines += [f"    {k} = {_quote(v)}" for k, v in kv.items()]
    return "\n".join(lines) + "\n", remote is not None


def _quote(v: str) -> str:
    """A value as DVC's config writer quotes it (a comma would make it a list)."""
    if not any(c in v for c in " ,#'\"\t"):
        return v
    return f'"{v}"' if '"' not in v else f"'{v}'"


# --------------------------------------------------------------------------- restoring the data


def _covered(out: str, links: tuple[str, ...]) -> bool:
    return any(out == ln or out.startswith(ln + "/") or ln.startswith(out + "/") for ln in links)


def _link_kind(path: Path, cache: Path, out: DvcOut) -> str:
    """How ``path`` reached the checkout: a symlink, a hard link to the cache object, else a reflink."""
    if path.is_symlink():
        return "symlink"
    obj = cache_file(cache, out)
    try:
        if obj is not None and path.is_file() and os.path.samefile(path, obj):
            return "hardlink"
    except OSError:
        pass
    return "reflink" if path.exists() else ""


def _pull_lock(cache: Path) -> threading.Lock:
    with _PULL_LOCKS_GUARD:
        return _PULL_LOCKS.setdefault(str(cache), threading.Lock())


def _find_project(wt: Path, subdir: str) -> Path | None:
    start = (wt / subdir).resolve()
    for d in (start, *start.parents):
        if (d / ".dvc").is_dir():
            return d
        if d == wt:
            break
    return None


def dvc_pull_at(
    worktree: str | os.PathLike[str],
    repo: Any,
    *,
    subdir: str = ".",
    pull: bool = True,
    links: tuple[str, ...] | list[str] = (),
    timeout: float | None = PULL_TIMEOUT_S,
    track: Callable[[int, bool], None] | None = None,
) -> DvcResult:
    """Restore the DVC-tracked data of the checkout ``worktree`` of the user's repository ``repo``.

    ``repo``: the user's repository root (a path, or anything with ``.root``), whose DVC
    cache and ``.dvc/config.local`` are used, never written (a ``pull`` adds objects to
    that cache, as the user's own ``dvc pull`` would). ``subdir``: where the command runs;
    the DVC project is the nearest ``.dvc`` at or above it inside ``worktree``. ``pull``:
    fetch what the cache lacks from the default remote. ``links``: ``--link`` paths
    (relative to the repository root) whose outputs are left alone. ``track(pid, running)``:
    told when a DVC process starts and ends (its process group), so that an executor can
    kill it with its probes. Never raises for a DVC failure: see ``DvcResult``.
    """
    t0 = time.monotonic()

    def done(status: str, detail: str, **kw: Any) -> DvcResult:
        return DvcResult(status, detail, round(time.monotonic() - t0, 3), **kw)

    wt = Path(worktree).resolve()
    project = _find_project(wt, subdir)
    if project is None:
        return done("none", "no DVC project in the checkout")
    rel = project.relative_to(wt)
    user_project = Path(repo if isinstance(repo, (str, os.PathLike)) else repo.root).resolve() / rel
    outs = tracked_outs(project)
    prefix = "" if str(rel) == "." else rel.as_posix() + "/"
    skipped = tuple(o.path for o in outs if _covered(prefix + o.path, tuple(links)))
    outs = [o for o in outs if o.path not in skipped]
    if not outs:
        why = "every DVC output is under a --link path" if skipped else "no DVC-tracked output at this commit"
        return done("none", why, skipped=skipped)
    if importlib.util.find_spec("dvc") is None:
        return done("failed", f"{DATA_SKIP}: this commit tracks data with DVC ({outs[0].path}); "
                              "DVC is not installed: pip install 'reprobisect[dvc]' (or set REPROBISECT_DVC=0)")
    git = (wt / ".git").exists()
    if not (user_project / ".dvc").is_dir():
        return _no_user_cache(done, outs, user_project, project, skipped, pull=pull, timeout=timeout, git=git,
                              track=track)
    cache = user_cache(user_project)
    text, remote = _local_config(project, user_project, cache, git=git)
    (project / ".dvc" / "config.local").write_text(text)
    lacking = [o for o in outs if missing_from_cache(cache, o)]
    targets = [o.path for o in outs] if skipped else []
    info = dict(outs=tuple(o.path for o in outs), cache=str(cache), skipped=skipped)
    if lacking and not (pull and remote):
        names = ", ".join(f"{o.path} ({o.hash} {o.value[:8]}…)" for o in lacking[:3]) + (
            f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
        return done("missing", f"{DATA_SKIP} missing: {names} not in the DVC cache {cache} and no DVC remote is "
                               "configured; fetch it into the cache (dvc fetch) or add a default remote "
                               "(dvc remote add -d NAME URL)", **{**info, "outs": tuple(o.path for o in lacking)})
    try:
        if not lacking:
            co = _dvc(project, timeout, track, "checkout", *targets)
            if co.returncode == 0:
                return done("checked_out", f"from the cache {cache}", link=_kind(project, cache, outs), **info)
            if not (pull and remote):
                return done("failed", f"{DATA_SKIP}: dvc checkout failed: {_last_line(co)}", **info)
        with _pull_lock(cache):
            pl = _dvc(project, timeout, track, "pull", *targets)
        if pl.returncode == 0:
            return done("pulled", f"from the DVC remote into the cache {cache}", link=_kind(project, cache, outs), **info)
        return done("failed", f"{DATA_SKIP}: dvc pull failed: {_last_line(pl)}", **info)
    except subprocess.TimeoutExpired:
        return done("failed", f"{DATA_SKIP}: dvc did not finish within {timeout:g} s", **info)


def _no_user_cache(done: Any, outs: list[DvcOut], user_project: Path, project: Path, skipped: tuple[str, ...], *,
                   pull: bool, timeout: float | None, git: bool, track: Callable[[int, bool], None] | None) -> DvcResult:
    """The user's DVC project is not here (a Ray node without the shared file system, or a
    checkout of the user's that no longer uses DVC): pull into the checkout's own cache
    when a remote is configured, else say why not."""
    if not (pull and _lookup(_levels(project), "core", "remote")):
        where = (f"the user's checkout {user_project} has no DVC project (.dvc), so there is no cache to take "
                 f"{outs[0].path} from" if user_project.is_dir() else
                 f"the DVC cache of {user_project} is not visible on {os.uname().nodename}; run where that folder "
                 "is visible (--executor local, or Ray with a shared file system)")
        return done("missing", f"{DATA_SKIP} missing: {where}, and no DVC remote is configured", skipped=skipped,
                    outs=tuple(o.path for o in outs))
    cache = project / ".dvc" / "cache"
    core = "[core]\n    check_update = false\n" + ("" if git else "    no_scm = true\n")
    (project / ".dvc" / "config.local").write_text(core + f"[cache]\n    type = {','.join(LINK_TYPES)},copy\n")
    try:
        pl = _dvc(project, timeout, track, "pull", *([o.path for o in outs] if skipped else []))
    except subprocess.TimeoutExpired:
        return done("failed", f"{DATA_SKIP}: dvc did not finish within {timeout:g} s")
    if pl.returncode == 0:
        return done("pulled", f"from the DVC remote into the checkout's own cache (the user's is not visible on "
                              f"{os.uname().nodename})", outs=tuple(o.path for o in outs), cache=str(cache), skipped=skipped)
    return done("failed", f"{DATA_SKIP}: dvc pull failed: {_last_line(pl)}")


def _kind(project: Path, cache: Path, outs: list[DvcOut]) -> str:
    for o in outs:
        p = project / o.path
        if o.is_dir and p.is_dir():
            first = next((f for f in sorted(p.rglob("*")) if f.is_file() or f.is_symlink()), None)
            if first is not None:
                return "symlink" if first.is_symlink() else ("hardlink" if first.stat().st_nlink > 1 else "reflink")
        elif p.exists() or p.is_symlink():
            return _link_kind(p, cache, o)
    return ""


def _dvc(project: Path, timeout: float | None, track: Callable[[int, bool], None] | None,
         *args: str) -> subprocess.CompletedProcess:
    """``python -m dvc ARGS -q`` in ``project``, in a process group of its own; ``track(pid,
    running)`` is told when it starts and ends (the executor kills it on Ctrl-C)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    env["DVC_NO_ANALYTICS"] = "1"
    cmd = [sys.executable, "-m", "dvc", args[0], "-q", *args[1:]]
    proc = subprocess.Popen(cmd, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    if track is not None:
        track(proc.pid, True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        raise
    finally:
        if track is not None:
            track(proc.pid, False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _last_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (p.stderr or p.stdout or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else f"exit {p.returncode}"
