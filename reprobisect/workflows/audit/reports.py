"""The audit's report files, each written atomically (a temp file renamed into place).

``write_junit``: one ``<testcase>`` per check (classname: the config's name); a divergence
is a ``<failure>`` whose message is the first-divergence line, an inconclusive check an
``<error>``; written with junitparser, the format CI systems read. ``write_json``: the
audit result document. ``write_html``: ``reprobisect.report.html.write_report`` when the
report package is installed.

Every file goes through ``reprobisect.trace.outfile``: it is written only to a new path
or over a report of its kind that reprobisect wrote (``check_outputs`` asks before the
audit runs; each write asks again). Names in the JUnit file pass through
``reprobisect.render.safe``: a control character in a check's name or line is shown as
its escape, so the XML stays valid (XML 1.0 cannot hold most C0 controls, even as entities).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from reprobisect.errors import UsageError
from reprobisect.render.safe import printable, printable_lines
from reprobisect.trace import outfile
from reprobisect.trace.outfile import JUNIT_MARKER, check_output_file

__all__ = ["atomic_write", "check_outputs", "write_json", "write_junit", "write_html", "html_writer"]

_OPTION = {"json": "--json", "junit": "--junit", "html": "--html"}


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, kind: str = "json") -> Path:
    """Call ``write(tmp)`` on a temp file beside ``path``, then rename it over ``path`` (when
    ``outfile.check_output_file`` lets a ``kind`` report be written there); the absolute path."""
    return Path(os.path.abspath(outfile.atomic_write(path, write, kind=kind, option=_OPTION.get(kind, "output file"))))


def check_outputs(paths: Mapping[str, str | os.PathLike | None]) -> None:
    """Check every report path (kind -> path, ``None`` when not asked for) before any work: each
    may be written (``check_output_file``) and no two name the same file."""
    seen: dict[str, str] = {}
    for kind, p in paths.items():
        if p is None:
            continue
        check_output_file(p, kind, option=_OPTION[kind])
        key = os.path.normcase(os.path.abspath(p))
        if key in seen:
            raise UsageError(f"{seen[key]} and {_OPTION[kind]} both name '{printable(p)}'; give each report its own file")
        seen[key] = _OPTION[kind]


def write_json(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    return atomic_write(path, lambda p: p.write_text(json.dumps(doc, indent=2, default=str) + "\n"), kind="json")


def _junit_xml(doc: dict[str, Any]) -> Any:
    """The junitparser document; every name and text shown with its control characters escaped."""
    from junitparser import Error, Failure, JUnitXml, TestCase, TestSuite

    name = printable(doc["name"])
    suite = TestSuite(name)
    suite.add_property("generator", "reprobisect")
    for c in doc["checks"]:
        line = printable(c["line"])
        case = TestCase(printable(c["name"]), classname=name, time=c["wall_s"])
        text = "\n".join(printable_lines(x) for x in (c.get("bisect"), *(c.get("envdiff") or ())) if x)
        if c["verdict"] == "diverged":
            case.result = [Failure(line, "diverged")]
        elif c["verdict"] == "inconclusive":
            case.result = [Error(line, "inconclusive")]
        if text and case.result:
            case.result[0].text = text
        case.system_out = f"{printable(c['verdict'])}: {line}"
        suite.add_testcase(case)
    suite.update_statistics()
    # checks run at once (--jobs) overlap: the suite took the audit's wall time, not their sum
    wall = doc.get("wall_s")
    xml = JUnitXml(name)
    xml.add_testsuite(suite)
    xml.update_statistics()
    if isinstance(wall, (int, float)) and not isinstance(wall, bool):
        suite.time = xml.time = float(wall)
    return xml


def _write_junit_file(xml: Any, p: Path) -> None:
    """The pretty-printed XML with ``JUNIT_MARKER`` right after the declaration (how ``outfile`` knows it)."""
    from xml.dom.minidom import parseString

    pretty = parseString(xml.tostring()).toprettyxml(indent="\t", encoding="utf-8").decode("utf-8")
    head, _, rest = pretty.partition("\n")
    p.write_text(f"{head}\n{JUNIT_MARKER}\n{rest}", encoding="utf-8")


def write_junit(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """The JUnit XML of an audit result document."""
    try:
        import junitparser  # noqa: F401
    except ImportError:
        raise UsageError("--junit needs junitparser: pip install 'reprobisect[report]' (or use --json)") from None
    xml = _junit_xml(doc)
    return atomic_write(path, lambda p: _write_junit_file(xml, p), kind="junit")


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
