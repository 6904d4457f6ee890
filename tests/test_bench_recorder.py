"""scripts/bench/bench_recorder.py's ``--cost`` mode measures the tensors a recorded step
fingerprints.

The recorder lets go of each tensor once it is begun (``runners.torch``: entries hold no
tensor), so the mode clones each one as it is begun. When it read them from the step's
entries instead, it found none and printed 0 ms for every path, without an error.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_recorder_under_test", ROOT / "scripts" / "bench" / "bench_recorder.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return mod


@pytest.mark.slow
def test_cost_times_every_tensor_one_recorded_step_fingerprints(tmp_path):
    bench = _bench()
    res = bench.cost("mlp", rounds=1, quick=True, tmp=tmp_path)
    # the quick MLP's step: batch, input, a few activations, output, loss, and per parameter
    # its gradient, its value after the step and Adam's three state tensors
    assert res["tensors"] >= 30
    assert res["elements"] > 100_000
    assert res["median_s"]["native"] > 0 and res["median_s"]["fp_only"] > 0
    assert set(res["ratio"]) == {"native", "ops", "fp_only"}
