"""The session log of ``bisect runs``: where it lives, and whether an earlier one can be resumed.

Every verdict is appended (fsynced) to the log before the search moves on
(``reprobisect.core.session.SessionLog``); ``--resume`` replays the log of the interrupted
session with the same arguments, after checking that it is this search's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprobisect.core.search import Bisection
from reprobisect.core.session import SessionLog
from reprobisect.errors import ReproError, UsageError

__all__ = ["session_path", "load_for_resume", "check_resumable", "unfinished", "HEADER_KEYS"]

HEADER_KEYS = ("good", "bad", "command", "subdir", "check", "steps", "first_parent", "terms", "repeat", "points")
"""The header fields that must be equal for a log to be this search's."""


def session_path(cache_dir: Path, session_id: str) -> Path:
    """Where the log of session ``session_id`` lives."""
    return cache_dir / "sessions" / f"{session_id}.jsonl"


def load_for_resume(log_path: Path, header: dict[str, Any], points: list[str], terms: tuple[str, ...],
                    parents: Any) -> SessionLog:
    """The session log to resume, checked whole before anything runs: readable
    (``SessionLog.load``), this search's (``check_resumable``) and replayable. Every
    problem is one ``UsageError`` that says to start afresh."""
    log = SessionLog.load(log_path)
    check_resumable(log, header, points)
    try:
        Bisection.replay(points, log.search_rounds(), terms=terms, parents=parents)  # type: ignore[arg-type]
    except ReproError as e:
        raise UsageError(f"the session log {log_path} cannot be replayed ({e}); "
                         "start afresh without --resume (or delete the log)") from None
    return log


def check_resumable(log: SessionLog, header: dict[str, Any], points: list[str]) -> None:
    """Refuse (one line) a log that is not this search's: another search's header, or
    probes of commits that are not in this range (the history was rewritten)."""
    differ = [k for k in HEADER_KEYS if k in header and log.header.get(k) != header[k]]
    if differ:
        raise UsageError(
            f"the session log {log.path} is for another search (its {', '.join(differ)} differ from this one's); "
            "start afresh without --resume (or delete the log)"
        )
    on_axis = set(points)
    for e in log.events:
        if e.point not in on_axis and e.role in ("endpoint", "search"):
            raise UsageError(
                f"the session log {log.path} names commit {e.point[:12]}, which is not in this range "
                "(the history changed?); start afresh without --resume (or delete the log)"
            )


def unfinished(log_path: Path) -> int:
    """Probes in an earlier log at ``log_path`` that never reached its answer (0: none)."""
    try:
        old = SessionLog.load(log_path)
    except ReproError:
        return 0
    if any(e.role in ("recheck", "parent") for e in old):
        return 0
    return len(old)
