"""``bisect report PATH [PATH_B] --html OUT``: one self-contained HTML page people read.

Thin: parses, calls ``reprobisect.report.write_report`` (which reads the source and writes
the page atomically) and prints where the page went. PATH is two trace folders (``A B``),
a folder holding two traces, a ``bisect compare --json`` file, a ``bisect runs`` session
(log or folder) or a ``bisect audit --json`` file (``reprobisect.report.sources``).
Exit 0 when the page is written, 2 for a bad PATH or option.
"""

from __future__ import annotations

from pathlib import Path

import click

from reprobisect.cli.options import tolerance_from, tolerance_options
from reprobisect.errors import UsageError
from reprobisect.exitcodes import ExitCode
from reprobisect.support.progress import verbosity

__all__ = ["command"]


def _tolerance_flags(f):
    for d in reversed(tolerance_options("auto for traces (bitwise in one environment), bitwise for a runs session")):
        f = d(f)
    return f


@click.command(name="report")
@click.argument("path", type=click.Path(path_type=str))
@click.argument("path_b", required=False, type=click.Path(path_type=str))
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the report to this HTML file (one self-contained file: no network).")
@click.option("--session", "session", default=None, metavar="ID",
              help="With a folder holding sessions/ (.git/reprobisect): the bisect runs session to show [default: "
                   "the newest].")
@_tolerance_flags
def command(path: str, path_b: str | None, html_out: str | None, session: str | None, tolerance: str | None,
            atol: float | None, rtol: float | None, override: tuple[str, ...]) -> int:
    """Write a self-contained HTML report of a comparison, a runs session or an audit.

    \b
    PATH is one of:
      A B                 two trace folders
      FOLDER              a folder holding two traces (a/b, a.trace/b.trace)
      compare.json        the output of bisect compare --json
      SESSION             a bisect runs session log (sessions/ID.jsonl) or the folder holding sessions/
      audit.json          the output of bisect audit --json

    A folder holding several sessions shows the newest (said on stderr); --session ID picks another.

    Exit 0 when the report is written, 2 for a bad PATH or option.
    """
    if not html_out:
        raise UsageError("bisect report writes HTML: pass --html OUT.html")
    from reprobisect.report import write_report

    tol = tolerance_from({"tolerance": tolerance, "atol": atol, "rtol": rtol, "override": override})
    source = (path, path_b) if path_b is not None else _session_source(path, session)
    out = write_report(source, html_out, tolerance=tol)
    click.echo(f"report written to {out} ({out.stat().st_size // 1024 + 1} KiB)")
    return ExitCode.OK


def _session_source(path: str, session: str | None) -> str:
    """``path``, or the session log it holds: the one ``--session`` names, else the newest, said
    on stderr (with how to pick another) when the folder holds more than one."""
    from reprobisect.report.sources import pick_session, session_logs

    logs = session_logs(path) if Path(path).is_dir() else []
    if not logs:
        if session is not None:
            raise UsageError(f"--session {session}: '{path}' is not a folder holding bisect runs sessions "
                             "(sessions/ID.jsonl); give the folder, e.g. .git/reprobisect")
        return path
    chosen = pick_session(path, session)
    if session is None and not verbosity().quiet:
        others = f"the newest of {len(logs)}; --session ID picks another" if len(logs) > 1 else "the only one"
        click.echo(f"session {chosen.stem} ({others})", err=True)
    return str(chosen)
