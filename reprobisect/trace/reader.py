"""Read and validate a trace; every problem becomes one ``TraceError`` line.

Validation on open: the folder and manifest exist and parse (size and JSON nesting
bounded before parsing), the format name and version are ours, every manifest field has
its type, the status is complete (or the caller allows otherwise), every file the
manifest lists has a plain relative name, resolves inside the trace (no symlink out) and
has its recorded size, ``steps.jsonl`` matches its SHA-256 and schema, and the step count
matches. Tensor shards are checked against their SHA-256 and their safetensors header
(dtype names, shapes, offsets that tile the data exactly) when first loaded, so comparing
two traces by fingerprint never reads a full tensor; ``verify_trace`` (or
``read_trace(..., verify=True)``) checks every listed file up front instead.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from reprobisect.errors import TraceError
from reprobisect.trace import shards
from reprobisect.trace.fingerprint import dtype_name
from reprobisect.trace.format import FORMAT, VERSION, Manifest, Record, Step, shard_name, tensor_key
from reprobisect.trace.jsonsafe import is_int, loads_bounded

__all__ = ["Trace", "Verified", "read_trace", "verify_trace"]

MAX_MANIFEST_BYTES = 64 * 2**20
"""Largest manifest.json read (real ones are a few KiB to a few MiB of environment)."""
MAX_STEPS_BYTES = 16 * 2**30
"""Largest steps.jsonl read (about 40 million records)."""
MAX_LINE_BYTES = 1 * 2**30
"""Longest steps.jsonl line (one step) read."""


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

    @property
    def detail(self) -> str:
        """``full`` or ``sentinel`` (``Manifest.detail``; traces written before the field: ``full``)."""
        return self.manifest.detail

    @property
    def state_steps(self) -> list[int]:
        """Steps after which the trace holds complete state (``state/step-K/``), in order."""
        steps = set()
        for rel in self.manifest.files:
            parts = rel.split("/")
            if len(parts) > 2 and parts[0] == "state" and parts[1].startswith("step-") and parts[1][5:].isdigit():
                steps.add(int(parts[1][5:]))
        return sorted(steps)

    def step(self, k: int) -> Step | None:
        for s in self.steps:
            if s.step == k:
                return s
        return None

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def tensor(self, step: int, rec: Record) -> np.ndarray | None:
        """The full tensor of ``rec`` at ``step`` if the trace stored it, else None.

        The shard is checked against the manifest's SHA-256 the first time it is read (a
        sealed trace must list it), its header is validated, and the tensor must have the
        dtype and shape its record names.
        """
        if not rec.stored:
            return None
        rel = shard_name(step)
        path = self.path / rel
        if rel not in self._verified:
            _inside(self.path, rel)
            if not path.is_file():
                raise TraceError(f"trace '{self.path}' lists a stored tensor at step {step} but {rel} is missing")
            if rel in self.manifest.files:
                _check_digest(self.path, rel, self.manifest.files[rel])
                self.bytes_read += int(self.manifest.files[rel]["size"])
            elif self.manifest.status != "incomplete":
                raise TraceError(
                    f"trace '{self.path}' was modified after it was sealed ({rel} is not in its manifest); re-capture it"
                )
            self._verified.add(rel)
        key = tensor_key(rec.kind, rec.name)
        try:
            arr = shards.load_one(path, key)
        except OSError as e:
            raise TraceError(f"cannot read {rel} of trace '{self.path}': {e.strerror or e}") from None
        if dtype_name(arr.dtype) != rec.dtype or tuple(arr.shape) != tuple(rec.shape):
            raise TraceError(
                f"trace '{self.path}': tensor '{key}' in {rel} is {dtype_name(arr.dtype)} {tuple(arr.shape)} "
                f"but steps.jsonl records {rec.dtype} {tuple(rec.shape)}; re-capture it"
            )
        self.tensors_read += 1
        self.bytes_read += int(arr.nbytes)
        return arr

    def verify(self) -> "Verified":
        """Check every file the manifest lists against its SHA-256, every shard's header and
        every stored record's tensor entry, without loading tensor data into memory."""
        return _verify(self)


@dataclass(frozen=True)
class Verified:
    """What ``verify_trace`` checked: the files (by SHA-256) and the bytes hashed."""

    path: Path
    files: int
    bytes: int
    stored_tensors: int


