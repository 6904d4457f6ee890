"""The native fingerprint + statistics kernel (``fpstats.cpp``), built on first use and cached.

Why native: the recorder fingerprints and summarises every tensor of every step. Done with
framework ops that is several passes over each tensor (widen, multiply-add, sum, norm,
min/max), ~2.5 ns per element on a small CPU, which made recording 1.5-2.3x a plain step.
The kernel reads each tensor once at near memory speed, computing the exact same row sums
as ``reprobisect.trace.fingerprint`` (integer arithmetic: bit-identical) and float64
statistics defined by its source alone (no fast-math, no FMA contraction, fixed chunking:
the same bits give the same statistics on any machine). Strided views are read block by
block, without a contiguous copy. Single-threaded: a second thread measured no faster
inside a training step (the framework's threads hold the cores and the memory path).

Built with the machine's C++ compiler (``$CXX``, else ``g++``/``c++``/``clang++``) for the
machine's own CPU (``-march=native``), into ``$REPROBISECT_CACHE_DIR/native`` (default
``~/.cache/reprobisect/native``) under a name keyed by the source, the compiler and the
CPU's identity, so a home directory shared by different machines holds one build per kind
of CPU and never runs one on a CPU it was not built for. No compiler, a failed build, or
``REPROBISECT_NATIVE=0``: ``kernel()`` returns ``None`` and callers use the framework path,
which gives the same fingerprints (``status()`` says which and why).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DTYPE_CODES", "SUMSQ_DTYPES", "Kernel", "build", "cache_dir", "kernel", "load", "status"]

SOURCE = Path(__file__).with_name("fpstats.cpp")
ABI_VERSION = 4
ROW = 4096
BUILD_TIMEOUT_S = 120
CHUNK_BYTES = 16 * ROW * 4  # fpstats.cpp's unit the statistics are combined by
_FLAGS_SETS = (
    ["-O3", "-march=native", "-mprefer-vector-width=512"],
    ["-O3", "-march=native"],
    ["-O2"],
)
_COMMON = ["-std=c++17", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC"]

# canonical dtype name -> the kernel's code for its statistics
DTYPE_CODES = {
    "float32": 1, "float64": 2, "bfloat16": 3, "float16": 4, "int64": 5, "int32": 6,
    "int16": 7, "int8": 8, "uint8": 9, "bool": 10, "uint16": 11, "uint32": 12, "uint64": 13,
}

SUMSQ_DTYPES = {name: DTYPE_CODES[name] for name in ("float32", "float64", "bfloat16", "float16")}


@dataclass
class Kernel:
    """The loaded kernel: one call per tensor."""

    lib: ctypes.CDLL
    path: Path

    def __post_init__(self) -> None:
        f = self.lib.rb_fingerprint_stats
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_void_p]
        self._f = f
        g = self.lib.rb_fingerprint_stats_strided
        g.restype = ctypes.c_int
        g.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._g = g
        m = self.lib.rb_fingerprint_stats_many
        m.restype = ctypes.c_int
        m.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_void_p]
        self._m = m
        q = self.lib.rb_sumsq
        q.restype = ctypes.c_int
        q.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
        self._q = q
        from reprobisect.trace.fingerprint import column_weights

        self._w = column_weights()
        self._w_ptr = self._w.ctypes.data
        self._local = threading.local()

    def run(self, ptr: int, nbytes: int, dtype: str | None) -> tuple[np.ndarray, list[float] | None, tuple[int, int]]:
        """Row sums of the ``nbytes`` at address ``ptr`` and, for a ``dtype`` in DTYPE_CODES,
        ``[sum, sum of squares, min, max]`` and ``(nan, inf)`` counts.

        The memory must stay alive and unchanged during the call (the caller holds the array
        or tensor).
        """
        code = DTYPE_CODES.get(dtype, 0) if dtype else 0
        rows = -(-nbytes // (ROW * 4))
        local = self._local
        if getattr(local, "buf", None) is None or rows + 6 > local.buf.size:
            self._grow(rows)
        at = local.ptr  # (called for most records: no closure, unlike run_strided)
        rc = self._f(ptr, nbytes, code, self._w_ptr, at, at + 8 * rows, at + 8 * (rows + 4))
        return self._results(rc, rows, code)

    def run_many(self, items: list[tuple[int, int, str | None]]) -> tuple[np.ndarray, np.ndarray, list[list[float]], list[list[int]]]:
        """``run`` for many contiguous buffers ``(address, nbytes, dtype)`` in one call.

        Returns ``(row_sums, starts, stats, counts)``: buffer ``i``'s row sums are
        ``row_sums[starts[i]:starts[i + 1]]``, its statistics ``stats[i]`` (meaningless for a
        dtype outside DTYPE_CODES) and its ``(nan, inf)`` counts ``counts[i]``.
        """
        n = len(items)
        flat: list[int] = []  # the table's rows, made as one list: a row assignment costs 0.3 us more
        bounds = [0]
        at = 0
        for ptr, nbytes, dtype in items:
            flat += (ptr, nbytes, DTYPE_CODES.get(dtype, 0) if dtype else 0, at)
            at += -(-nbytes // (ROW * 4))
            bounds.append(at)
        table = np.array(flat, dtype=np.int64)
        starts = np.array(bounds, dtype=np.int64)
        rows = np.empty(max(at, 1), dtype=np.int64)
        stats = np.empty((n, 4), dtype=np.float64)
        counts = np.empty((n, 2), dtype=np.int64)
        rc = self._m(n, table.ctypes.data, self._w_ptr, rows.ctypes.data, stats.ctypes.data, counts.ctypes.data)
        if rc != 0:
            raise ValueError(f"native fingerprint kernel refused the call (code {rc})")
        return rows, starts, stats.tolist(), counts.tolist()

    def sumsq(self, ptr: int, nbytes: int, dtype: str) -> float:
        """The sum of squares of the ``nbytes`` at ``ptr``, a contiguous buffer of ``dtype``
        (float32, float64, bfloat16 or float16): the same float64 bits as the sum of squares
        ``run`` gives, from a pass that computes nothing else."""
        out = ctypes.c_double()
        rc = self._q(ptr, nbytes, SUMSQ_DTYPES.get(dtype, 0), ctypes.byref(out))
        if rc != 0:
            raise ValueError(f"native sum of squares refused {dtype} ({nbytes} bytes)")
        return out.value

    def run_strided(self, ptr: int, element_size: int, shape: tuple[int, ...], strides: tuple[int, ...],
                    dtype: str | None) -> tuple[np.ndarray, list[float] | None, tuple[int, int]]:
        """``run`` for a strided layout (strides in elements, >= 0; ``ptr`` at the first
        element): the same results as for a contiguous copy, without making one."""
        code = DTYPE_CODES.get(dtype, 0) if dtype else 0
        nd = len(shape)
        dims = np.array([*shape, *strides], dtype=np.int64)
        nbytes = element_size * int(np.prod(shape, dtype=np.int64))
        at_dims = dims.ctypes.data
        return self._call(lambda at, rows: self._g(ptr, element_size, nd, at_dims, at_dims + 8 * nd, code, self._w_ptr,
                                                   at, at + 8 * rows, at + 8 * (rows + 4)), nbytes, code)

    def _call(self, fn: Any, nbytes: int, code: int) -> tuple[np.ndarray, list[float] | None, tuple[int, int]]:
        rows = -(-nbytes // (ROW * 4))
        local = self._local
        if getattr(local, "buf", None) is None or rows + 6 > local.buf.size:
            self._grow(rows)
        return self._results(fn(local.ptr, rows), rows, code)

    def _grow(self, rows: int) -> None:
        """This thread's reused output buffer (numpy's address lookup is costly), for ``rows`` row
        sums, then 4 float64 statistics, then 2 counts."""
        local = self._local
        buf = local.buf = np.empty(max(rows + 6, 4096), dtype=np.int64)
        local.ptr, local.floats = buf.ctypes.data, buf.view(np.float64)

    def _results(self, rc: int, rows: int, code: int) -> tuple[np.ndarray, list[float] | None, tuple[int, int]]:
        if rc != 0:
            raise ValueError(f"native fingerprint kernel refused the call (code {rc}, dtype code {code})")
        local = self._local
        buf = local.buf
        sums = buf[:rows].copy()
        if not code:
            return sums, None, (0, 0)
        nan, inf = buf[rows + 4 : rows + 6].tolist()
        return sums, local.floats[rows : rows + 4].tolist(), (nan, inf)


def load(path: Path) -> Kernel:
    """Load a built kernel; ``OSError``/``RuntimeError`` when it is not one this code can call."""
    lib = ctypes.CDLL(str(path))
    if lib.rb_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path} has ABI {lib.rb_abi_version()}, want {ABI_VERSION}")
    return Kernel(lib, path)


_lock = threading.Lock()
_kernel: Kernel | None = None
_tried = False
_status = "not loaded yet"


def cache_dir() -> Path:
    from reprobisect.support.cachedir import user_cache_dir

    return user_cache_dir() / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_identity() -> str:
    """What the build's ``-march=native`` depends on: the CPU model and its feature flags."""
    parts = [platform.machine(), platform.system()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    parts.append(line.strip())
                if line.strip() == "":  # the first CPU is enough
                    break
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _target(cxx: str, flag_sets: tuple[list[str], ...] = _FLAGS_SETS) -> Path:
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cxx.encode(), _compiler_version(cxx).encode(),
                 _cpu_identity().encode(), repr((flag_sets, _COMMON)).encode()):
        h.update(part)
        h.update(b"\0")
    return cache_dir() / f"fpstats-{h.hexdigest()[:20]}.so"


