"""Every exit status reprobisect's programs use, in one table.

Two tables, because two different programs exit:

- ``ExitCode``: the ``bisect`` command line (``reprobisect.cli.main``). Each command
  returns one of these; ``main`` is the one place the process exits. ``bisect probe``
  follows ``git bisect run``'s contract (0 good, 1-127 but 125 bad, 125 skip, anything
  else aborts the bisection), so its own errors use codes >= 128 that git reads as "stop",
  never 2 or 3, which git would read as "bad" and so blame a commit.
- ``LaunchExit``: ``python -m reprobisect.runners.launch``, the child process every probe
  runs; the parent reads the probe's outcome from it.

README's "Exit codes" section documents ``ExitCode`` for users. This module imports
nothing, so every layer (runners included) may use it.
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "LaunchExit", "signal_exit"]


class ExitCode(enum.IntEnum):
    """Exit statuses of the ``bisect`` program."""

    OK = 0
    """Agree / found / complete; ``probe``: good."""
    DIFFER = 1
    """Diverged / bad / ambiguous / not found: a verdict, never an error; ``probe``: bad."""
    USAGE = 2
    """Bad input or usage (a bad option, a missing or foreign trace, an unwritable path)."""
    INTERNAL = 3
    """An internal error: a reprobisect bug (traceback written to a log file)."""
    SKIP = 125
    """The command could not be tested (``capture``; ``probe``: git bisect's skip)."""
    PROBE_USAGE = 128
    """``bisect probe``'s bad input: >= 128 makes ``git bisect run`` abort, not blame."""
    HANGUP = 129
    """Ended by SIGHUP (128 + 1, as shells do)."""
    INTERRUPTED = 130
    """Ended by Ctrl-C (SIGINT, 128 + 2); also a reader of stdout that went away."""
    TERMINATED = 143
    """Ended by SIGTERM (128 + 15)."""
    PROBE_INTERNAL = 250
    """``bisect probe``'s internal error: >= 128 (aborts ``git bisect run``) and outside
    128 + any signal number, so it is never mistaken for an interruption (SIGHUP is 129)."""


def signal_exit(signum: int) -> int:
    """The shell's exit status for a process ended by signal ``signum``: 128 + its number."""
    return 128 + int(signum)


class LaunchExit(enum.IntEnum):
    """Exit statuses of ``python -m reprobisect.runners.launch`` (the probe's child), one per
    outcome the child can see itself; ``timeout`` is seen only from outside."""

    OK = 0
    CRASHED = 3
    NONFINITE = 4
    SKIP = 5
    NO_STEPS = 6
    INFRA = 7
