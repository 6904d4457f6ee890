"""Write a trace so that it can never read as complete unless it is.

The manifest is written first with status ``incomplete``; steps are appended to
``steps.jsonl`` one line per step; tensors and states go to safetensors files written by
temp + rename (no fsync inside the training step: nothing in an unsealed trace reads as
complete; captured state is hashed and written by a background thread, which sealing
waits for). Sealing fsyncs everything, records the size and SHA-256 of every file, and
replaces the manifest (temp + fsync + rename) with status ``complete`` or ``failed``. A writer killed at any point leaves ``incomplete``. Opening a writer on an
existing trace replaces it whole (a retried probe must not mix two attempts); anything
else already at the path is refused, never deleted.
"""

from __future__ import annotations

import datetime as _dt
import contextlib
import copy
import hashlib
import json
import math
import mmap
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import orjson

from reprobisect import __version__
from reprobisect.errors import TraceError
from reprobisect.trace import shards
from reprobisect.trace.format import KINDS, Manifest, Record, Step, shard_name, tensor_key

__all__ = ["TraceWriter", "json_safe", "write_json_atomic"]


def json_safe(x: Any) -> Any:
    """``x`` as strict JSON: NumPy scalars and arrays become Python values, non-finite floats
    the strings ``"nan"``/``"inf"``/``"-inf"`` (the convention of stats; ``format.stat_value``
    reads them back). A NaN loss is exactly what a trace must be able to record."""
    if isinstance(x, float):
        if math.isfinite(x):
            return x
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x is None or isinstance(x, (str, bool, int)):
        return x
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (np.generic, np.ndarray)):
        return json_safe(x.tolist())
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", None) == 0:  # 0-d framework tensor
        return json_safe(x.item())
    if hasattr(x, "tolist") and callable(x.tolist):
        return json_safe(x.tolist())
    return x


def write_json_atomic(path: Path, data: Any, *, compact: bool = False, fsync: bool = True) -> None:
    """Write ``data`` as strict JSON to ``path`` atomically (a temp file, fsync, rename).

    ``compact``: one line through the C encoder (no indentation: ``json`` indents in pure
    Python, ~30x slower), for machine-read files such as captured state, whose RNG lists run
    to thousands of numbers; ``json_safe``'s full walk only when the data is not strict JSON
    as it is. ``fsync=False``: the caller makes it durable later (see ``shards.save``)."""
    _write_atomic(path, _json_bytes(data, compact=compact), fsync=fsync)


