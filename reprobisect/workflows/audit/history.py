"""The audit history: one SQLite row per check per night, next to the config.

``.bisect-audit.sqlite`` beside ``CONFIG.yaml`` (``history:`` in the config moves it). A
night's rows are written in one transaction (``BEGIN IMMEDIATE``, plain ``INSERT``), so an
interrupted audit leaves either the whole night or none of it, and two audits writing at
once both keep their night: every night has its own id (``night_id``, a UUID), rows are
never replaced. Standard library only (``sqlite3``), no server.

Only a database this tool made is opened: one marked with ``PRAGMA application_id`` =
``APPLICATION_ID``, ``PRAGMA user_version`` = ``VERSION`` and the table
``reprobisect_history``. ``history:`` naming anything else (the user's own SQLite file, a
folder, a text file) is one ``UsageError`` line and the file is left as it was. A new path
is created with the marker; a 0-byte file (``touch history.sqlite``: an empty SQLite
database by SQLite's own definition) is adopted. A history that an earlier version wrote
(the ``nights`` table with its exact schema and nothing else) is adopted: its rows get a
night id each and the marker is added, in one transaction.
"""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from reprobisect.errors import UsageError

__all__ = ["APPLICATION_ID", "VERSION", "Night", "CheckTrend", "check_history", "record_night", "nights", "trend",
           "last_pass_revision"]

APPLICATION_ID = 0x72706261
"""``PRAGMA application_id`` of an audit history ("rpba"): what marks the file as ours."""
VERSION = 2
"""``PRAGMA user_version`` of the schema this module writes (1: the unmarked schema before night ids)."""

_MARKER = "reprobisect_history"
_FORMAT = "reprobisect-audit-history"
_HEADER = b"SQLite format 3\x00"
_SCHEMA = (
    """CREATE TABLE nights (
    night_id TEXT NOT NULL,
    config TEXT NOT NULL,
    started TEXT NOT NULL,
    check_name TEXT NOT NULL,
    kind TEXT NOT NULL,
    revision TEXT,
    verdict TEXT NOT NULL,
    line TEXT NOT NULL,
    wall_s REAL NOT NULL,
    PRIMARY KEY (night_id, check_name)
)""",
    "CREATE INDEX nights_by_config ON nights (config, started)",
    f"CREATE TABLE {_MARKER} (format TEXT NOT NULL, version INTEGER NOT NULL)",
    f"INSERT INTO {_MARKER} VALUES ('{_FORMAT}', {VERSION})",
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {VERSION}",
)
_LEGACY = [  # PRAGMA table_info(nights) of version 1: (name, type, notnull, pk)
    ("config", "TEXT", 1, 1), ("started", "TEXT", 1, 2), ("check_name", "TEXT", 1, 3), ("kind", "TEXT", 1, 0),
    ("revision", "TEXT", 0, 0), ("verdict", "TEXT", 1, 0), ("line", "TEXT", 1, 0), ("wall_s", "REAL", 1, 0),
]
_COLUMNS = "started, check_name, kind, revision, verdict, line, wall_s"
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
    night_id: str = ""
    """The night's own id (every check of one night shares it; "" until recorded)."""

    def to_json(self) -> dict[str, object]:
        return {"started": self.started, "check": self.check, "kind": self.kind, "revision": self.revision,
                "verdict": self.verdict, "line": self.line, "wall_s": self.wall_s, "night_id": self.night_id}


@dataclass(frozen=True)
class CheckTrend:
    """What the history says of one check: when it last passed, nights failed since."""

    last_pass: str | None
    failing_nights: int
    nights: int

    def to_json(self) -> dict[str, object]:
        return {"last_pass": self.last_pass, "failing_nights": self.failing_nights, "nights": self.nights}


def _refuse(db: Path, what: str) -> UsageError:
    return UsageError(f"history '{db}' {what}; give 'history:' a new file path (nothing was changed)")


def _precheck(db: Path) -> bool:
    """Whether ``db`` exists; refuses, before SQLite sees it, what cannot be an audit history."""
    if not db.exists():
        if db.is_symlink():
            raise _refuse(db, "is a dangling link")
        if db.parent.exists() and not db.parent.is_dir():
            raise _refuse(db, f"cannot be created: '{db.parent}' is a file, not a folder")
        return False
    if db.is_dir():
        raise _refuse(db, "is a folder, not a history database (e.g. history: .bisect-audit.sqlite)")
    if not db.is_file():
        raise _refuse(db, "is not a regular file")
    try:
        with open(db, "rb") as f:
            head = f.read(len(_HEADER))
    except OSError as e:
        raise _refuse(db, f"cannot be read ({e.strerror or e})") from None
    if head and head != _HEADER:  # 0 bytes: an empty database, adopted
        raise _refuse(db, "is not an SQLite database (an audit history is one that reprobisect made)")
    return True


