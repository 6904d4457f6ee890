"""Reading and writing safetensors files with NumPy, for every dtype a trace may hold.

The safetensors layout is simple (8-byte little-endian header size, JSON header, raw
bytes), and writing it here lets bfloat16 and float8 round-trip through ml_dtypes (the
safetensors NumPy binding rejects float8) and lets the reader pull one tensor out of a
shard without reading the rest. Files written here load with the safetensors library.
Nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Mapping

import ml_dtypes
import numpy as np

from reprobisect.errors import TraceError

__all__ = ["save", "load", "load_one", "keys"]

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


def save(tensors: Mapping[str, np.ndarray], path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Write ``tensors`` to ``path`` atomically (temp file, fsync, rename).

    Returns the file's size and SHA-256, computed from the bytes as they are written.
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
    digest = hashlib.sha256()
    with open(tmp, "wb") as f:
        for chunk in (struct.pack("<Q", len(head)), head):
            f.write(chunk)
            digest.update(chunk)
        for a in arrays:
            view = memoryview(a.reshape(-1).view(np.uint8))
            f.write(view)
            digest.update(view)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return 8 + len(head) + offset, digest.hexdigest()


def _header(f, path: Path) -> tuple[dict, int]:
    size = os.fstat(f.fileno()).st_size
    raw = f.read(8)
    if len(raw) < 8:
        raise TraceError(f"tensor shard '{path}' is truncated (no header); re-run the capture")
    (n,) = struct.unpack("<Q", raw)
    if n > _MAX_HEADER or 8 + n > size:
        raise TraceError(f"tensor shard '{path}' has a corrupt header; re-run the capture")
    try:
        header = json.loads(f.read(n))
    except ValueError:
        raise TraceError(f"tensor shard '{path}' has a corrupt header; re-run the capture") from None
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= data_size:
            raise TraceError(f"tensor '{name}' in shard '{path}' points past the end of the file (truncated?)")
    return header, 8 + n


def keys(path: str | os.PathLike) -> list[str]:
    path = Path(path)
    with open(path, "rb") as f:
        return list(_header(f, path)[0])


def _read(f, path: Path, name: str, info: dict, base: int) -> np.ndarray:
    dtype = _FROM_ST.get(info["dtype"])
    if dtype is None:
        raise TraceError(f"tensor '{name}' in shard '{path}' has unknown dtype {info['dtype']}")
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * dtype.itemsize != end - begin:
        raise TraceError(f"tensor '{name}' in shard '{path}' has a size that does not match its shape")
    f.seek(base + begin)
    buf = f.read(end - begin)
    return np.frombuffer(buf, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)


def load_one(path: str | os.PathLike, name: str) -> np.ndarray:
    """Read one tensor from a shard without reading the others."""
    path = Path(path)
    with open(path, "rb") as f:
        header, base = _header(f, path)
        if name not in header:
            raise TraceError(f"tensor '{name}' is not in shard '{path}'")
        return _read(f, path, name, header[name], base)


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    path = Path(path)
    with open(path, "rb") as f:
        header, base = _header(f, path)
        return {name: _read(f, path, name, info, base) for name, info in header.items()}
