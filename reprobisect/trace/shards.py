"""Reading and writing safetensors files with NumPy, for every dtype a trace may hold.

The safetensors layout is simple (8-byte little-endian header size, JSON header, raw
bytes), and writing it here lets bfloat16 and float8 round-trip through ml_dtypes (the
safetensors NumPy binding rejects float8) and lets the reader pull one tensor out of a
shard without reading the rest. Files written here load with the safetensors library.
Nothing is ever unpickled. Reading validates a header as strictly as the safetensors
library does (``parse_header``), so a forged or damaged shard is a ``TraceError``, never
another exception and never a tensor read from the wrong bytes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import ml_dtypes
import numpy as np

from reprobisect.errors import TraceError
from reprobisect.trace.jsonsafe import is_int, loads_bounded

__all__ = ["DIRECT_MIN_BYTES", "Entry", "save", "load", "load_one", "load_many", "keys", "check", "parse_header",
           "write_direct"]

_TO_ST = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
}
_FROM_ST = {v: k for k, v in _TO_ST.items()}
_MAX_HEADER = 100 * 2**20


def save(tensors: Mapping[str, np.ndarray], path: str | os.PathLike, metadata: Mapping[str, str] | None = None,
         *, fsync: bool = True, direct: bool = False) -> tuple[int, str]:
    """Write ``tensors`` to ``path`` atomically (temp file, fsync, rename).

    Returns the file's size and SHA-256, computed from the bytes as they are written.
    ``fsync=False``: the caller makes the file durable later (a trace writer, before it
    seals: a file inside an unsealed trace is never read as complete). ``direct=True``: a
    file of at least ``DIRECT_MIN_BYTES`` bypasses the page cache where the file system
    allows it (``write_direct``); for a writer in a background thread, which may wait for
    the disk, never inside a training step.
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        a = np.asarray(arr)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")
        st = _TO_ST.get(a.dtype.newbyteorder("=") if a.dtype.byteorder == ">" else a.dtype)
        if st is None:
            raise TraceError(f"tensor '{name}' has dtype {a.dtype}, which a trace cannot store")
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * ((-len(head)) % 8)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    pieces = [struct.pack("<Q", len(head)), head, *(memoryview(a.reshape(-1).view(np.uint8)) for a in arrays)]
    size = 8 + len(head) + offset
    try:
        digest = write_direct(tmp, pieces, fsync=fsync) if direct and size >= DIRECT_MIN_BYTES else None
        if digest is None:
            digest = hashlib.sha256()
            with open(tmp, "wb") as f:
                for piece in pieces:
                    f.write(piece)
                    digest.update(piece)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no partial file behind
        raise
    os.replace(tmp, path)
    return size, digest.hexdigest()


DIRECT_MIN_BYTES = 1 << 20
"""Smaller files go through the page cache: their pages cost little, a direct write's
wait for the disk more."""
_BLOCK = 4096  # O_DIRECT's alignment of memory, length and offset (a multiple of any disk's sector)
_STAGE_BYTES = 4 << 20
_stage = threading.local()


