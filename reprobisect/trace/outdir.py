"""Where ``-o/--out`` may write: a new folder, an empty one, or one reprobisect verifiably wrote.

Every command with ``-o`` goes through here before anything runs. A folder is reprobisect's
when its ``manifest.json`` parses as a trace manifest (``format`` is the trace format's
name and ``version`` an integer: a file merely *named* ``manifest.json`` is not enough),
or, for the folders that collect many traces (``runs``, ``repro``, ``seeds``, ``envs``,
``probe``), when it carries the marker ``.reprobisect-output.json`` this module writes, or
holds nothing but traces. Anything else is refused with one line and nothing is touched.
A folder that cannot be written (read-only, no permission) is one line too, before any
probe runs.

Core module: imports no ML framework.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from reprobisect.errors import UsageError
from reprobisect.trace.jsonsafe import is_int

__all__ = ["is_trace_dir", "check_trace_target", "prepare_output_dir", "MARKER", "MARKER_FORMAT"]

MARKER = ".reprobisect-output.json"
MARKER_FORMAT = "reprobisect-output"


def _manifest_ok(path: Path, fmt: str) -> bool:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    if not isinstance(raw, dict) or raw.get("format") != fmt:
        return False
    version = raw.get("version")
    return is_int(version) and version >= 1


def is_trace_dir(path: str | os.PathLike) -> bool:
    """True when ``path`` is a folder whose ``manifest.json`` parses as a reprobisect trace manifest."""
    from reprobisect.trace.format import FORMAT

    p = Path(path)
    return p.is_dir() and not p.is_symlink() and _manifest_ok(p / "manifest.json", FORMAT)


def _is_output_dir(p: Path) -> bool:
    if _manifest_ok(p / MARKER, MARKER_FORMAT):
        return True
    entries = [e for e in p.iterdir() if not e.name.startswith(".")]
    return bool(entries) and all(is_trace_dir(e) for e in entries)


def _writable(folder: Path, what: str, flag: str) -> None:
    """Prove ``folder`` takes a new file (os.access lies for root and read-only mounts)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".reprobisect-write-test-", dir=folder)
    except OSError as e:
        raise UsageError(
            f"cannot write to {what} '{folder}' ({e.strerror or e}); choose a writable {flag} path"
        ) from None
    os.close(fd)
    os.unlink(name)


def _make_parent(folder: Path, flag: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"'{folder}' is a file, not a folder; choose another {flag} path (nothing was deleted)") from None
    except OSError as e:
        raise UsageError(f"cannot create folder '{folder}' ({e.strerror or e}); choose a writable {flag} path") from None


def check_trace_target(path: str | os.PathLike, flag: str = "-o") -> Path:
    """Refuse a trace output path that is neither new, empty nor a reprobisect trace; check it can be written.

    Returns the path. Creates the missing parent folders (not the trace folder itself).
    """
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        raise UsageError(f"'{path}' exists and is not a trace folder; choose another {flag} path (nothing was deleted)")
    if p.is_dir():
        try:
            empty = not any(p.iterdir())
        except OSError as e:
            raise UsageError(f"cannot read folder '{path}' ({e.strerror or e}); choose another {flag} path") from None
        if not empty and not is_trace_dir(p):
            raise UsageError(
                f"'{path}' is a non-empty folder that is not a reprobisect trace; "
                f"choose another {flag} path (nothing was deleted)"
            )
        _writable(p, "output folder", flag)
    _make_parent(p.parent, flag)
    _writable(p.parent, "the folder of", flag)  # a trace is replaced through a sibling + rename
    return p


def prepare_output_dir(path: str | os.PathLike, flag: str = "-o") -> Path:
    """Make ``path`` ready to collect traces: new, empty, or reprobisect's own; else one UsageError.

    Creates the folder and writes the marker that identifies it as reprobisect's next time.
    """
    p = Path(path)
    if p.is_symlink() and not p.is_dir():
        raise UsageError(f"'{path}' is a dangling link; choose another {flag} path")
    if p.exists() and not p.is_dir():
        raise UsageError(f"'{path}' is a file, not a folder; choose another {flag} path (nothing was deleted)")
    if p.is_dir():
        try:
            empty = not any(p.iterdir())
            ours = empty or _is_output_dir(p)
        except OSError as e:
            raise UsageError(f"cannot read folder '{path}' ({e.strerror or e}); choose another {flag} path") from None
        if not ours:
            raise UsageError(
                f"'{path}' is a non-empty folder that reprobisect did not write; "
                f"choose a new or empty {flag} folder (nothing was touched)"
            )
    else:
        _make_parent(p, flag)
    marker = p / MARKER
    if not _manifest_ok(marker, MARKER_FORMAT):
        tmp = p / f"{MARKER}.tmp{os.getpid()}"
        try:
            tmp.write_text(json.dumps({"format": MARKER_FORMAT, "version": 1}) + "\n")
            os.replace(tmp, marker)
        except OSError as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise UsageError(f"cannot write to output folder '{path}' ({e.strerror or e}); choose a writable {flag} path") from None
    else:
        _writable(p, "output folder", flag)
    return p
