"""Read and validate a trace; every problem becomes one ``TraceError`` line.

Validation on open: the folder and manifest exist and parse (size and JSON nesting
bounded before parsing), the format name and version are ours, every manifest field has
its type, the status is complete (or the caller allows otherwise), every file the
manifest lists has a plain relative name, resolves inside the trace (no symlink out) and
has its recorded size, ``steps.jsonl`` matches its SHA-256 and schema, and the step count
matches. Tensor shards are checked against their SHA-256 and their safetensors header
(dtype names, shapes, offsets that tile the data exactly) when first loaded, so comparing
two traces by fingerprint never reads a full tensor. ``verify_trace`` (or
``read_trace(..., verify=True)``) checks all of it up front instead, and that the files
agree with each other (a forger can rewrite a digest with the file): every listed file
unchanged, no file unlisted (``UNLISTED_OK`` aside), every stored record's tensor in its
shard with its dtype, shape and fingerprint, no tensor in a step shard that no record
stores, and every tensor name plain.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from reprobisect.errors import TraceError
from reprobisect.trace import shards
from reprobisect.trace.fingerprint import dtype_name, fingerprint
from reprobisect.trace.format import FORMAT, VERSION, Manifest, Record, Step, shard_name, tensor_key
from reprobisect.trace.jsonsafe import is_int, loads_bounded

__all__ = ["UNLISTED_OK", "Trace", "Verified", "read_trace", "verify_trace"]

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
        """Check every file the manifest lists against its SHA-256, that the folder holds no
        other (``UNLISTED_OK`` aside), every shard's header and tensor names, and every
        stored record's tensor (dtype, shape, fingerprint; one tensor in memory at a time)."""
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


UNLISTED_OK = frozenset({"manifest.json", "output.log", "ray.json"})
"""Files a trace's folder may hold that its manifest does not list: the manifest itself,
the command's output (``support.outputlog``: written after sealing, not evidence) and the
Ray executor's placement record (``ray.json``). ``verify`` refuses any other unlisted file."""
_LISTED = re.compile(r"^(steps\.jsonl|tensors/step-\d{6,}\.safetensors|state/step-\d+/.+\.(safetensors|json))$")
_UNSAFE_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\\\\\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_MAX_TENSOR_NAME = 1024


def _verify(trace: Trace) -> Verified:
    """``Trace.verify``: every listed file unchanged, nothing unlisted, every shard consistent
    with the records that point into it (see ``_verify_stored``)."""
    root = trace.path
    total, entries = _verify_listed(trace)
    for rel in _unlisted(trace):  # an unsealed trace lists nothing yet: what it holds is checked as found
        if rel.endswith(".safetensors"):
            entries[rel] = _check_shard(root, rel)
        elif rel.endswith(".json"):
            _read_json(root, rel, MAX_MANIFEST_BYTES)
    stored = _verify_stored(trace, entries)
    trace._verified.update(r for r in entries if r in trace.manifest.files)
    trace.bytes_read += total
    return Verified(path=root, files=len(trace.manifest.files), bytes=total, stored_tensors=stored)


def _verify_listed(trace: Trace) -> tuple[int, dict[str, dict[str, shards.Entry]]]:
    """Every listed file: a part of a trace, there with its size and SHA-256; its header
    (shards) or JSON (state) valid. Returns the bytes hashed and each shard's entries."""
    root, total = trace.path, 0
    entries: dict[str, dict[str, shards.Entry]] = {}
    for rel, info in trace.manifest.files.items():
        if not _LISTED.match(rel):
            raise TraceError(f"trace '{root}' lists {rel}, which is not a file of a trace "
                             "(steps.jsonl, tensors/, state/); re-capture it")
        p = _inside(root, rel)
        if not p.is_file() or p.stat().st_size != info["size"]:
            raise TraceError(
                f"trace '{root}' is truncated or modified: {rel} is missing or not {info['size']} bytes; re-capture it"
            )
        _check_digest(root, rel, info)
        total += info["size"]
        if rel.endswith(".safetensors"):
            entries[rel] = _check_shard(root, rel)
        elif rel.endswith(".json"):
            _read_json(root, rel, MAX_MANIFEST_BYTES)
    return total, entries


def _check_shard(root: Path, rel: str) -> dict[str, shards.Entry]:
    """The validated header of the shard ``rel``, every tensor name in it plain."""
    p = _inside(root, rel)
    try:
        entries = shards.check(p)
    except OSError as e:
        raise TraceError(f"cannot read {rel} of trace '{root}': {e.strerror or e}") from None
    for key in entries:
        why = _unsafe_name(key)
        if why:
            raise TraceError(f"trace '{root}': {rel} holds a tensor named {_shown(key)}, {why}; re-capture it")
    return entries


def _unsafe_name(key: str) -> str | None:
    """Why the shard tensor name ``key`` is not plain (None when it is): names travel into
    messages, reports and file names, so no control or direction characters, backslashes,
    absolute paths or ``..`` parts. (``<Linear>``, ``data[0]``, ``a.b#1`` are real names.)"""
    if not key or len(key) > _MAX_TENSOR_NAME:
        return f"not 1 to {_MAX_TENSOR_NAME} characters"
    if _UNSAFE_CHARS.search(key):
        return "with a control character or backslash"
    if key.startswith("/") or ".." in key.split("/"):
        return "a path out of its place (an absolute path or a '..' part)"
    return None


