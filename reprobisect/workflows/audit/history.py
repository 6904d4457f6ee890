"""The audit history: one SQLite row per check per night, next to the config.

``.bisect-audit.sqlite`` beside ``CONFIG.yaml`` (``history:`` in the config moves it). A
night's rows are written in one transaction, so an interrupted audit leaves either the
whole night or none of it. Standard library only (``sqlite3``), no server.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

__all__ = ["Night", "CheckTrend", "record_night", "nights", "trend", "last_pass_revision"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nights (
    config TEXT NOT NULL,
    started TEXT NOT NULL,
    check_name TEXT NOT NULL,
    kind TEXT NOT NULL,
    revision TEXT,
    verdict TEXT NOT NULL,
    line TEXT NOT NULL,
    wall_s REAL NOT NULL,
    PRIMARY KEY (config, started, check_name)
)
"""
_PASSING = ("bitwise", "within-noise")


@dataclass(frozen=True)
class Night:
    """One check's result on one night."""

    started: str
    check: str
    kind: str
    revision: str | None
    verdict: str
    line: str
    wall_s: float

    def to_json(self) -> dict[str, object]:
        return {"started": self.started, "check": self.check, "kind": self.kind, "revision": self.revision,
                "verdict": self.verdict, "line": self.line, "wall_s": self.wall_s}


@dataclass(frozen=True)
class CheckTrend:
    """What the history says of one check: when it last passed, nights failed since."""

    last_pass: str | None
    failing_nights: int
    nights: int

    def to_json(self) -> dict[str, object]:
        return {"last_pass": self.last_pass, "failing_nights": self.failing_nights, "nights": self.nights}


def _open(db: Path) -> sqlite3.Connection:
    con = sqlite3.connect(str(db), timeout=30)
    con.execute(_SCHEMA)
    return con


def record_night(db: Path, config: str, started: str, rows: Iterable[Night]) -> None:
    """Append a night's rows in one transaction (all or none)."""
    with closing(_open(db)) as con, con:
        con.executemany(
            "INSERT OR REPLACE INTO nights VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(config, started, r.check, r.kind, r.revision, r.verdict, r.line, r.wall_s) for r in rows])


def nights(db: Path, config: str) -> list[Night]:
    """Every row of this config, oldest first ([] when there is no history yet)."""
    if not Path(db).exists():
        return []
    with closing(_open(db)) as con:
        cur = con.execute("SELECT started, check_name, kind, revision, verdict, line, wall_s FROM nights "
                          "WHERE config = ? ORDER BY started, rowid", (config,))
        return [Night(*row) for row in cur.fetchall()]


def trend(history: list[Night], check: str) -> CheckTrend:
    """Last passing night and the failing nights since (this night included when recorded)."""
    mine = [n for n in history if n.check == check]
    last = next((n for n in reversed(mine) if n.verdict in _PASSING), None)
    failing = 0
    for n in reversed(mine):
        if n.verdict in _PASSING:
            break
        failing += 1
    return CheckTrend(last_pass=last.started if last else None, failing_nights=failing, nights=len(mine))


def last_pass_revision(history: list[Night], check: str) -> str | None:
    """The revision recorded on the last night this check passed (None: never, or no revision)."""
    return next((n.revision for n in reversed(history) if n.check == check and n.verdict in _PASSING and n.revision), None)
