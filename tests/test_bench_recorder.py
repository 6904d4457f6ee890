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


def _bench(script: str = "bench_recorder"):
    spec = importlib.util.spec_from_file_location(f"{script}_under_test", ROOT / "scripts" / "bench" / f"{script}.py")
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


def test_paired_ratios_cancel_a_machine_whose_speed_drifts_between_rounds():
    bench = _bench()
    # the recorder adds 10% in every round; the machine runs twice as slowly in the later rounds
    plain = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    record = [[1.1] * 3, [1.1] * 3, [2.2] * 3, [2.2] * 3]
    med, lo, hi = bench._paired(record, plain, lambda a, p: a / p)
    assert (med, lo, hi) == pytest.approx((1.1, 1.1, 1.1))
    assert bench._verdict((med, lo, hi), 1.15) is True
    assert bench._verdict((med, lo, hi), 1.05) is False


def test_a_verdict_is_inconclusive_when_the_rounds_straddle_the_limit():
    bench = _bench()
    plain = [[1.0]] * 4
    record = [[1.00], [1.08], [1.14], [1.30]]
    med, lo, hi = bench._paired(record, plain, lambda a, p: a / p)
    assert lo < 1.10 < hi
    assert bench._verdict((med, lo, hi), 1.10) is None
    assert bench._verdict((med, lo, hi), 1.5) is True
    assert bench._verdict((med, lo, hi), 0.9) is False


@pytest.mark.slow
def test_sentinel_bench_puts_each_sentinel_mode_against_the_bytes_a_sentinel_step_reads(tmp_path):
    import torch

    bench = _bench("bench_sentinel")
    frozen = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    frozen[0].weight.requires_grad_(False)  # no gradient, not updated: nothing a sentinel reads twice
    assert bench._sentinel_bytes(frozen) == 2 * 4 * (4 + 8 + 2)  # float32: biases 4 and 2, the second weight 4 x 2
    res = bench.bench(2, 2, ["plain", "sentinel_nostate", "full"], 16, tmp_path)
    assert res["floor_ms_per_step"] > 0
    assert set(res["floor"]) == {"sentinel_nostate"}  # full reads far more than a sentinel: no such floor
    assert res["floor"]["sentinel_nostate"] > 0