def _shown(name: str) -> str:
    """``name`` quoted for a one-line message: escaped when not plain, cut when long."""
    s = ascii(name) if _UNSAFE_CHARS.search(name) else f"'{name}'"
    return s if len(s) <= 80 else s[:77] + "..."


def _unlisted(trace: Trace) -> list[str]:
    """The files of the trace's folder its manifest does not list (``UNLISTED_OK`` aside).

    A sealed trace may hold none: one is refused. An unsealed trace lists nothing yet; its
    files must be of a trace's layout and are returned, to be checked as they are. A file
    counts as listed when it is a listed file's real path (a link inside the trace to it);
    a link is allowed only where a listed file's path goes through it."""
    root = trace.path
    listed = trace.manifest.files
    real = {os.path.realpath(root / rel) for rel in listed}
    through = {"/".join(rel.split("/")[:i]) for rel in listed for i in range(1, rel.count("/") + 2)}
    sealed = trace.manifest.status != "incomplete"
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        names = files + [d for d in dirs if (here / d).is_symlink()]
        for name in sorted(names):
            rel = (here / name).relative_to(root).as_posix()
            if rel in UNLISTED_OK or rel in through and (here / name).is_symlink() or os.path.realpath(here / name) in real:
                continue
            if not sealed and (_LISTED.match(rel) or _writer_temp(name)):
                if _LISTED.match(rel):
                    found.append(rel)
                continue
            what = "its manifest does not list (added after it was sealed?)" if sealed else "is not part of a trace"
            raise TraceError(f"trace '{root}' holds {_shown(rel)}, which {what}; remove it or re-capture the trace")
    return found


def _writer_temp(name: str) -> bool:
    """A temporary file of a writer killed mid-write (``.NAME.tmpPID``): an unsealed trace may hold one."""
    return name.startswith(".") and ".tmp" in name


def _verify_stored(trace: Trace, entries: dict[str, dict[str, shards.Entry]]) -> int:
    """Every stored record's tensor is in the shard of its step with its dtype and shape
    and the bits its fingerprint names; every tensor of a step shard is a stored record's."""
    root = trace.path
    wanted: dict[str, dict[str, Record]] = {rel: {} for rel in entries if rel.startswith("tensors/")}
    for s in trace.steps:
        for rec in s.records:
            if rec.stored:
                rel = shard_name(s.step)
                if rel not in entries:
                    if trace.manifest.status != "incomplete":
                        raise TraceError(f"trace '{root}' was modified after it was sealed "
                                         f"({rel} is not in its manifest); re-capture it")
                    raise TraceError(f"trace '{root}' lists a stored tensor at step {s.step} but {rel} is missing")
                wanted[rel][tensor_key(rec.kind, rec.name)] = rec
    if trace.manifest.status == "incomplete":  # a shard past the last whole step line: never read
        wanted = {rel: recs for rel, recs in wanted.items() if recs}
    for rel, recs in wanted.items():
        foreign = sorted(set(entries[rel]) - set(recs))
        if foreign:
            raise TraceError(f"trace '{root}': {rel} holds tensor {_shown(foreign[0])}, which no record of "
                             "steps.jsonl stores (added or renamed after recording?); re-capture it")
        for key, rec in recs.items():
            e = entries[rel].get(key)
            if e is None:
                raise TraceError(f"trace '{root}': tensor '{key}' is not in {rel}; re-capture it")
            if dtype_name(e.dtype) != rec.dtype or e.shape != tuple(rec.shape):
                raise TraceError(
                    f"trace '{root}': tensor '{key}' in {rel} is {dtype_name(e.dtype)} {e.shape} "
                    f"but steps.jsonl records {rec.dtype} {tuple(rec.shape)}; re-capture it"
                )
        _check_fingerprints(root, rel, recs)
    return sum(len(recs) for recs in wanted.values())


def _check_fingerprints(root: Path, rel: str, recs: dict[str, Record]) -> None:
    """Each tensor of the shard ``rel`` has the bits its record's fingerprint names: a
    shard rewritten with other values (and its SHA-256 updated) is refused."""
    try:
        for key, arr in shards.load_many(_inside(root, rel), list(recs)):
            if fingerprint(arr) != recs[key].fingerprint:
                raise TraceError(f"trace '{root}': tensor '{key}' in {rel} does not hold the values its record's "
                                 "fingerprint names (changed after recording?); re-capture it")
    except OSError as e:
        raise TraceError(f"cannot read {rel} of trace '{root}': {e.strerror or e}") from None


def verify_trace(path: str | os.PathLike, *, allow_incomplete: bool = False) -> Verified:
    """Read the trace at ``path`` and check all of it (``Trace.verify``): the SHA-256 of every
    listed file, nothing unlisted, every shard against the records that point into it.
    Raises ``TraceError``."""
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
    whole step line; otherwise it is an error. With ``verify``, all of the trace is also
    checked now (``Trace.verify``), not only the shards a tensor is read from, when it is.
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
