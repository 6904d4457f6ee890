"""Multi-rank traces: one shard per rank under ``ranks/rank-<R>/`` and a top manifest.

A distributed run (torchrun, DDP/FSDP) writes one complete v1 trace per global rank::

    TRACE/manifest.json            a normal manifest (status, outcome, command, the
                                   environment and policy of rank 0) plus "world_size" and
                                   "ranks": [{"rank", "path", "status", "steps",
                                   "local_rank", "device"}, ...]; its "files" lists every
                                   shard's manifest.json (size + SHA-256)
    TRACE/ranks/rank-0/            a complete trace (manifest.json, steps.jsonl, ...)
    TRACE/ranks/rank-1/            ...

Each shard's manifest carries ``extra.distributed`` = ``{"rank", "local_rank",
"world_size", "backend", "device"}``. Steps align across ranks by optimizer-step index.
``assemble`` writes the top manifest once the whole command ended; ``open_ranks`` reads a
trace as ``{rank: Trace}`` (a flat, single-process trace reads as ``{0: trace}``) and
checks that the shards belong together: every rank of the world size is there, every
shard names the same world size and its own rank, and no shard was replaced after the top
manifest was written. Every problem is one ``TraceError`` line.

Core module: imports no ML framework.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from reprobisect.errors import TraceError
from reprobisect.trace.format import FORMAT, VERSION, Manifest, check_file_name
from reprobisect.trace.jsonsafe import is_int
from reprobisect.trace.reader import UNLISTED_OK, Trace, _inside, _shown, read_trace
from reprobisect.trace.writer import fsync_path, json_safe, write_json_atomic

__all__ = ["RANKS_DIR", "RankInfo", "assemble", "is_multi_rank", "open_ranks", "rank_dir", "rank_infos",
           "read_rank0", "read_top_manifest", "shard_ranks", "world_size_of"]

RANKS_DIR = "ranks"
_RANK_DIR = re.compile(r"^rank-(\d{1,6})$")
_OK_OUTCOMES = ("ok", "nonfinite")


def rank_dir(trace_dir: str | os.PathLike, rank: int) -> Path:
    """Where rank ``rank``'s shard of the trace at ``trace_dir`` lives."""
    return Path(trace_dir) / RANKS_DIR / f"rank-{int(rank)}"


def shard_ranks(trace_dir: str | os.PathLike) -> list[int]:
    """The ranks whose shard folder exists under ``trace_dir/ranks/``, in order (no reading)."""
    root = Path(trace_dir) / RANKS_DIR
    if not root.is_dir() or root.is_symlink():
        return []
    out = []
    for e in root.iterdir():
        m = _RANK_DIR.match(e.name)
        if m and e.is_dir() and not e.is_symlink() and (e / "manifest.json").is_file():
            out.append(int(m.group(1)))
    return sorted(out)


def is_multi_rank(trace_dir: str | os.PathLike) -> bool:
    """True when ``trace_dir`` holds per-rank shards (``ranks/rank-<R>/``), assembled or not."""
    p = Path(trace_dir)
    if not p.is_dir():
        return False
    if (p / "steps.jsonl").is_file() and not (p / RANKS_DIR).is_dir():
        return False
    return bool(shard_ranks(p))


@dataclass(frozen=True)
class RankInfo:
    """One rank's entry of a top manifest (``ranks``)."""

    rank: int
    path: str
    status: str
    steps: int
    local_rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device: str | None = None
    outcome: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "path": self.path, "status": self.status, "steps": self.steps,
                "local_rank": self.local_rank, "world_size": self.world_size, "backend": self.backend,
                "device": self.device, "outcome": self.outcome}


def _distributed(m: Manifest) -> dict[str, Any]:
    d = m.extra.get("distributed") if isinstance(m.extra, dict) else None
    return d if isinstance(d, dict) else {}


def _shard_manifest(path: Path) -> Manifest:
    from reprobisect.trace.reader import _read_manifest  # the validating manifest reader

    return _read_manifest(path)


def rank_infos(trace_dir: str | os.PathLike) -> list[RankInfo]:
    """Each shard's rank, status, step count and placement, read from its own manifest."""
    out = []
    for r in shard_ranks(trace_dir):
        m = _shard_manifest(rank_dir(trace_dir, r))
        d = _distributed(m)
        steps = m.steps
        if m.status == "incomplete":  # never sealed: count its whole step lines
            steps = _count_lines(rank_dir(trace_dir, r) / "steps.jsonl")
        out.append(RankInfo(
            rank=r, path=f"{RANKS_DIR}/rank-{r}", status=m.status, steps=steps,
            local_rank=d.get("local_rank") if is_int(d.get("local_rank")) else None,
            world_size=d.get("world_size") if is_int(d.get("world_size")) else None,
            backend=d.get("backend") if isinstance(d.get("backend"), str) else None,
            device=d.get("device") if isinstance(d.get("device"), str) else None,
            outcome=m.outcome,
        ))
    return out