def _state(con: sqlite3.Connection, db: Path) -> str:
    """``new``, ``ours`` or ``legacy`` (an unmarked history of version 1); anything else is refused."""
    app = con.execute("PRAGMA application_id").fetchone()[0]
    objects = {(t, n) for t, n in con.execute("SELECT type, name FROM sqlite_master") if not n.startswith("sqlite_")}
    if app == APPLICATION_ID and ("table", _MARKER) in objects:
        row = con.execute(f"SELECT format, version FROM {_MARKER}").fetchone()
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if row is None or row[0] != _FORMAT:
            raise _refuse(db, "carries a damaged marker table")
        if version > VERSION:
            raise _refuse(db, f"was written by a newer reprobisect (version {version}; this one reads up to {VERSION})")
        return "ours"
    if app == 0 and not objects:
        return "new"
    if app == 0 and objects == {("table", "nights")}:
        cols = [(r[1], r[2].upper(), r[3], r[5]) for r in con.execute("PRAGMA table_info(nights)")]
        if cols == _LEGACY:
            return "legacy"
    names = ", ".join(sorted(n for _, n in objects)) or "none"
    raise _refuse(db, f"is an SQLite database reprobisect did not create (application id {app}, objects: {names})")


def _adopt(con: sqlite3.Connection) -> None:
    """Version 1 → 2 in the open transaction: give each night (config, started) an id; mark the file."""
    con.execute("ALTER TABLE nights RENAME TO nights_v1")
    rows = con.execute(f"SELECT config, {_COLUMNS} FROM nights_v1 ORDER BY rowid").fetchall()
    ids: dict[tuple[str, str], str] = {}
    for stmt in _SCHEMA:
        con.execute(stmt)
    con.executemany("INSERT INTO nights VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(ids.setdefault((r[0], r[1]), uuid.uuid4().hex), *r) for r in rows])
    con.execute("DROP TABLE nights_v1")


def _fail(db: Path, e: sqlite3.Error) -> UsageError:
    if "locked" in str(e) or "busy" in str(e):
        return UsageError(f"history '{db}' is locked by another process for too long ({e}); try again")
    return _refuse(db, f"is not a readable SQLite database ({e})")


def _writer(db: Path) -> sqlite3.Connection:
    """A connection with a ``BEGIN IMMEDIATE`` transaction open on a history that is ours (made or adopted)."""
    exists = _precheck(db)
    if not exists:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _refuse(db, f"cannot be created ({e.strerror or e})") from None
    con = sqlite3.connect(str(db), timeout=30, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        state = _state(con, db)
        if state == "new":
            for stmt in _SCHEMA:
                con.execute(stmt)
        elif state == "legacy":
            _adopt(con)
        return con
    except BaseException as e:
        con.close()
        if isinstance(e, sqlite3.Error):
            raise _fail(db, e) from None
        raise


def _reader(db: Path) -> tuple[sqlite3.Connection, str] | None:
    """A read-only connection and the history's state (None: no history yet); refuses a foreign file."""
    if not _precheck(db):
        return None
    try:
        con = sqlite3.connect(Path(db).resolve().as_uri() + "?mode=ro", timeout=30, uri=True)
    except sqlite3.Error as e:
        raise _fail(db, e) from None
    try:
        return con, _state(con, db)
    except BaseException as e:
        con.close()
        if isinstance(e, sqlite3.Error):
            raise _fail(db, e) from None
        raise


def check_history(db: Path) -> None:
    """Refuse, without changing anything, a ``history:`` that is not (or cannot become) an audit history."""
    opened = _reader(Path(db))
    if opened is not None:
        opened[0].close()


def record_night(db: Path, config: str, started: str, rows: Iterable[Night], *, night_id: str | None = None) -> str:
    """Append a night's rows in one transaction (all or none); returns the night's id."""
    nid = night_id or uuid.uuid4().hex
    values = [(nid, config, started, r.check, r.kind, r.revision, r.verdict, r.line, r.wall_s) for r in rows]
    db = Path(db)
    with closing(_writer(db)) as con:
        try:
            con.executemany("INSERT INTO nights VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", values)
            con.execute("COMMIT")
        except BaseException as e:
            if con.in_transaction:
                con.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise _fail(db, e) from None
            raise
    return nid


def nights(db: Path, config: str) -> list[Night]:
    """Every row of this config, oldest first ([] when there is no history yet)."""
    db = Path(db)
    opened = _reader(db)
    if opened is None or opened[1] == "new":
        if opened is not None:
            opened[0].close()
        return []
    con, state = opened
    with closing(con):
        try:
            nid = "''" if state == "legacy" else "night_id"
            cur = con.execute(f"SELECT {_COLUMNS}, {nid} FROM nights WHERE config = ? ORDER BY started, rowid",
                              (config,))
            return [Night(*row) for row in cur.fetchall()]
        except sqlite3.Error as e:
            raise _fail(db, e) from None


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
