#!/usr/bin/env python
"""Fingerprint and compare throughput, as ratios against a NumPy memcpy measured in the same run.

    .venv/bin/python scripts/bench/bench_fingerprint.py [--gib 1] [--reps 3] [--compile] [--trace-mib 256]

Fingerprint part: ~``--gib`` GiB of tensors of several sizes (half float32, half
bfloat16). Each method walks all of them once per repetition, repetitions interleaved
(memcpy, torch, NumPy, ...) so that a busy machine slows every method alike; the best
repetition counts. Methods: NumPy ``copyto`` into an existing array (the memcpy
reference), the torch fingerprint (``reprobisect.runners.fingerprint_torch``) on its
default CPU path, the native kernel (``native``, ``native+stats``), the same on the
torch-op fallback (``torch``, ``torch+stats``), the NumPy fingerprint, and with
``--compile`` the opt-in ``torch.compile`` op path (its one-off compile time printed
separately).

Compare part: two traces of the same tensors written through the writer (``--trace-mib``
of stored tensors each, over a few steps): comparing an identical pair must read no full
tensor (bytes read are printed); a pair differing in one tensor of the last step reads
just that step's pair.

Timings on a shared 2-core machine move 2x between runs: read the ratios, not the GB/s.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np


SIZES = [64 << 20, 16 << 20, 1 << 20, 64 << 10]


def _tensor_set(total_bytes: int, sizes=SIZES) -> dict[int, list[np.ndarray]]:
    """An equal share of ``total_bytes`` per tensor size (64 MiB .. 64 KiB); float32 and bfloat16 alternating."""
    rng = np.random.default_rng(0)
    share = total_bytes // len(sizes)
    out: dict[int, list[np.ndarray]] = {}
    for size in sizes:
        group = []
        for i in range(max(2, share // size)):
            dtype = np.float32 if i % 2 == 0 else ml_dtypes.bfloat16
            n = size // np.dtype(dtype).itemsize
            group.append(rng.standard_normal(n, dtype=np.float32).astype(dtype))
        out[size] = group
    return out


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def bench_fingerprints(gib: float, reps: int, use_compile: bool) -> dict[str, float]:
    import torch

    from reprobisect.runners import fingerprint_torch as ft
    from reprobisect.trace.fingerprint import fingerprint

    groups = _tensor_set(int(gib * 2**30))

    def as_torch(a: np.ndarray):
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    tgroups = {k: [as_torch(a) for a in v] for k, v in groups.items()}
    dst = {k: [np.empty_like(a) for a in v] for k, v in groups.items()}
    nbytes = {k: sum(a.nbytes for a in v) for k, v in groups.items()}
    total = sum(nbytes.values())
    print(f"fingerprint: {sum(map(len, groups.values()))} tensors, {total / 2**30:.2f} GiB (float32 + bfloat16), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {reps} interleaved repetitions")

    from reprobisect import native

    kernel = native.kernel

    def ops(fn):  # the torch-op path: what a machine without a C++ compiler gets
        def run():
            native.kernel = lambda: None
            try:
                return fn()
            finally:
                native.kernel = kernel
        return run

    # values first: every path must agree with NumPy on every tensor
    for k in groups:
        for a, t in zip(groups[k], tgroups[k]):
            if not ft.fingerprint(t) == ops(lambda: ft.fingerprint(t))() == fingerprint(a):
                sys.exit(f"MISMATCH: fingerprints differ for a {a.dtype} tensor of {a.nbytes} bytes")

    def methods_for(k):
        return {
            "memcpy": lambda: [np.copyto(d, a) for d, a in zip(dst[k], groups[k])],
            "native": lambda: [ft.fingerprint(t) for t in tgroups[k]],
            "native+stats": lambda: [ft.fingerprint_and_stats(t) for t in tgroups[k]],
            "torch": ops(lambda: [ft.fingerprint(t) for t in tgroups[k]]),
            "torch+stats": ops(lambda: [ft.fingerprint_and_stats(t) for t in tgroups[k]]),
            "numpy": lambda: [fingerprint(a) for a in groups[k]],
        }

    names = ["memcpy", "native", "native+stats", "torch", "torch+stats", "numpy"]
    if kernel() is None:
        print(f"native kernel: not available ({native.status()}); its columns use torch ops")
    compiled = False
    if use_compile:
        ft.enable_compile(min_bytes=1 << 20)
        big = tgroups[SIZES[0]]
        compile_s = _time(ops(lambda: ft.fingerprint(big[0]))) + _time(ops(lambda: ft.fingerprint(big[1])))
        if ft._compile_failed:
            print("torch.compile path: not usable here (compile failed); skipped")
        else:
            print(f"torch.compile path (tensors >= 1 MiB): first calls, compiling, took {compile_s:.1f} s")
            for k in groups:
                for a, t in zip(groups[k], tgroups[k]):
                    if ops(lambda: ft.fingerprint(t))() != fingerprint(a):
                        sys.exit("MISMATCH: compiled torch fingerprint differs from NumPy")
            compiled = True
            names.append("torch compiled")
        ft.enable_compile(None)

    best = {(k, m): float("inf") for k in groups for m in names}
    for _ in range(reps):
        for k in groups:
            ms = methods_for(k)
            for m in names:
                if m == "torch compiled":
                    ft.enable_compile(min_bytes=1 << 20)
                    best[k, m] = min(best[k, m], _time(ms["torch"]))
                    ft.enable_compile(None)
                else:
                    best[k, m] = min(best[k, m], _time(ms[m]))
    header = "".join(f"{m:>16s}" for m in names)
    print(f"  {'tensor size':12s}{header}   (GB/s, and × memcpy)")
    ratios: dict[str, float] = {}
    for k in list(groups) + ["all"]:
        def t_of(m):
            return sum(best[g, m] for g in groups) if k == "all" else best[k, m]

        nb = total if k == "all" else nbytes[k]
        ref = t_of("memcpy")
        cells = "".join(f"{nb / t_of(m) / 1e9:7.2f} ({ref / t_of(m):4.2f}×)" for m in names)
        print(f"  {('all' if k == 'all' else _size(k)):12s}{cells}")
        if k == "all":
            ratios = {m: ref / t_of(m) for m in names}
    return ratios


def bench_compare(trace_mib: int, reps: int, workdir: Path) -> None:
    from reprobisect.core.compare import Tolerance, compare_paths
    from reprobisect.trace import TraceWriter, record_array

    steps = 4
    per_step = [a for g in _tensor_set(max(1, trace_mib // steps) << 20, sizes=[16 << 20, 1 << 20, 64 << 10]).values() for a in g]
    nbytes = sum(a.nbytes for a in per_step) * steps

    def write(path: Path, change: bool) -> float:
        def go():
            with TraceWriter(path, environment={"device": "cpu"}) as w:
                for k in range(steps):
                    w.begin_step(k)
                    for i, a in enumerate(per_step):
                        if change and k == steps - 1 and i == 0:
                            a = a.copy()
                            a[-1] = -a[-1] if a[-1] != 0 else a.dtype.type(1)
                        w.record(record_array(f"t{i}", "param", a), a)
                    w.end_step()

        return _time(go)

    wa = write(workdir / "a", False)
    write(workdir / "b", False)
    write(workdir / "c", True)
    print(f"compare: two traces of {steps} steps × {len(per_step)} tensors, {nbytes / 2**30:.2f} GiB stored each "
          f"(writing one took {wa:.1f} s), best of {reps}")
    for label, other, tol in (("identical pair (bitwise)", "b", None), ("identical pair (default tol)", "b", Tolerance(mode="default")),
                              ("one tensor differs (bitwise)", "c", None), ("one tensor differs (default tol)", "c", Tolerance(mode="default"))):
        best, result = float("inf"), None
        for _ in range(reps):
            t = time.perf_counter()
            result = compare_paths(workdir / "a", workdir / other, tolerance=tol)
            best = min(best, time.perf_counter() - t)
        assert result is not None
        verdict = "agree" if result else f"diverged at step {result.first.step} {result.first.kind} {result.first.name}"
        print(f"  {label:34s} {best * 1e3:8.1f} ms  tensors read {result.tensors_read}, bytes read {result.bytes_read:>10d}"
              f"  ({nbytes / best / 1e9:6.1f} GB/s of trace covered) → {verdict}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0, help="GiB of tensors to fingerprint (default 1)")
    p.add_argument("--reps", type=int, default=3, help="repetitions; the best counts (default 3)")
    p.add_argument("--compile", action="store_true", help="also measure the opt-in torch.compile path (pays a compile)")
    p.add_argument("--trace-mib", type=int, default=256, help="MiB of stored tensors per trace for the compare part")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--dir", type=Path, default=None, help="where to write the traces (default: a temp folder)")
    args = p.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    bench_fingerprints(args.gib, args.reps, args.compile)
    work = Path(tempfile.mkdtemp(prefix="rb-bench-", dir=args.dir))
    try:
        bench_compare(args.trace_mib, args.reps, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
