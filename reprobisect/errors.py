"""The one exception family: raised once where the problem is found, caught once at the CLI.

Each error carries the exit code the CLI returns and a message that names the thing that
is wrong and what to do about it.
"""

from __future__ import annotations

from reprobisect.exitcodes import ExitCode

__all__ = ["ReproError", "UsageError", "TraceError", "ProbeError"]


class ReproError(Exception):
    """Base of every error reprobisect reports to a user as one line."""

    exit_code: int = ExitCode.USAGE


class UsageError(ReproError):
    """Bad arguments or configuration from the user."""


class TraceError(ReproError):
    """A trace that is missing, truncated, foreign, newer, incomplete or tampered with."""


class ProbeError(ReproError):
    """A probe could not run at all (not: the training command failed)."""
