"""Read and validate a trace; every problem becomes one ``TraceError`` line.

Validation: the folder and manifest exist and parse, the format name and version are
ours, the status is complete (or the caller allows otherwise), every file the manifest
lists exists with its recorded size, ``steps.jsonl`` matches its SHA-256 and schema, and
the step count matches. Tensor shards are checked against their SHA-256 when first
loaded, so comparing two traces by fingerprint never reads a full tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from reprobisect.errors import TraceError
from reprobisect.trace import shards
from reprobisect.trace.format import FORMAT, VERSION, Manifest, Record, Step, shard_name, tensor_key

__all__ = ["Trace", "read_trace"]


@dataclass
class Trace:
    """A validated trace: its manifest, its steps in order, and lazy access to tensors."""

    path: Path
    manifest: Manifest
    steps: list[Step]
    _verified: set[str] = field(default_factory=set, repr=False)
    tensors_read: int = field(default=0, compare=False)
    """Full tensors loaded so far through ``tensor`` (fingerprint-only work loads none)."""
    bytes_read: int = field(default=0, compare=False)
    """Bytes of tensor shards read so far: checksum verification plus tensor data."""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def complete(self) -> bool:
        return self.manifest.status == "complete"

    def step(self, k: int) -> Step | None:
        for s in self.steps:
            if s.step == k:
                return s
        return None

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def tensor(self, step: int, rec: Record) -> np.ndarray | None:
        """The full tensor of ``rec`` at ``step`` if the trace stored it, else None."""
        if not rec.stored:
            return None
        rel = shard_name(step)
        path = self.path / rel
        if not path.is_file():
            raise TraceError(f"trace '{self.path}' lists a stored tensor at step {step} but {rel} is missing")
        if rel not in self._verified and rel in self.manifest.files:
            _check_digest(self.path, rel, self.manifest.files[rel])
            self._verified.add(rel)
            self.bytes_read += int(self.manifest.files[rel].get("size") or 0)
        arr = shards.load_one(path, tensor_key(rec.kind, rec.name))
        self.tensors_read += 1
        self.bytes_read += int(arr.nbytes)
        return arr


def _check_digest(root: Path, rel: str, info: dict) -> None:
    h = hashlib.sha256()
    with open(root / rel, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != info.get("sha256"):
        raise TraceError(
            f"trace '{root}' was modified after it was sealed ({rel} does not match its checksum); "
            "re-capture it"
        )


def _incomplete_message(path: Path, manifest: Manifest, steps_done: int) -> str:
    if manifest.status == "failed":
        why = manifest.error or (manifest.outcome or {}).get("detail") or "the run failed"
        return (
            f"trace '{path}' records a failed run ({why}; {steps_done} step(s) recorded); "
            "fix the run and re-capture it, or pass --allow-incomplete"
        )
    where = f"after step {steps_done - 1}" if steps_done else "before the first step"
    return (
        f"trace '{path}' is incomplete (the probe was stopped {where}); "
        "re-run it or pass --allow-incomplete"
    )


def read_trace(path: str | os.PathLike, *, allow_incomplete: bool = False) -> Trace:
    """Open and validate the trace at ``path``.

    With ``allow_incomplete``, an incomplete or failed trace is read up to its last
    whole step line; otherwise it is an error.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"no trace at '{path}' (no such file or folder); check the path")
    if not path.is_dir():
        raise TraceError(f"'{path}' is a file, not a trace folder; pass the folder bisect capture wrote")
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise TraceError(f"'{path}' is not a reprobisect trace (no manifest.json); pass a folder written by bisect capture")
    try:
        raw = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError):
        raise TraceError(f"trace '{path}' has a corrupt manifest.json (not JSON); re-capture it") from None
    except OSError as e:
        raise TraceError(f"cannot read trace '{path}': {e.strerror}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise TraceError(f"'{path}' is not a reprobisect trace (its manifest has no format '{FORMAT}')")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceError(f"trace '{path}' has no valid format version; re-capture it")
    if version > VERSION:
        raise TraceError(
            f"trace '{path}' uses format v{version}, newer than this reprobisect reads (v{VERSION}); "
            "upgrade: pip install -U reprobisect"
        )
    if version < 1:
        raise TraceError(f"trace '{path}' has unknown format version {version}; re-capture it")
    manifest = Manifest.from_json(raw, f"trace '{path}'")

    sealed = manifest.status != "incomplete"
    steps_path = path / "steps.jsonl"
    if not steps_path.is_file():
        raise TraceError(f"trace '{path}' has no steps.jsonl (truncated copy?); re-capture it")
    if sealed:
        for rel, info in manifest.files.items():
            p = path / rel
            if not p.is_file():
                raise TraceError(f"trace '{path}' is missing {rel} (truncated copy?); re-capture it")
            if p.stat().st_size != info.get("size"):
                raise TraceError(
                    f"trace '{path}' is truncated or modified: {rel} is {p.stat().st_size} bytes, "
                    f"the manifest says {info.get('size')}; re-capture it"
                )
        if "steps.jsonl" not in manifest.files:
            raise TraceError(f"trace '{path}' manifest does not list steps.jsonl; re-capture it")
        _check_digest(path, "steps.jsonl", manifest.files["steps.jsonl"])

    steps: list[Step] = []
    with open(steps_path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    whole = lines[:-1]  # after the last newline: a torn line or nothing
    if lines[-1].strip() and sealed:
        raise TraceError(f"trace '{path}' has a torn last line in steps.jsonl; re-capture it")
    for i, line in enumerate(whole):
        where = f"trace '{path}', steps.jsonl line {i + 1}"
        try:
            obj = json.loads(line)
        except ValueError:
            if not sealed:
                break
            raise TraceError(f"{where} is not JSON; re-capture it") from None
        step = Step.from_json(obj, where)
        if steps and step.step <= steps[-1].step:
            raise TraceError(f"{where}: step {step.step} comes after step {steps[-1].step}")
        steps.append(step)
    if sealed and len(steps) != manifest.steps:
        raise TraceError(
            f"trace '{path}' holds {len(steps)} steps but its manifest says {manifest.steps}; re-capture it"
        )
    if manifest.status != "complete" and not allow_incomplete:
        raise TraceError(_incomplete_message(path, manifest, len(steps)))
    return Trace(path=path, manifest=manifest, steps=steps)
