"""May reprobisect write this report file? One rule for every file-writing output option.

``bisect report --html``, ``bisect audit --junit/--json/--html`` (and the library calls
behind them) write a file the user named. A typo or a shell history slip must not replace
someone's page, notes or CI config, so a report goes only to

- a path where nothing is yet (its folder must exist and take a new file), or an empty file;
- a file this tool wrote, recognised by its content (``is_ours``): an HTML page carrying
  ``<meta name='generator' content='reprobisect ...'>`` near its start (``HTML_GENERATOR``),
  a JUnit file carrying the comment ``JUNIT_MARKER`` near its start, a JSON document
  (at most ``MAX_JSON_BYTES``) whose top level has ``"generator": "reprobisect"`` or a
  ``kind`` of ``reprobisect.*`` and an integer ``version``.

Anything else -- another file, a symbolic link (even to one of ours: the write would land
elsewhere), a folder, a FIFO, socket or device -- is one ``UsageError`` naming the path
and the fix, and the path is left exactly as it was. ``check_output_file`` is the rule;
``atomic_write`` applies it again and then writes a temp file beside the target (fsynced,
mode 0644) and renames it into place, so a reader never sees half a report and a failed
write leaves nothing behind. Commands call ``check_output_file`` for every output when
their options are parsed, before the work (a night's audit is never spent to fail at the
end), and the write checks again.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

from reprobisect.errors import TraceError, UsageError
from reprobisect.render.safe import printable
from reprobisect.trace.jsonsafe import is_int, loads_bounded

__all__ = ["KINDS", "HTML_GENERATOR", "JUNIT_MARKER", "JSON_GENERATOR", "check_output_file", "is_ours",
           "atomic_write"]

KINDS = ("html", "junit", "json")
"""The report formats this rule knows."""
HTML_GENERATOR = "reprobisect"
"""The ``content`` of an HTML page's generator ``<meta>`` starts with this."""
JUNIT_MARKER = "<!-- generator: reprobisect -->"
"""The comment right after the XML declaration of a JUnit file reprobisect wrote."""
JSON_GENERATOR = "reprobisect"
"""The value of a JSON document's top-level ``generator`` key."""
MAX_JSON_BYTES = 64 * 2**20
_WHAT = {"html": "an HTML report", "junit": "a JUnit report", "json": "a JSON document"}
_HEAD = 4096
"""How far into an HTML or JUnit file its marker is looked for (both are written in the first few hundred bytes)."""


def _head(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read(_HEAD)


def _json_is_ours(p: Path) -> bool:
    if p.stat().st_size > MAX_JSON_BYTES:
        return False
    try:
        doc = loads_bounded(p.read_bytes())
    except (TraceError, ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    kind = doc.get("kind")
    return doc.get("generator") == JSON_GENERATOR or (
        isinstance(kind, str) and kind.startswith("reprobisect.") and is_int(doc.get("version")))


def is_ours(path: str | os.PathLike, kind: str) -> bool:
    """Whether the regular file at ``path`` is a ``kind`` report reprobisect wrote (read: its start, or the
    whole document for JSON). An unreadable file is not ours."""
    p = Path(path)
    try:
        if kind == "json":
            return _json_is_ours(p)
        head = _head(p).decode("utf-8", "replace")
    except OSError:
        return False
    if kind == "html":
        return any(f"<meta name={q}generator{q} content={q}{HTML_GENERATOR}" in head for q in "'\"")
    if kind == "junit":
        return JUNIT_MARKER in head
    raise ValueError(f"unknown report kind {kind!r}; known: {', '.join(KINDS)}")


def _refuse(option: str, path: Any, why: str, fix: str) -> UsageError:
    return UsageError(f"{option} '{printable(path)}' {why}; {fix}")


def _folder_takes_a_file(option: str, path: Path, folder: Path) -> None:
    """The folder exists and a file can be created in it (``os.access`` is wrong for root and read-only mounts)."""
    if not folder.is_dir():
        raise _refuse(option, path, f"cannot be written: no folder '{printable(folder)}'",
                      f"create it or pass another {option}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".reprobisect-probe-", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise _refuse(option, path, f"cannot be written: folder '{printable(folder)}' takes no new file "
                      f"({e.strerror or e})", f"pass another {option}") from None


def check_output_file(path: str | os.PathLike, kind: str, *, option: str = "output file") -> Path:
    """``path`` if a ``kind`` report may be written there (see the module doc), else one ``UsageError``.

    ``option`` names the path in the message (``--html``); nothing at ``path`` is changed."""
    if kind not in KINDS:
        raise ValueError(f"unknown report kind {kind!r}; known: {', '.join(KINDS)}")
    p = Path(path)
    try:
        st = p.lstat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _refuse(option, p, f"cannot be looked at ({e.strerror or e})", f"pass another {option}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(option, p, "is a symbolic link; a report is written only to a plain path",
                          "pass the path it points to, another path, or remove the link yourself")
        if stat.S_ISDIR(st.st_mode):
            raise _refuse(option, p, "is a folder", f"give a file path for the report ({option} FOLDER/report.{kind})")
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(option, p, "is not a regular file (a FIFO, socket or device)", f"pass another {option}")
        if st.st_size and not is_ours(p, kind):
            raise _refuse(option, p, f"exists and is not {_WHAT[kind]} reprobisect wrote; it is left untouched",
                          f"pass another {option}, or delete the file yourself if it may go")
    _folder_takes_a_file(option, p, p.parent if str(p.parent) else Path("."))
    return p


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, kind: str,
                 option: str = "output file") -> Path:
    """Check ``path`` (``check_output_file``), call ``write(tmp)`` on a temp file beside it, fsync it and
    rename it over ``path``; returns ``path``. On any failure the temp file is removed and ``path`` is as before."""
    target = check_output_file(path, kind, option=option)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent if str(target.parent) else ".")
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # a report others read (CI artifacts), not mkstemp's private 0600
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