def _count_lines(p: Path) -> int:
    try:
        with open(p, "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except OSError:
        return 0


def _digest(p: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"size": p.stat().st_size, "sha256": h.hexdigest()}


def _first_failure(infos: list[RankInfo], world: int | None) -> tuple[str, str | None, dict[str, Any] | None]:
    """``(status, error, outcome)`` of the whole run from its shards: the lowest rank that did not end well."""
    if not infos:
        return "failed", "no rank wrote a shard (the command never stepped an optimizer)", None
    if world is not None:
        missing = sorted(set(range(world)) - {i.rank for i in infos})
        if missing:
            return "failed", f"rank {missing[0]} of world size {world} wrote no shard", None
    for i in infos:
        if i.status == "incomplete":
            return "failed", f"rank {i.rank}'s shard is incomplete (the process was stopped after {i.steps} step(s))", None
    for i in infos:
        status = (i.outcome or {}).get("status")
        if i.status == "failed" or (status is not None and status not in _OK_OUTCOMES):
            detail = (i.outcome or {}).get("detail") or "failed"
            out = {**(i.outcome or {}), "rank": i.rank, "detail": f"rank {i.rank}: {detail}"}
            return "failed", f"rank {i.rank}: {status or 'failed'}: {detail}", out
    return "complete", None, None


def _world(infos: list[RankInfo], trace_dir: str | os.PathLike) -> int | None:
    sizes = {i.world_size for i in infos if i.world_size is not None}
    if len(sizes) > 1:
        said = ", ".join(f"rank {i.rank} says {i.world_size}" for i in infos if i.world_size is not None)
        raise TraceError(f"trace '{trace_dir}': its shards name different world sizes ({said}); "
                         "they come from different runs: re-capture it")
    return sizes.pop() if sizes else None


def assemble(
    trace_dir: str | os.PathLike,
    *,
    command: list[str],
    outcome: Mapping[str, Any] | None = None,
    revision: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the top manifest of the multi-rank trace at ``trace_dir`` (after the whole command ended).

    ``outcome`` is how the command ended (``Outcome.to_json()``); a rank that did not end
    well (an incomplete shard, a failed one, a rank missing) makes the top status
    ``failed`` and its error name the rank. Written atomically; returns what was written.
    """
    p = Path(trace_dir)
    infos = rank_infos(p)
    world = _world(infos, p)
    if world is None and infos:
        world = max(i.rank for i in infos) + 1
    status, error, rank_outcome = _first_failure(infos, world)
    if outcome is not None and (outcome.get("status") not in _OK_OUTCOMES) and status == "complete":
        status, error = "failed", str(outcome.get("detail") or outcome.get("status"))
    top_outcome = dict(outcome) if outcome is not None else rank_outcome
    if rank_outcome is not None and (outcome is None or outcome.get("status") in _OK_OUTCOMES):
        top_outcome = rank_outcome
    base = _shard_manifest(rank_dir(p, infos[0].rank)) if infos else None
    manifest = Manifest(
        status=status, command=list(command),
        environment=dict(base.environment) if base else {}, policy=dict(base.policy) if base else {},
        steps=infos[0].steps if infos else 0, seed=base.seed if base else None,
        revision=dict(revision) if revision else (base.revision if base else None),
        outcome=top_outcome, error=error,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        recorder=dict(base.recorder or {}) if base else {"name": "reprobisect"},
        files={f"{i.path}/manifest.json": _digest(p / i.path / "manifest.json") for i in infos},
        extra=dict(extra or {}),
    )
    data = json_safe(manifest.to_json())
    data["world_size"] = world
    data["ranks"] = [i.to_json() for i in infos]
    from reprobisect.support.trust import TRUST_FIELD, sign

    rec = {k: v for k, v in (data.get("recorder") or {}).items() if k != TRUST_FIELD}
    data["recorder"] = rec
    sig = sign(data)
    if sig is not None:
        data["recorder"] = {**rec, TRUST_FIELD: sig}
    p.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p / "manifest.json", data)
    fsync_path(p)
    return data


def read_top_manifest(trace_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The raw top manifest of a multi-rank trace (``ranks``, ``world_size`` included), or None if not assembled."""
    from reprobisect.trace.reader import MAX_MANIFEST_BYTES, _read_json

    p = Path(trace_dir)
    if not (p / "manifest.json").is_file():
        return None
    raw = _read_json(p, "manifest.json", MAX_MANIFEST_BYTES)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise TraceError(f"'{p}' is not a reprobisect trace (its manifest has no format '{FORMAT}')")
    if not is_int(raw.get("version")) or raw["version"] > VERSION:
        raise TraceError(f"trace '{p}' has a format version this reprobisect does not read; upgrade or re-capture it")
    return raw


def world_size_of(trace_dir: str | os.PathLike) -> int:
    """The world size a trace was recorded with (1 for a flat, single-process trace)."""
    if not is_multi_rank(trace_dir):
        return 1
    top = read_top_manifest(trace_dir)
    if top is not None and is_int(top.get("world_size")):
        return int(top["world_size"])
    return _world(rank_infos(trace_dir), trace_dir) or len(shard_ranks(trace_dir))


def read_rank0(trace_dir: str | os.PathLike, *, allow_incomplete: bool = False) -> Trace:
    """The lowest rank's trace (rank 0 of a multi-rank trace; a flat trace itself): what a
    reader that looks at one process (its environment, its steps) reads."""
    traces = open_ranks(trace_dir, allow_incomplete=allow_incomplete)
    return traces[min(traces)]


def open_ranks(trace_dir: str | os.PathLike, *, allow_incomplete: bool = False,
               verify: bool = False) -> dict[int, Trace]:
    """Read the trace at ``trace_dir`` as ``{rank: Trace}``; a flat trace is ``{0: trace}``.

    A multi-rank trace is checked whole: its top manifest (when assembled) is complete
    (or ``allow_incomplete``), every shard it lists is there unchanged, every rank of the
    world size has a shard, and every shard names the same world size and its own rank.
    """
    p = Path(trace_dir)
    if not is_multi_rank(p):
        return {0: read_trace(p, allow_incomplete=allow_incomplete, verify=verify)}
    top = read_top_manifest(p)
    if top is not None:
        _check_top(p, top, allow_incomplete)
    if verify:
        _verify_top(p, top)
    traces = {r: read_trace(rank_dir(p, r), allow_incomplete=allow_incomplete, verify=verify) for r in shard_ranks(p)}
    sizes: dict[int, int] = {}
    for r, t in traces.items():
        d = _distributed(t.manifest)
        if is_int(d.get("rank")) and d["rank"] != r:
            raise TraceError(f"trace '{p}': ranks/rank-{r} holds the shard of rank {d['rank']}; re-capture it")
        if is_int(d.get("world_size")):
            sizes[r] = d["world_size"]
    if len(set(sizes.values())) > 1:
        said = ", ".join(f"rank {r} says {w}" for r, w in sorted(sizes.items()))
        raise TraceError(f"trace '{p}': its shards name different world sizes ({said}); "
                         "they come from different runs: re-capture it")
    world = next(iter(sizes.values()), None)
    if top is not None and is_int(top.get("world_size")):
        if world is not None and top["world_size"] != world:
            raise TraceError(f"trace '{p}': its manifest says world size {top['world_size']} but its shards say {world}; "
                             "re-capture it")
        world = top["world_size"]
    if world is not None:
        missing = sorted(set(range(world)) - set(traces))
        extra = sorted(set(traces) - set(range(world)))
        if missing and not allow_incomplete:
            raise TraceError(f"trace '{p}' is missing rank {missing[0]} of world size {world} "
                             f"({RANKS_DIR}/rank-{missing[0]}); re-capture it or pass --allow-incomplete")
        if extra:
            raise TraceError(f"trace '{p}' holds rank {extra[0]} but its world size is {world}; re-capture it")
    return traces


def _verify_top(p: Path, top: dict[str, Any] | None) -> None:
    """``verify`` of a multi-rank trace's own folder (each shard verifies itself): its
    manifest lists every shard's manifest, and it holds nothing but the shards and the
    files any trace may hold unlisted (``reader.UNLISTED_OK``)."""
    ranks = shard_ranks(p)
    listed = top.get("files") if top is not None and isinstance(top.get("files"), dict) else None
    for r in ranks:
        rel = f"{RANKS_DIR}/rank-{r}/manifest.json"
        if listed is not None and rel not in listed:
            raise TraceError(f"trace '{p}' holds {RANKS_DIR}/rank-{r}, which its manifest does not list "
                             "(added after it was assembled?); re-capture it")
    shard_dirs = {f"rank-{r}" for r in ranks}
    for e in sorted(p.iterdir()):
        if e.name in UNLISTED_OK or (e.name == RANKS_DIR and e.is_dir() and not e.is_symlink()):
            continue
        raise TraceError(f"trace '{p}' holds {_shown(e.name)}, which is not part of a multi-rank trace; "
                         "remove it or re-capture the trace")
    for e in sorted((p / RANKS_DIR).iterdir()):
        if e.name not in shard_dirs:
            raise TraceError(f"trace '{p}' holds {_shown(f'{RANKS_DIR}/{e.name}')}, which is not a rank's shard; "
                             "remove it or re-capture the trace")


def _check_top(p: Path, top: dict[str, Any], allow_incomplete: bool) -> None:
    status = top.get("status")
    if status != "complete" and not allow_incomplete:
        why = top.get("error") or f"status {status}"
        raise TraceError(f"trace '{p}' records a run that did not complete ({why}); "
                         "fix the run and re-capture it, or pass --allow-incomplete")
    files = top.get("files") if isinstance(top.get("files"), dict) else {}
    for rel, info in files.items():
        try:
            check_file_name(rel)
        except ValueError as e:
            raise TraceError(f"trace '{p}': its manifest's {e}; re-capture it") from None
        q = _inside(p, rel)
        if not q.is_file():
            raise TraceError(f"trace '{p}' is missing {rel} (truncated copy?); re-capture it")
        if not isinstance(info, dict) or _digest(q) != {"size": info.get("size"), "sha256": info.get("sha256")}:
            raise TraceError(f"trace '{p}' was modified after it was assembled ({rel} does not match its checksum); "
                             "re-capture it")