def write_direct(path: Path, pieces: list, *, fsync: bool) -> Any:
    """Write ``pieces`` (bytes-like, in order) to a new file at ``path`` with ``O_DIRECT``,
    through a page-aligned staging buffer kept per thread, and return their SHA-256; ``None``
    (nothing left at ``path``) where the platform or the file system refuses ``O_DIRECT``
    (macOS; tmpfs before Linux 6.6), for the caller's ordinary write.

    Why: a state capture writes tens of MB to hundreds of GB into new files while training
    runs. Through the page cache every MB is a fresh page the kernel must find, fill and
    later write back, beside the training's own memory; measured on a 2-vCPU VM, writing
    48 MB into new files in a background thread cost the training threads 120-280 ms
    (in tmpfs too), writing them here 10-60 ms. The last block is written padded and the
    file truncated to its exact size."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise
    stage = getattr(_stage, "buf", None)
    if stage is None:  # page-aligned; NumPy's copies into it let go of the GIL, a memoryview's do not
        stage = _stage.buf = np.frombuffer(mmap.mmap(-1, _STAGE_BYTES), dtype=np.uint8)
    digest, at, first, total = hashlib.sha256(), 0, True, 0
    try:
        for piece in pieces:
            piece = np.frombuffer(piece, dtype=np.uint8)
            digest.update(piece)
            total += len(piece)
            done = 0
            while done < len(piece):
                n = min(len(piece) - done, len(stage) - at)
                stage[at:at + n] = piece[done:done + n]
                at, done = at + n, done + n
                if at == len(stage):
                    _write_all(fd, stage, first=first)
                    at, first = 0, False
        if at:
            padded = -(-at // _BLOCK) * _BLOCK
            _write_all(fd, stage[:padded], first=first)
        os.ftruncate(fd, total)
        if fsync:
            os.fsync(fd)
    except _Refused:
        os.close(fd)
        os.unlink(path)
        return None
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return digest


class _Refused(Exception):
    """The file system accepted ``O_DIRECT`` at open but refused the first aligned write."""


def _write_all(fd: int, data: np.ndarray, *, first: bool) -> None:
    """Write all of ``data`` (a multiple of ``_BLOCK`` bytes) to ``fd``; an EINVAL on the
    file's first write is a refusal of ``O_DIRECT`` (``_Refused``)."""
    done = 0
    while done < len(data):
        try:
            n = os.write(fd, data[done:])
        except OSError as e:
            if first and done == 0 and e.errno == errno.EINVAL:
                raise _Refused() from e
            raise
        if n <= 0:
            raise OSError(errno.EIO, f"a direct write of {len(data) - done} bytes wrote none")
        done += n


_MAX_RANK = 32
_META = "__metadata__"
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


@dataclass(frozen=True)
class Entry:
    """One tensor of a shard header, validated: dtype, shape and byte range in the data."""

    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"key '{k}' appears twice")
            seen.add(k)
    return d


def _bad(path: Path, what: str) -> TraceError:
    return TraceError(f"tensor shard '{path}' is malformed: {what}; re-run the capture")


def parse_header(raw: bytes, data_size: int, path: Path) -> dict[str, Entry]:
    """Validate a safetensors JSON header the way the safetensors library does.

    The header is a JSON object, nested at most three deep; ``__metadata__`` (optional)
    maps strings to strings; every other key is a tensor with exactly ``dtype`` (a
    safetensors dtype name this reader knows), ``shape`` (at most 32 non-negative ints)
    and ``data_offsets`` (two ints, ``0 <= begin <= end``). Each tensor's byte range is
    exactly its element count times its item size, and the ranges, in order, tile the
    data after the header with no gap, overlap or tail. Anything else is a ``TraceError``.
    """
    try:
        header = loads_bounded(raw, max_depth=3, object_pairs_hook=_no_duplicates)
    except TraceError as e:
        raise _bad(path, f"its header {e}") from None
    except ValueError as e:
        raise _bad(path, f"its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(path, f"its header is a JSON {type(header).__name__}, not an object")
    meta = header.pop(_META, None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise _bad(path, "its __metadata__ is not an object of strings")
    entries: dict[str, Entry] = {}
    for name, info in header.items():
        what = f"tensor '{name}'"
        if not isinstance(info, dict):
            raise _bad(path, f"{what} is a JSON {type(info).__name__}, not an object")
        if set(info) != _ENTRY_KEYS:
            missing = sorted(_ENTRY_KEYS - set(info))
            extra = sorted(set(info) - _ENTRY_KEYS)
            raise _bad(path, f"{what} " + (f"lacks {', '.join(missing)}" if missing else f"has unknown field {extra[0]}"))
        st = info["dtype"]
        dtype = _FROM_ST.get(st) if isinstance(st, str) else None
        if dtype is None:
            raise _bad(path, f"{what} has unknown dtype {st!r}")
        shape = info["shape"]
        if not isinstance(shape, list) or len(shape) > _MAX_RANK or not all(is_int(d) and d >= 0 for d in shape):
            raise _bad(path, f"{what} has shape {_short(shape)}, not a list of at most {_MAX_RANK} non-negative ints")
        offsets = info["data_offsets"]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)):
            raise _bad(path, f"{what} has data_offsets {_short(offsets)}, not two ints")
        begin, end = offsets
        if not 0 <= begin <= end:
            raise _bad(path, f"{what} has data_offsets {offsets}, not 0 <= begin <= end")
        if end > data_size:
            raise TraceError(
                f"tensor '{name}' in shard '{path}' points past the end of the file (truncated?); re-run the capture"
            )
        count = 1
        for d in shape:
            count *= d  # Python ints: a 2**62-element shape cannot wrap around
        if count * dtype.itemsize != end - begin:
            raise _bad(path, f"{what} has {end - begin} bytes of data but shape {shape} of {st} needs {count * dtype.itemsize}")
        entries[name] = Entry(dtype=dtype, shape=tuple(shape), begin=begin, end=end)
    at = 0
    for name, e in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin != at:
            how = "overlaps the tensor before it" if e.begin < at else f"leaves a gap of {e.begin - at} bytes before it"
            raise _bad(path, f"tensor '{name}' {how} (data_offsets {[e.begin, e.end]})")
        at = e.end
    if at != data_size:
        raise _bad(path, f"{data_size - at} bytes after the last tensor belong to none")
    return entries