def step_line(data: Any) -> bytes:
    """One line of ``steps.jsonl`` (``Step.to_json()``): strict JSON, non-finite floats as
    ``json_safe`` writes them, as the C encoder of ``json`` writes it but several times
    faster (orjson: under 1 us a record, where ``json`` spends ~1 us on each float's repr).

    orjson writes NaN and infinities as ``null``, silently. A line with a ``null`` in it is
    kept only when no value was a non-finite float: each record's statistics are summed
    (where a NaN sits; a sum that overflows only costs the slow path) and the rest of the
    step is read back and compared. Otherwise, and for anything orjson refuses (NumPy
    scalars, integer keys, integers past 64 bits: those last through ``json``), the line is
    encoded again from ``json_safe`` (a full walk)."""
    try:
        line = orjson.dumps(data)
        if b"null" not in line or _no_non_finite(data):
            return line + b"\n"
    except TypeError:  # (orjson.JSONEncodeError)
        pass
    safe = json_safe(data)
    try:
        return orjson.dumps(safe) + b"\n"
    except TypeError:
        return json.dumps(safe, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _no_non_finite(step: Mapping[str, Any]) -> bool:
    """Whether a step's JSON data holds no NaN or infinite float (see ``step_line``)."""
    rest: list[Any] = [v for k, v in step.items() if k != "records"]
    try:
        for r in step.get("records") or ():
            st = r.get("stats")
            if st and not math.isfinite(sum(st.values())):
                return False
            if "meta" in r:  # (its other fields are strings, integers and booleans: Record.to_json)
                rest.append(r["meta"])
    except (TypeError, AttributeError):  # not numbers, not records: the general check
        return orjson.loads(orjson.dumps(step)) == step
    return orjson.loads(orjson.dumps(rest)) == rest


def _json_bytes(data: Any, *, compact: bool) -> bytes:
    if compact:
        try:
            text = json.dumps(data, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            text = json.dumps(json_safe(data), separators=(",", ":"), allow_nan=False)
    else:
        text = json.dumps(json_safe(data), indent=1, sort_keys=False, allow_nan=False)
    return (text + "\n").encode()


def _write_atomic(path: Path, data: bytes, *, fsync: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk (ENOSPC) mid-write: leave no half-written temporary behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_path(path: Path) -> None:
    """Make a file written without fsync, or the renames inside a folder, durable (best
    effort where the OS refuses)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_ASYNC_STATE_MAX = 2 << 30


def _async_state_max() -> int:
    """The largest capture copied and written in the background: 2 GiB, or a quarter of the
    memory available now when that is less (a copy of a large CPU model must not run the
    machine out of memory; larger captures are written inside the step, without a copy)."""
    cap = _ASYNC_STATE_MAX
    try:
        cap = min(cap, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)
    except (ValueError, OSError, AttributeError):
        pass
    return cap


_ARENA_MIN = 1 << 16
_ALIGN = 64


def _outside_heap(layout: tuple[tuple[str, tuple[int, ...], np.dtype], ...]) -> list[np.ndarray]:
    """Empty arrays of ``layout`` (key, shape, dtype each), carved from one anonymous map of
    their own rather than from the allocator the training's tensors come from (below
    ``_ARENA_MIN`` bytes in all, ordinary arrays). One map for all of a stateful object's
    tensors: one each could run into the kernel's limit on maps (65,530 by default) for a
    model of tens of thousands of tensors."""
    counts = [int(np.prod(shape, dtype=np.int64)) for _, shape, _ in layout]
    offsets, at = [], 0
    for n, (_, _, dtype) in zip(counts, layout):
        offsets.append(at)
        at += -(-n * dtype.itemsize // _ALIGN) * _ALIGN
    if at < _ARENA_MIN:
        return [np.empty(shape, dtype=dtype) for _, shape, dtype in layout]
    raw = mmap.mmap(-1, at)
    return [np.frombuffer(raw, dtype=dtype, count=n, offset=off).reshape(shape) if n else np.empty(shape, dtype=dtype)
            for n, off, (_, shape, dtype) in zip(counts, offsets, layout)]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _clear_previous(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise TraceError(f"'{path}' exists and is not a trace folder; choose another output path (nothing was deleted)")
    from reprobisect.trace.outdir import is_trace_dir

    # a file merely named manifest.json is not a trace: only a manifest that parses as one
    if any(path.iterdir()) and not is_trace_dir(path):
        raise TraceError(
            f"'{path}' is a non-empty folder that is not a reprobisect trace; "
            "choose another output path (nothing was deleted)"
        )
    trash = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


class TraceWriter:
    """Writes one trace; use as a context manager or call ``close``.

    ``record`` appends a record to the current step in the order given (chain order is
    the caller's job); passing ``array`` stores the full tensor for that step too.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        command: list[str] | None = None,
        environment: Mapping[str, Any] | None = None,
        policy: Mapping[str, Any] | None = None,
        seed: Any = None,
        revision: Mapping[str, Any] | None = None,
        recorder: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        _clear_previous(self.path)
        self.path.mkdir(parents=True)
        self._manifest = Manifest(
            status="incomplete",
            command=list(command or []),
            environment=dict(environment or {}),
            policy=dict(policy or {}),
            seed=seed,
            revision=dict(revision) if revision else None,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            recorder={"name": "reprobisect", "version": __version__, **dict(recorder or {})},
            extra=dict(extra or {}),
        )
        self._write_manifest()
        fsync_path(self.path.parent)
        self._steps_file = open(self.path / "steps.jsonl", "wb")
        self._files: dict[str, dict[str, Any]] = {}
        self._step: int | None = None
        self._records: list[Record] = []
        self._keys: set[tuple[str, str]] = set()
        self._arrays: dict[str, np.ndarray] = {}
        self._steps_written = 0
        self._last_step = -1
        self._closed = False
        self._state_pool: Any = None  # the background writer of captured state (write_state)
        self._state_jobs: list[Any] = []
        self._state_step: int | None = None
        # per stateful object: the layout of its copies and the copies, kept for the next capture
        self._state_buffers: dict[str, tuple[tuple, list[np.ndarray]]] = {}
        self._state_lent: list[tuple[str, tuple[tuple, list[np.ndarray]]]] = []  # ... and those pending writes hold
        self._state_error: Exception | None = None

    @property
    def extra(self) -> dict[str, Any]:
        """The manifest's ``extra`` so far (a copy)."""
        return dict(self._manifest.extra)

    def update_extra(self, extra: Mapping[str, Any]) -> None:
        """Merge ``extra`` into the manifest's ``extra`` now (what a recorder learns during
        the run, e.g. a distributed run's rank and backend); written when sealed."""
        self._manifest.extra.update(extra)

    # -- steps ---------------------------------------------------------------------

    @property
    def steps_written(self) -> int:
        return self._steps_written

    def begin_step(self, step: int) -> None:
        if self._closed:
            raise TraceError(f"trace '{self.path}' is already sealed")
        self._raise_state_error()
        if self._step is not None:
            raise TraceError(f"step {self._step} of trace '{self.path}' was not ended before step {step}")
        if step <= self._last_step:
            raise TraceError(f"step {step} written after step {self._last_step}; steps must increase")
        self._step = step
        self._records = []
        self._keys = set()
        self._arrays = {}

    def record(self, rec: Record, array: np.ndarray | None = None) -> Record:
        if self._step is None:
            raise TraceError("record() called outside begin_step()/end_step()")
        if rec.kind not in KINDS:
            raise TraceError(f"record '{rec.name}' has unknown kind '{rec.kind}' (one of {', '.join(KINDS)})")
        key = (rec.kind, rec.name)
        if key in self._keys:
            raise TraceError(f"record {rec.kind} '{rec.name}' written twice in step {self._step}")
        order = len(self._records)
        if array is not None:
            # A copy: the caller's buffer (a parameter's memory, shared with torch on CPU)
            # may change before end_step writes it, and must not disagree with the fingerprint.
            self._arrays[tensor_key(rec.kind, rec.name)] = np.array(array, copy=True)
            rec = _replace(rec, order=order, stored=True)
        elif rec.order != order:  # a record made with its place is kept as it is
            rec = _replace(rec, order=order)
        self._records.append(rec)
        self._keys.add(key)
        return rec

    def end_step(self, scalars: Mapping[str, Any] | None = None, batch_ids: list[Any] | None = None) -> None:
        if self._step is None:
            raise TraceError("end_step() called without begin_step()")
        if self._arrays:
            name = shard_name(self._step)
            (self.path / "tensors").mkdir(exist_ok=True)
            size, digest = shards.save(self._arrays, self.path / name, fsync=False)
            self._files[name] = {"size": size, "sha256": digest}
        step = Step(step=self._step, records=tuple(self._records), batch_ids=batch_ids, scalars=dict(scalars or {}))
        self._steps_file.write(step_line(step.to_json()))
        self._steps_file.flush()
        self._steps_written += 1
        self._last_step = self._step
        self._step = None
        self._records, self._arrays = [], {}

    # -- state ---------------------------------------------------------------------

    def write_state(self, step: int, name: str, tensors: Mapping[str, np.ndarray], meta: Any) -> None:
        """Store one stateful object's state at ``step``: tensors + JSON, never pickle.

        The files are written by a background thread, past the page cache where the file
        system allows it (``shards.write_direct``), so the training step waits only for a
        copy of the arrays that may share memory with live tensors (a 48 MB capture: ~55 ms
        of hashing and writing off the step; the copy, ~2.5 ms, goes into the buffers of the
        last capture, kept outside malloc's heap). ``meta`` and any array that is a view (torch's
        CPU tensors share their memory with NumPy) may change once this returns; an array
        that owns its memory is handed over as it is. One capture is pending at a time (a
        later step's waits for it), captures too large to copy (``_ASYNC_STATE_MAX``) are
        written here, and a failed write is raised by the next call, or seals the trace as
        failed."""
        self._raise_state_error()
        if self._state_step is not None and self._state_step != step:
            self.drain()
        folder = self.path / "state" / f"step-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        text = _json_bytes(meta, compact=True)
        arrays = {k: np.asarray(a) for k, a in tensors.items()}
        if sum(a.nbytes for a in arrays.values()) > _async_state_max():
            self._write_state_files(step, name, folder, arrays, text)
            return
        arrays = self._private_copies(name, arrays)
        if self._state_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._state_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reprobisect-state")
        self._state_step = step
        self._state_jobs.append(self._state_pool.submit(self._write_state_in_background, step, name, folder, arrays, text))

    def _private_copies(self, name: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` with every one that does not own its memory (a view of a live tensor)
        replaced by a private copy, in the buffers the last capture of ``name`` used when
        their layout is the same, else in new ones: a fresh buffer of a large state costs its
        page faults at every capture (an MLP's 48 MB: 12.6 ms against 2.7 ms into a used
        buffer).

        The buffers are one map of their own (``_outside_heap``): taken from malloc, 48 MB of
        them held between a capture and the next drain made every step in between slower
        (an MLP's sentinel run, capture at the first of 50 steps: 1.26x against 1.07x a plain
        step; measured, not traced: most likely malloc's placement of the training's own
        large tensors changed around them). They are lent to the pending writes and taken
        back when those are drained, if the capture's copies are at most a sixteenth of the
        memory available then (or 512 MiB): a larger state is not held between captures,
        where it would add to the training's own peak."""
        views = [(k, a) for k, a in arrays.items() if not a.flags.owndata]
        if not views:
            return arrays
        layout = tuple((k, a.shape, a.dtype) for k, a in views)
        kept = self._state_buffers.pop(name, None)
        bufs = kept[1] if kept is not None and kept[0] == layout else _outside_heap(layout)
        for (_, a), buf in zip(views, bufs):
            np.copyto(buf, a, casting="no")
        self._state_lent.append((name, (layout, bufs)))
        return {**arrays, **{k: buf for (k, _), buf in zip(views, bufs)}}

    def _write_state_in_background(self, *job: Any) -> None:
        if self._state_error is not None:  # no later file of a capture that failed
            return
        try:
            self._write_state_files(*job, direct=True)
        except Exception as e:  # an OSError mostly (the disk is full): the next call raises it
            if self._state_error is None:
                self._state_error = e

    def _write_state_files(self, step: int, name: str, folder: Path, arrays: dict[str, np.ndarray], text: bytes,
                           direct: bool = False) -> None:
        """``direct``: past the page cache (``shards.write_direct``), from the background
        thread only: its wait for the disk costs the training nothing, new page-cache pages do."""
        rel = f"state/step-{step}/{name}"
        size, digest = shards.save(arrays, folder / f"{name}.safetensors", fsync=False, direct=direct)
        self._files[f"{rel}.safetensors"] = {"size": size, "sha256": digest}
        _write_atomic(folder / f"{name}.json", text, fsync=False)
        self._files[f"{rel}.json"] = {"size": len(text), "sha256": hashlib.sha256(text).hexdigest()}

    def drain(self) -> None:
        """Wait until every captured state is on disk (in the trace's file list); raise the
        first failed write."""
        jobs, self._state_jobs, self._state_step = self._state_jobs, [], None
        for job in jobs:
            job.result()
        if sum(b.nbytes for _, (_, bufs) in self._state_lent for b in bufs) <= _async_state_max() // 4:
            self._state_buffers.update(self._state_lent)  # (kept for the next capture)
        self._state_lent = []
        self._raise_state_error()

    def _raise_state_error(self) -> None:
        e = self._state_error
        if e is not None:
            raise TraceError(f"captured state could not be written to '{self.path}': {e}") from e

    # -- sealing -------------------------------------------------------------------

    def close(
        self,
        status: str = "complete",
        *,
        outcome: Mapping[str, Any] | None = None,
        error: str | None = None,
        environment: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        seed: Any = None,
    ) -> None:
        """Seal the trace: ``complete`` or ``failed`` (with the error). Idempotent.
        ``seed``, when given, replaces the manifest's (a seed the recorder saw the program set)."""
        if self._closed:
            return
        if status not in ("complete", "failed"):
            raise TraceError(f"a trace is sealed as 'complete' or 'failed', not '{status}'")
        if self._step is not None:
            status = "failed"
            error = error or f"step {self._step} was begun but never ended"
        try:
            self.drain()
        except TraceError as e:
            status, error = "failed", error or str(e)
        if self._state_pool is not None:
            self._state_pool.shutdown()
        self._state_buffers = {}
        self._steps_file.flush()
        os.fsync(self._steps_file.fileno())
        self._steps_file.close()
        steps_path = self.path / "steps.jsonl"
        self._files["steps.jsonl"] = {"size": steps_path.stat().st_size, "sha256": _file_digest(steps_path)}
        env = dict(self._manifest.environment)
        env.update(environment or {})
        ext = dict(self._manifest.extra)
        ext.update(extra or {})
        self._manifest = _replace(
            self._manifest,
            status=status,
            steps=self._steps_written,
            outcome=dict(outcome) if outcome else None,
            error=error,
            environment=env,
            extra=ext,
            seed=seed if seed is not None else self._manifest.seed,
            files=dict(sorted(self._files.items())),
        )
        # the tensor and state files were written without fsync (a state capture's 50 MB
        # waited ~70 ms here for it, inside the training step): durable now, before the
        # manifest says complete; by now the OS has mostly written them back already
        for rel in self._files:
            if rel != "steps.jsonl":
                fsync_path(self.path / rel)
        for folder in (self.path / "tensors", self.path / "state", *(self.path / "state").glob("step-*")):
            if folder.is_dir():
                fsync_path(folder)
        self._write_manifest()
        fsync_path(self.path)
        self._closed = True

    def _write_manifest(self) -> None:
        """Write the manifest, signed for this user (``reprobisect.support.trust``: what ``zoom`` may re-run)."""
        from reprobisect.support.trust import TRUST_FIELD, sign

        data = json_safe(self._manifest.to_json())
        sig = sign(data)
        if sig is not None:
            data["recorder"] = {**(data.get("recorder") or {}), TRUST_FIELD: sig}
        write_json_atomic(self.path / "manifest.json", data)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close("complete")
        else:
            self.close("failed", error=f"{exc_type.__name__}: {exc}")


def _replace(obj, **changes):
    """``dataclasses.replace`` without its per-call field walk (the recorder writes hundreds
    of records a step): a shallow copy of the frozen dataclass with ``changes`` set (its
    ``__dict__`` copied; ``copy.copy`` goes through ``__reduce_ex__``, several times slower)."""
    fields = getattr(obj, "__dict__", None)
    if fields is None:  # a dataclass with slots
        new = copy.copy(obj)
        for k, v in changes.items():
            object.__setattr__(new, k, v)
        return new
    new = object.__new__(type(obj))
    new.__dict__.update(fields)
    new.__dict__.update(changes)
    return new
