"""Traces stay on the worker's disk: what comes back with a result, and what is read later.

The task returns the manifest and ``steps.jsonl`` (small: fingerprints and stats) plus
every other file up to ``eager_bytes`` in total (``_split_trace_files``). The controller
writes them to ``out_dir/<key>-a<attempt>`` (the same name the local executor uses).
Larger files (full-tensor shards, states) stay remote and are pulled on demand:
``RayExecutor.fetch`` runs a tiny task (``_read_file``) pinned to the node that holds the
trace (``NodeAffinitySchedulingStrategy(soft=False)``); ``pull`` writes them into the local
folder; ``open_trace`` returns a ``Trace`` (``_lazy_trace``) that pulls a shard the first
time compare asks for one of its tensors. After ``pull(result)`` the local folder is a
complete trace that ``read_trace`` validates like any other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from reprobisect.errors import TraceError
from reprobisect.trace.format import FORMAT, VERSION, Manifest, Step, shard_name
from reprobisect.trace.reader import Trace

__all__: list[str] = []


def _split_trace_files(final: Path, eager_bytes: int) -> tuple[dict[str, bytes], dict[str, int]]:
    """The trace's files to send back now (every manifest and steps file, a multi-rank trace's
    ``ranks/rank-R/`` ones too, then the smallest up to ``eager_bytes``) and the sizes of those
    that stay on this worker until fetched."""
    files: dict[str, bytes] = {}
    remote: dict[str, int] = {}
    if not (final / "manifest.json").is_file():
        return files, remote
    sizes = {}
    for dirpath, _, names in os.walk(final):
        for n in names:
            p = Path(dirpath) / n
            sizes[p.relative_to(final).as_posix()] = p.stat().st_size
    budget = eager_bytes
    always = {r for r in sizes if r.rsplit("/", 1)[-1] in ("manifest.json", "steps.jsonl")}
    for rel in sorted(sizes, key=lambda r: (r not in always, sizes[r], r)):
        if rel in always or sizes[rel] <= budget:
            files[rel] = (final / rel).read_bytes()
            budget -= sizes[rel]
        else:
            remote[rel] = sizes[rel]
    return files, remote


def _read_file(path: str) -> bytes:
    """Runs on the node that holds a trace: one file's bytes."""
    with open(path, "rb") as f:
        return f.read()


def _lazy_trace(path: Path, allow_incomplete: bool, pull: Callable[[str], Any]) -> "Trace":
    """A ``Trace`` over a folder whose shards are still remote: validated steps, lazy tensors."""
    import hashlib


    try:
        raw = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        raise TraceError(f"trace '{path}' has no readable manifest.json; re-run the probe") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise TraceError(f"'{path}' is not a reprobisect v{VERSION} trace")
    manifest = Manifest.from_json(raw, f"trace '{path}'")
    data = (path / "steps.jsonl").read_bytes()
    info = manifest.files.get("steps.jsonl")
    if manifest.status != "incomplete" and (not info or hashlib.sha256(data).hexdigest() != info.get("sha256")):
        raise TraceError(f"trace '{path}': steps.jsonl does not match its checksum; re-run the probe")
    steps = [Step.from_json(json.loads(line), f"trace '{path}', steps.jsonl line {i + 1}") for i, line in enumerate(data.split(b"\n")) if line.strip()]
    if manifest.status != "complete" and not allow_incomplete:
        raise TraceError(f"trace '{path}' is {manifest.status}; re-run it or pass --allow-incomplete")

    class _LazyTrace(Trace):
        def tensor(self, step, rec):  # type: ignore[override]
            if rec.stored and not (self.path / shard_name(step)).is_file():
                pull(shard_name(step))
            return super().tensor(step, rec)

    return _LazyTrace(path=path, manifest=manifest, steps=steps)