def _short(x: object) -> str:
    s = json.dumps(x) if not isinstance(x, float) else repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


def _header(f, path: Path) -> tuple[dict[str, Entry], int]:
    size = os.fstat(f.fileno()).st_size
    raw = f.read(8)
    if len(raw) < 8:
        raise TraceError(f"tensor shard '{path}' is truncated (no header); re-run the capture")
    (n,) = struct.unpack("<Q", raw)
    if n > _MAX_HEADER or 8 + n > size:
        raise TraceError(f"tensor shard '{path}' has a corrupt header; re-run the capture")
    head = f.read(n)
    if len(head) != n:
        raise TraceError(f"tensor shard '{path}' is truncated (header cut short); re-run the capture")
    return parse_header(head, size - 8 - n, path), 8 + n


def keys(path: str | os.PathLike) -> list[str]:
    path = Path(path)
    with open(path, "rb") as f:
        return list(_header(f, path)[0])


def check(path: str | os.PathLike) -> dict[str, Entry]:
    """Validate a shard's header and layout without reading any tensor data."""
    path = Path(path)
    with open(path, "rb") as f:
        return _header(f, path)[0]


def _read(f, path: Path, name: str, e: Entry, base: int) -> np.ndarray:
    f.seek(base + e.begin)
    buf = f.read(e.end - e.begin)
    if len(buf) != e.end - e.begin:
        raise TraceError(f"tensor '{name}' in shard '{path}' is cut short (file changed while read?); re-run the capture")
    return np.frombuffer(buf, dtype=e.dtype.newbyteorder("<")).astype(e.dtype, copy=False).reshape(e.shape)


def load_one(path: str | os.PathLike, name: str) -> np.ndarray:
    """Read one tensor from a shard without reading the others."""
    path = Path(path)
    with open(path, "rb") as f:
        header, base = _header(f, path)
        if name not in header:
            raise TraceError(f"tensor '{name}' is not in shard '{path}'")
        return _read(f, path, name, header[name], base)


def load_many(path: str | os.PathLike, names: list[str]) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(name, tensor)`` for each of ``names`` in order, parsing the header once and
    holding one tensor at a time (``verify`` fingerprints every stored tensor of a shard)."""
    path = Path(path)
    with open(path, "rb") as f:
        header, base = _header(f, path)
        for name in names:
            if name not in header:
                raise TraceError(f"tensor '{name}' is not in shard '{path}'")
            yield name, _read(f, path, name, header[name], base)


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    path = Path(path)
    with open(path, "rb") as f:
        header, base = _header(f, path)
        return {name: _read(f, path, name, info, base) for name, info in header.items()}
