"""The session log and the result cache of ``bisect runs``: what makes a search resumable.

A **session log** is a JSONL file: one header line naming the search (endpoints, command,
check, range), then one line per finished probe (point, verdict, reason, outcome). Each
line is appended, flushed and fsynced before the search moves on, so a search killed at
any moment leaves a log whose complete lines are all true; a torn last line (the process
died mid-write) is ignored when the log is read back. ``--resume`` replays the events into
``Bisection.replay`` and continues.

The **result cache** keeps, per probe key, the verdict and (optionally) a copy of the
trace. The key is a SHA-256 over everything that can change what a probe sees: the
commit, the command, the environment relevant to the probe (interpreter, framework
versions, env vars that change numerics), the recorder version, the steps and the check.
Entries are written atomically (temp + rename): a reader sees a whole entry or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Mapping

from reprobisect import __version__
from reprobisect.core.outcome import VerdictKind
from reprobisect.errors import UsageError
from reprobisect.trace.format import VERSION
from reprobisect.trace.jsonsafe import is_int
from reprobisect.trace.writer import fsync_path

__all__ = [
    "SESSION_VERSION",
    "RELEVANT_ENV_VARS",
    "SessionEvent",
    "SessionLog",
    "ResultCache",
    "CacheEntry",
    "cache_key",
    "probe_environment",
]

SESSION_VERSION = 1
EVENT_ROLES = ("endpoint", "search", "recheck", "parent")

# Environment variables that change what a training command computes (or how it runs).
RELEVANT_ENV_VARS = (
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "PYTHONPATH",
)

_FRAMEWORKS = ("torch", "numpy", "lightning", "tensorflow", "tensorflow-cpu", "keras", "jax")



def probe_environment(python: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The part of the controller's environment that can change a probe's trace.

    Framework versions are read from package metadata (no framework is imported). With
    another interpreter (``python``) only its path is known here; the trace's manifest
    holds the full record of what actually ran.
    """
    interp = python or sys.executable
    out: dict[str, Any] = {"python": interp, "reprobisect": __version__, "trace_format": VERSION}
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        out["python_version"] = sys.version.split()[0]
        versions = {}
        for name in _FRAMEWORKS:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        out["packages"] = versions
    merged = {k: os.environ[k] for k in RELEVANT_ENV_VARS if k in os.environ}
    merged.update(dict(env or {}))
    out["env"] = dict(sorted(merged.items()))
    return out


def _canonical(value: Any) -> Any:
    canonical = getattr(value, "canonical", None)
    return canonical() if callable(canonical) else str(value)


