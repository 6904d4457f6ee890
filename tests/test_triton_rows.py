"""Runs ``tests/triton_interpreted.py`` (the Triton fingerprint kernel's tests) in a process
of its own, with Triton's interpreter on from the start: Triton reads ``TRITON_INTERPRET``
when it is imported, and in this process another test may have imported it already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_the_kernel_under_the_triton_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "REPROBISECT_FP_TRITON": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-x",
         str(HERE / "triton_interpreted.py")],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [80, 90])
def test_the_kernel_compiles_for_the_gpus_it_is_for(arch: int) -> None:
    """Every variant the batched path launches compiles to a cubin for an A100 (sm_80) and an
    H100/H200 (sm_90), here, without a GPU (Triton ships ptxas): what the interpreter cannot
    show (types, a float64 reduction, bf16 widening), and no FMA contraction in the code."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from reprobisect.runners import triton_kernel, triton_rows

    base = {"lanes_ptr": "*i32", "w_ptr": "*i64", "valid_ptr": "*i32", "sums_ptr": "*i64", "stats_ptr": "*fp64",
            "stats_stride": "i32", "n_lanes": "i64", "n_elems": "i64"}
    values = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8} if arch == 90 else {"fp32": 4, "bf16": 2}
    variants = [(v, w, True, valid) for v in values for w in (16, 256, 4096) for valid in (False, True)]
    variants += [("fp32", w, False, False) for w in (16, 256, 4096)]
    for vt, width, with_stats, valid in variants:
        consts = triton_rows.constexprs(width, values[vt], with_stats, valid)
        sig = {**base, "vals_ptr": f"*{vt}", **{k: "constexpr" for k in consts}}
        k = triton.compile(ASTSource(fn=triton_kernel.rows, signature=sig, constexprs=consts),
                           target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": False})
        assert k.asm["cubin"], (vt, width, with_stats, valid)
        assert "fma.rn.f64" not in k.asm["ptx"], (vt, width)