def _inside(root: Path, rel: str) -> Path:
    """``root / rel``, refused if it resolves (through symlinks) outside ``root``."""
    p = root / rel
    real_root = os.path.realpath(root)
    real = os.path.realpath(p)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise TraceError(f"trace '{root}': {rel} is a link to '{real}', outside the trace; re-capture it")
    return p


def _check_digest(root: Path, rel: str, info: dict) -> None:
    h = hashlib.sha256()
    try:
        with open(_inside(root, rel), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        raise TraceError(f"cannot read {rel} of trace '{root}': {e.strerror or e}") from None
    if h.hexdigest() != info.get("sha256"):
        raise TraceError(
            f"trace '{root}' was modified after it was sealed ({rel} does not match its checksum); "
            "re-capture it"
        )


def _verify(trace: Trace) -> Verified:
    root = trace.path
    total = 0
    entries: dict[str, dict[str, shards.Entry]] = {}
    for rel, info in trace.manifest.files.items():
        p = _inside(root, rel)
        if not p.is_file() or p.stat().st_size != info["size"]:
            raise TraceError(
                f"trace '{root}' is truncated or modified: {rel} is missing or not {info['size']} bytes; re-capture it"
            )
        _check_digest(root, rel, info)
        total += info["size"]
        if rel.endswith(".safetensors"):
            entries[rel] = shards.check(p)
        elif rel.endswith(".json"):
            _read_json(root, rel, MAX_MANIFEST_BYTES)
    stored = 0
    for s in trace.steps:
        for rec in s.records:
            if not rec.stored:
                continue
            rel = shard_name(s.step)
            if rel not in entries:
                if trace.manifest.status != "incomplete":
                    raise TraceError(
                        f"trace '{root}' was modified after it was sealed ({rel} is not in its manifest); re-capture it"
                    )
                if not _inside(root, rel).is_file():
                    raise TraceError(f"trace '{root}' lists a stored tensor at step {s.step} but {rel} is missing")
                entries[rel] = shards.check(root / rel)
            key = tensor_key(rec.kind, rec.name)
            e = entries[rel].get(key)
            if e is None:
                raise TraceError(f"trace '{root}': tensor '{key}' is not in {rel}; re-capture it")
            if dtype_name(e.dtype) != rec.dtype or e.shape != tuple(rec.shape):
                raise TraceError(
                    f"trace '{root}': tensor '{key}' in {rel} is {dtype_name(e.dtype)} {e.shape} "
                    f"but steps.jsonl records {rec.dtype} {tuple(rec.shape)}; re-capture it"
                )
            stored += 1
    trace._verified.update(r for r in entries if r in trace.manifest.files)
    trace.bytes_read += total
    return Verified(path=root, files=len(trace.manifest.files), bytes=total, stored_tensors=stored)


def verify_trace(path: str | os.PathLike, *, allow_incomplete: bool = False) -> Verified:
    """Read the trace at ``path`` and check all of it: ``read_trace`` plus the SHA-256 of
    every listed file and the header of every tensor shard. Raises ``TraceError``."""
    return read_trace(path, allow_incomplete=allow_incomplete).verify()


def _read_json(root: Path, rel: str, limit: int) -> object:
    """Parse ``root/rel``: inside the trace, a regular file, at most ``limit`` bytes, nested
    at most ``MAX_DEPTH`` deep."""
    p = _inside(root, rel)
    try:
        with open(p, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise TraceError(f"trace '{root}': {rel} is not a regular file; re-capture it")
            if st.st_size > limit:
                raise TraceError(f"trace '{root}': {rel} is {st.st_size} bytes, more than a trace's {limit}; re-capture it")
            data = f.read(limit + 1)
    except OSError as e:
        raise TraceError(f"cannot read trace '{root}': {rel}: {e.strerror or e}") from None
    try:
        return loads_bounded(data)
    except TraceError as e:
        raise TraceError(f"trace '{root}': {rel} {e}; re-capture it") from None
    except ValueError:
        raise TraceError(f"trace '{root}' has a corrupt {rel} (not JSON); re-capture it") from None


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


def read_trace(path: str | os.PathLike, *, allow_incomplete: bool = False, verify: bool = False) -> Trace:
    """Open and validate the trace at ``path``.

    With ``allow_incomplete``, an incomplete or failed trace is read up to its last
    whole step line; otherwise it is an error. With ``verify``, every listed file is also
    checked against its SHA-256 now (``Trace.verify``), not only when a tensor is read.
    """
    path = Path(path)
    manifest = _read_manifest(path)
    sealed = manifest.status != "incomplete"
    steps_path = _inside(path, "steps.jsonl")
    if not steps_path.is_file():
        if (path / "ranks").is_dir():
            raise TraceError(f"trace '{path}' is a multi-rank trace (one shard per rank under ranks/); "
                             "read it with reprobisect.trace.ranks.open_ranks")
        raise TraceError(f"trace '{path}' has no steps.jsonl (truncated copy?); re-capture it")
    if sealed:
        _check_files(path, manifest)
    steps = _read_steps(path, steps_path, sealed)
    if sealed and len(steps) != manifest.steps:
        raise TraceError(
            f"trace '{path}' holds {len(steps)} steps but its manifest says {manifest.steps}; re-capture it"
        )
    if manifest.status != "complete" and not allow_incomplete:
        raise TraceError(_incomplete_message(path, manifest, len(steps)))
    trace = Trace(path=path, manifest=manifest, steps=steps)
    if verify:
        trace.verify()
    return trace


def _read_manifest(path: Path) -> Manifest:
    """The folder is a trace of a format version this code reads: its validated manifest."""
    if not path.exists():
        raise TraceError(f"no trace at '{path}' (no such file or folder); check the path")
    if not path.is_dir():
        raise TraceError(f"'{path}' is a file, not a trace folder; pass the folder bisect capture wrote")
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise TraceError(f"'{path}' is not a reprobisect trace (no manifest.json); pass a folder written by bisect capture")
    raw = _read_json(path, "manifest.json", MAX_MANIFEST_BYTES)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise TraceError(f"'{path}' is not a reprobisect trace (its manifest has no format '{FORMAT}')")
    version = raw.get("version")
    if not is_int(version):
        raise TraceError(f"trace '{path}' has no valid format version; re-capture it")
    if version > VERSION:
        raise TraceError(
            f"trace '{path}' uses format v{version}, newer than this reprobisect reads (v{VERSION}); "
            "upgrade: pip install -U reprobisect"
        )
    if version < 1:
        raise TraceError(f"trace '{path}' has unknown format version {version}; re-capture it")
    return Manifest.from_json(raw, f"trace '{path}'")


def _check_files(path: Path, manifest: Manifest) -> None:
    """A sealed trace: every listed file is there with its recorded size, steps.jsonl with its SHA-256."""
    for rel, info in manifest.files.items():
        p = _inside(path, rel)
        if not p.is_file():
            raise TraceError(f"trace '{path}' is missing {rel} (truncated copy?); re-capture it")
        if p.stat().st_size != info["size"]:
            raise TraceError(
                f"trace '{path}' is truncated or modified: {rel} is {p.stat().st_size} bytes, "
                f"the manifest says {info['size']}; re-capture it"
            )
    if "steps.jsonl" not in manifest.files:
        raise TraceError(f"trace '{path}' manifest does not list steps.jsonl; re-capture it")
    _check_digest(path, "steps.jsonl", manifest.files["steps.jsonl"])


def _read_steps(path: Path, steps_path: Path, sealed: bool) -> list[Step]:
    """The steps of steps.jsonl in order; an unsealed trace is read up to its last whole, parseable line."""
    try:
        with open(steps_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_STEPS_BYTES:
                raise TraceError(f"trace '{path}': steps.jsonl is {size} bytes, more than a trace's {MAX_STEPS_BYTES}")
            data = f.read(MAX_STEPS_BYTES + 1)
    except OSError as e:
        raise TraceError(f"cannot read trace '{path}': steps.jsonl: {e.strerror or e}") from None
    lines = data.split(b"\n")
    whole = lines[:-1]  # after the last newline: a torn line or nothing
    if lines[-1].strip() and sealed:
        raise TraceError(f"trace '{path}' has a torn last line in steps.jsonl; re-capture it")
    steps: list[Step] = []
    for i, line in enumerate(whole):
        where = f"trace '{path}', steps.jsonl line {i + 1}"
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"{where} is {len(line)} bytes, more than a step's {MAX_LINE_BYTES}; re-capture it")
        try:
            obj = loads_bounded(line)
        except TraceError as e:
            raise TraceError(f"{where} {e}; re-capture it") from None
        except ValueError:
            if not sealed:
                break
            raise TraceError(f"{where} is not JSON; re-capture it") from None
        step = Step.from_json(obj, where)
        if steps and step.step <= steps[-1].step:
            raise TraceError(f"{where}: step {step.step} comes after step {steps[-1].step}")
        steps.append(step)
    return steps
