"""Progress display for long commands (rich, on stderr), silenced by ``--quiet``.

Every long command (``runs``, ``repro``, ``seeds``, ``envs``, ``audit``, ``demo``) shows
the same kind of line: what it is doing, how far it is, and the probe running now. When
stderr is not a terminal or ``quiet`` is set nothing is drawn, so output stays clean in
CI logs and under ``--json``; ``note`` lines still print unless ``quiet``. Status and note
text often holds a name from a config or a trace: it is shown through
``render.safe.printable`` (a control character as ``\\x1b``, never sent to the terminal),
and never read as rich markup.

``-q/--quiet`` and ``-v/--verbose`` are set once per command (``set_verbosity``, from the
CLI) and read here: quiet silences every display and note; verbose prints the progress as
plain lines too. A ``Progress`` made with ``lines=True`` (``bisect runs``) prints its phases
as plain lines when stderr is not a terminal (CI logs): ``phase`` names the phase (endpoints,
search, re-check), ``probed`` counts probes done of the expected number, and both lines and the
bar give an estimate of the time left from the probes' mean time so far.

Use::

    with progress("bisecting", total=8, quiet=opts.quiet) as p:
        p.update(status="round 1: probing abc123")
        p.advance()
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator

from reprobisect.render.safe import printable, printable_lines

__all__ = ["Progress", "progress", "Verbosity", "verbosity", "set_verbosity"]


@dataclass(frozen=True)
class Verbosity:
    """What ``-q``/``-v`` asked for: only the result and errors, or more detail."""

    quiet: bool = False
    """Only the result (stdout) and errors: no progress display, no notes."""
    verbose: bool = False
    """Progress as plain lines too, and more of the result where a command has it."""


_VERBOSITY = [Verbosity()]


def verbosity() -> Verbosity:
    """The ``-q``/``-v`` of the command running now (both off outside the CLI)."""
    return _VERBOSITY[-1]


@contextlib.contextmanager
def set_verbosity(quiet: bool = False, verbose: bool = False) -> Iterator[Verbosity]:
    """Set ``-q``/``-v`` for the duration of one command."""
    _VERBOSITY.append(Verbosity(quiet=quiet, verbose=verbose))
    try:
        yield _VERBOSITY[-1]
    finally:
        _VERBOSITY.pop()


def _duration(seconds: float) -> str:
    """``75`` → ``1m15s``; ``3700`` → ``1h02m``."""
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """One progress line: a description, an optional total, and a free-text status."""

    def __init__(self, description: str = "", total: float | None = None, quiet: bool = False,
                 lines: bool = False) -> None:
        self.description = self._base = printable(description)
        self.total = total
        self.quiet = quiet or verbosity().quiet
        self.lines = (lines or verbosity().verbose) and not self.quiet
        self.completed = 0.0
        self.status = ""
        self.phase_name = ""
        self._probe_s: list[float] = []
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> "Progress":
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._rich = RichProgress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                TextColumn("{task.fields[status]}"),
                console=Console(stderr=True),
                transient=True,
            )
            self._rich.__enter__()
            from rich.markup import escape

            self._task = self._rich.add_task(escape(self.description), total=self.total, status="", eta="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)
            self._rich = None

    def update(self, status: str | None = None, *, description: str | None = None, total: float | None = None, completed: float | None = None) -> None:
        """Change the status text, description, total or completed count."""
        if status is not None:
            self.status = printable(status)
        if description is not None:
            self.description = printable(description)
        if total is not None:
            self.total = total
        if completed is not None:
            self.completed = completed
        if self._rich is not None:
            from rich.markup import escape

            self._rich.update(self._task, description=escape(self.description), total=self.total,
                              completed=self.completed, status=escape(self.status), eta=self.estimate())

    def advance(self, n: float = 1) -> None:
        """Count ``n`` more units done."""
        self.update(completed=self.completed + n)

    def phase(self, name: str, expected: int, status: str = "") -> None:
        """Start a phase (``endpoints``, ``search``, ``re-check``) of ``expected`` probes; said
        as a line when lines are on (no terminal, or ``-v``)."""
        self.phase_name = printable(name)
        self.update(status, description=f"{self._base} · {name}", total=expected, completed=0)
        self._line(f"{name}: {expected} probe(s) expected" + (f" · {self.status}" if status else ""))

    def probed(self, wall_s: float | None, what: str = "") -> None:
        """One probe of the phase done (``wall_s``: how long it ran; None: from the cache)."""
        if wall_s is not None and wall_s > 0:
            self._probe_s.append(float(wall_s))
        self.advance()
        self._line(f"{self.phase_name}: probe {int(self.completed)} of {self._of()}"
                   + (f" · {self.estimate()}" if self.estimate() else "") + (f" · {printable(what)}" if what else ""))

    def _of(self) -> str:
        total = int(self.total) if self.total is not None else None
        return "?" if total is None else (f"~{total}" if self.completed <= total else f"{int(self.completed)}+")

    def estimate(self) -> str:
        """``about 1m20s left`` from the mean probe time and the probes still expected ('' unknown)."""
        if not self._probe_s or self.total is None:
            return ""
        left = max(0.0, float(self.total) - self.completed)
        return f"about {_duration(left * sum(self._probe_s) / len(self._probe_s))} left" if left else ""

    def _line(self, text: str) -> None:
        """A plain progress line when lines are on (CI logs, ``-v``), on a terminal above the bar."""
        if self.lines and (self._rich is None or verbosity().verbose):  # a terminal has the bar
            self.note(f"{self._base}: {text}")

    def note(self, message: str) -> None:
        """A line printed above the bar (to stderr), unless quiet."""
        if self.quiet:
            return
        message = printable_lines(message)
        if self._rich is not None:
            self._rich.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=sys.stderr, flush=True)


def progress(description: str = "", total: float | None = None, quiet: bool = False, lines: bool = False) -> Progress:
    """A ``Progress`` context manager (draws only on a terminal and when not quiet)."""
    return Progress(description, total=total, quiet=quiet, lines=lines)
