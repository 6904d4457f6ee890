"""The audit's report files, each written atomically (a temp file renamed into place).

``write_junit``: one ``<testcase>`` per check (classname: the config's name); a divergence
is a ``<failure>`` whose message is the first-divergence line, an inconclusive check an
``<error>``; written with junitparser, the format CI systems read. ``write_json``: the
audit result document. ``write_html``: ``reprobisect.report.html.write_report`` when the
report package is installed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from reprobisect.errors import UsageError

__all__ = ["atomic_write", "write_json", "write_junit", "write_html", "html_writer"]


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temp file beside ``path``, then rename it over ``path``."""
    target = Path(path).resolve()
    if target.is_dir():
        raise UsageError(f"'{path}' is a folder; give a file path for the report")
    if not target.parent.is_dir():
        raise UsageError(f"folder '{target.parent}' does not exist; create it or choose another report path")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # a report others read (CI artifacts), not mkstemp's private 0600
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def write_json(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    return atomic_write(path, lambda p: p.write_text(json.dumps(doc, indent=2, default=str) + "\n"))


def write_junit(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """The JUnit XML of an audit result document."""
    try:
        from junitparser import Error, Failure, JUnitXml, TestCase, TestSuite
    except ImportError:
        raise UsageError("--junit needs junitparser: pip install 'reprobisect[report]' (or use --json)") from None

    suite = TestSuite(doc["name"])
    for c in doc["checks"]:
        case = TestCase(c["name"], classname=doc["name"], time=c["wall_s"])
        text = "\n".join(x for x in (c.get("bisect"), *(c.get("envdiff") or ())) if x)
        if c["verdict"] == "diverged":
            case.result = [Failure(c["line"], "diverged")]
        elif c["verdict"] == "inconclusive":
            case.result = [Error(c["line"], "inconclusive")]
        if text and case.result:
            case.result[0].text = text
        case.system_out = f"{c['verdict']}: {c['line']}"
        suite.add_testcase(case)
    suite.update_statistics()
    xml = JUnitXml(doc["name"])
    xml.add_testsuite(suite)
    xml.update_statistics()
    return atomic_write(path, lambda p: xml.write(str(p), pretty=True))


def html_writer() -> Callable[[Any, Path], Any]:
    """``reprobisect.report.html.write_report``; a one-line ``UsageError`` when it is not installed
    (asked before the audit runs, so a night is never spent to fail at the end)."""
    import importlib.util

    from reprobisect.report.html import write_report

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--html draws its plots with matplotlib, which is not installed: "
                         "pip install 'reprobisect[report]' (or use --json / --junit)")
    return write_report


def write_html(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """The HTML report of an audit result document (written atomically by the report package)."""
    return Path(html_writer()(doc, Path(path)))