def cache_key(**fields: Any) -> str:
    """A stable SHA-256 over keyword fields (JSON, sorted keys); the same fields give the same key.

    A value with a ``canonical()`` JSON form (``Tolerance``) is keyed by it."""
    blob = json.dumps(fields, sort_keys=True, default=_canonical, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class SessionEvent:
    """One finished probe as the log holds it."""

    point: str
    verdict: VerdictKind
    """good, bad or skip (the search's own terms, whatever the user's terms are)."""
    reason: str = ""
    outcome: dict[str, Any] | None = None
    attempts: int = 1
    cached: bool = False
    wall_s: float | None = None
    role: str = "search"
    """'endpoint', 'search', 'recheck' or 'parent': only 'search' events are replayed into the search."""
    round: int | None = None
    """The search round the point was handed out in (search events; replayed, so a resumed
    session counts its rounds from the start)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", VerdictKind(self.verdict))

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "probe",
            "point": self.point,
            "verdict": str(self.verdict),
            "reason": self.reason,
            "outcome": self.outcome,
            "attempts": self.attempts,
            "cached": self.cached,
            "wall_s": self.wall_s,
            "role": self.role,
            "round": self.round,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SessionEvent":
        """An event from its JSON; a missing field or one of the wrong type or value is a
        ``KeyError``/``TypeError``/``ValueError`` naming it (``SessionLog.load`` reports it)."""

        def typed(name: str, types: tuple[type, ...], default: Any = None, required: bool = False) -> Any:
            if name not in d or d[name] is None:
                if required:
                    raise KeyError(f"no '{name}'")
                return default
            v = d[name]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                raise TypeError(f"'{name}' is {type(v).__name__} {v!r}, not {'/'.join(t.__name__ for t in types)}")
            return v

        point = typed("point", (str,), required=True)
        verdict = typed("verdict", (str,), required=True)
        if verdict not in set(VerdictKind):
            raise ValueError(f"verdict {verdict!r} is not one of {', '.join(VerdictKind)}")
        role = typed("role", (str,), "search")
        if role not in EVENT_ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(EVENT_ROLES)}")
        attempts = typed("attempts", (int,), 1)
        rnd = typed("round", (int,), None)
        return cls(
            point=point,
            verdict=VerdictKind(verdict),
            reason=typed("reason", (str,), ""),
            outcome=typed("outcome", (dict,), None),
            attempts=attempts,
            cached=typed("cached", (bool,), False),
            wall_s=typed("wall_s", (int, float), None),
            role=role,
            round=rnd,
        )


@dataclass
class SessionLog:
    """An append-only JSONL log of one search: a header, then one line per probe."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    events: list[SessionEvent] = field(default_factory=list)

    @classmethod
    def create(cls, path: str | os.PathLike, header: Mapping[str, Any]) -> "SessionLog":
        """Start a new log at ``path`` (replacing any previous one) with ``header``."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        head = {"type": "session", "version": SESSION_VERSION, **dict(header)}
        fd, tmp = tempfile.mkstemp(prefix=".session-", dir=p.parent)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(head, sort_keys=True, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        fsync_path(p.parent)
        return cls(path=p, header=head, events=[])

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SessionLog":
        """Read a log back; a torn last line (a write cut short) is ignored.

        Anything else that is wrong — not UTF-8, a line that is not JSON or not an object,
        a header of another tool or version, a line of an unknown type, a field of the
        wrong type, a verdict or role this version does not know — is one ``UsageError``
        naming the line and saying to start afresh without ``--resume`` (or delete the log).
        """
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"no session log at {p}: nothing to resume (run without --resume to start one)")

        def bad(what: str, line: int | None = None) -> UsageError:
            where = f"{p}:{line}" if line else str(p)
            return UsageError(f"{where}: {what}; start afresh without --resume (or delete the log)")

        try:
            raw = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise bad("the session log is not text (corrupted)") from None
        except OSError as e:
            raise UsageError(f"cannot read the session log {p}: {e.strerror or e}") from None
        lines = raw.split("\n")
        complete = lines[:-1]  # the part after the last newline is a torn write (or empty)
        header: dict[str, Any] | None = None
        events: list[SessionEvent] = []
        for i, line in enumerate(complete, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except (ValueError, RecursionError):  # JSONDecodeError, or a number too long to convert
                raise bad("session log line is not JSON", i) from None
            if not isinstance(d, dict):
                raise bad(f"session log line is a JSON {type(d).__name__}, not an object", i)
            if header is None:
                if d.get("type") != "session":
                    raise bad("not a reprobisect session log (first line has no session header)")
                version = d.get("version")
                if not is_int(version) or version < 1:
                    raise bad(f"session log header has no valid version ({version!r})", i)
                if version > SESSION_VERSION:
                    raise UsageError(f"{p}: session log version {version} is newer than this reprobisect "
                                     f"(reads {SESSION_VERSION}); upgrade it, or start afresh without --resume")
                header = d
                continue
            kind = d.get("type")
            if kind == "session":
                raise bad("a second session header (two logs written into one file)", i)
            if kind != "probe":
                raise bad(f"unknown line type {kind!r} (written by another version?)", i)
            try:
                events.append(SessionEvent.from_json(d))
            except (KeyError, TypeError, ValueError) as e:
                raise bad(f"malformed probe line ({e})", i) from None
        if header is None:
            raise UsageError(f"{p}: empty session log; start afresh without --resume (or delete the log)")
        return cls(path=p, header=header, events=events)

    def append(self, event: SessionEvent) -> None:
        """Append one event, flushed and fsynced before returning."""
        line = json.dumps(event.to_json(), sort_keys=True, default=str) + "\n"
        # Repair a torn tail first so the new line starts on a line of its own.
        with open(self.path, "rb+") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    data = self.path.read_bytes()
                    cut = data.rfind(b"\n") + 1
                    f.truncate(cut)
            f.seek(0, os.SEEK_END)
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
        self.events.append(event)

    def search_events(self) -> list[tuple[str, str]]:
        """The (point, verdict) pairs of search probes, in order: what ``Bisection.replay`` takes."""
        return [(e.point, e.verdict) for e in self.events if e.role == "search"]

    def search_rounds(self) -> list[dict[str, Any]]:
        """The search probes as ``{"point", "verdict", "round"}``: replayed with their rounds."""
        return [{"point": e.point, "verdict": e.verdict, "round": e.round} for e in self.events if e.role == "search"]

    def __iter__(self) -> Iterator[SessionEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)


@dataclass(frozen=True)
class CacheEntry:
    """A cached probe: its verdict and reason, the outcome, and the cached trace if one was kept."""

    key: str
    verdict: VerdictKind | str
    """good, bad or skip; an entry written with anything else keeps it as it was written."""
    reason: str
    outcome: dict[str, Any] | None
    trace: Path | None
    data: dict[str, Any]


def _verdict(v: Any) -> VerdictKind | str:
    return VerdictKind(v) if isinstance(v, str) and v in set(VerdictKind) else str(v)


class ResultCache:
    """Verdicts (and traces) of finished probes under ``root``, keyed by ``cache_key``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        (self.root / "results").mkdir(parents=True, exist_ok=True)
        (self.root / "traces").mkdir(parents=True, exist_ok=True)

    def _entry_path(self, key: str) -> Path:
        return self.root / "results" / f"{key}.json"

    def trace_path(self, key: str) -> Path:
        return self.root / "traces" / key

    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key``, or None (also None when its trace was removed)."""
        p = self._entry_path(key)
        try:
            d = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        trace = None
        if d.get("trace"):
            trace = self.trace_path(key)
            if not (trace / "manifest.json").is_file():
                return None
        return CacheEntry(
            key=key,
            verdict=_verdict(d.get("verdict")),
            reason=str(d.get("reason") or ""),
            outcome=d.get("outcome"),
            trace=trace,
            data=d,
        )

    def put(
        self,
        key: str,
        *,
        verdict: str,
        reason: str = "",
        outcome: Mapping[str, Any] | None = None,
        trace: str | os.PathLike | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CacheEntry:
        """Store a verdict (and a copy of ``trace``) atomically; returns the stored entry."""
        kept = None
        if trace is not None and Path(trace).is_dir():
            dest = self.trace_path(key)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=self.root / "traces"))
            shutil.rmtree(tmp)
            shutil.copytree(trace, tmp)
            if dest.exists():
                shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
            kept = dest
        d = {
            "key": key,
            "verdict": verdict,
            "reason": reason,
            "outcome": dict(outcome) if outcome else None,
            "trace": bool(kept),
            **dict(extra or {}),
        }
        fd, tmp_name = tempfile.mkstemp(prefix=".entry-", dir=self.root / "results")
        with os.fdopen(fd, "w") as f:
            json.dump(d, f, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, self._entry_path(key))
        return CacheEntry(key=key, verdict=verdict, reason=reason, outcome=d["outcome"], trace=kept, data=d)

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None
