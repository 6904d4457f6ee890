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