def build(verbose: bool = False, flag_sets: tuple[list[str], ...] = _FLAGS_SETS) -> Path:
    """Compile the kernel for this machine into the cache (no-op when already there).

    ``flag_sets`` are tried in order (tests build a portable variant with ``(["-O2"],)``).
    Raises ``RuntimeError`` with the compiler's complaint when no flag set builds.
    """
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    target = _target(cxx, flag_sets)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for flags in flag_sets:
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
        os.close(fd)
        cmd = [cxx, *flags, *_COMMON, "-o", tmp, str(SOURCE)]
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:  # a compiler that hangs is not retried
            Path(tmp).unlink(missing_ok=True)
            raise RuntimeError(f"compiling {SOURCE.name} failed: {e}") from None
        if r is not None and r.returncode == 0:
            os.replace(tmp, target)  # atomic: a concurrent build of the same file is harmless
            return target
        if r is not None:
            errors.append(f"{' '.join(flags)}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        Path(tmp).unlink(missing_ok=True)
    raise RuntimeError("could not build the native kernel: " + "; ".join(errors))


def kernel() -> Kernel | None:
    """The loaded kernel, building it the first time; ``None`` when it cannot be had."""
    global _kernel, _tried, _status
    if _tried:
        return _kernel
    with _lock:
        if _tried:
            return _kernel
        if os.environ.get("REPROBISECT_NATIVE", "").strip() == "0":
            _status = "off (REPROBISECT_NATIVE=0)"
        else:
            try:
                _kernel = load(build())
                _status = f"native ({_kernel.path})"
            except (OSError, RuntimeError) as e:
                _status = f"framework ops (native kernel unavailable: {e})"
        _tried = True
        return _kernel


def status() -> str:
    """Which fingerprint path this process uses, and why (for the environment record)."""
    return _status


def _reset_for_tests() -> None:
    global _kernel, _tried, _status
    with _lock:
        _kernel, _tried, _status = None, False, "not loaded yet"
