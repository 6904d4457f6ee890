"""Progress display for long commands (rich, on stderr), silenced by ``--quiet``.

Every long command (``runs``, ``repro``, ``seeds``, ``envs``, ``audit``, ``demo``) shows
the same kind of line: what it is doing, how far it is, and the probe running now. When
stderr is not a terminal or ``quiet`` is set nothing is drawn, so output stays clean in
CI logs and under ``--json``; ``note`` lines still print unless ``quiet``. Status and note
text often holds a name from a config or a trace: it is shown through
``render.safe.printable`` (a control character as ``\\x1b``, never sent to the terminal),
and never read as rich markup.

Use::

    with progress("bisecting", total=8, quiet=opts.quiet) as p:
        p.update(status="round 1: probing abc123")
        p.advance()
"""

from __future__ import annotations

import sys
from typing import Any

from reprobisect.render.safe import printable, printable_lines

__all__ = ["Progress", "progress"]


class Progress:
    """One progress line: a description, an optional total, and a free-text status."""

    def __init__(self, description: str = "", total: float | None = None, quiet: bool = False) -> None:
        self.description = printable(description)
        self.total = total
        self.quiet = quiet
        self.completed = 0.0
        self.status = ""
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
                TextColumn("{task.fields[status]}"),
                console=Console(stderr=True),
                transient=True,
            )
            self._rich.__enter__()
            from rich.markup import escape

            self._task = self._rich.add_task(escape(self.description), total=self.total, status="")
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
                              completed=self.completed, status=escape(self.status))

    def advance(self, n: float = 1) -> None:
        """Count ``n`` more units done."""
        self.update(completed=self.completed + n)

    def note(self, message: str) -> None:
        """A line printed above the bar (to stderr), unless quiet."""
        if self.quiet:
            return
        message = printable_lines(message)
        if self._rich is not None:
            self._rich.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=sys.stderr, flush=True)


def progress(description: str = "", total: float | None = None, quiet: bool = False) -> Progress:
    """A ``Progress`` context manager (draws only on a terminal and when not quiet)."""
    return Progress(description, total=total, quiet=quiet)
