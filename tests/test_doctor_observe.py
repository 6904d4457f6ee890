"""``bisect doctor``'s checks ``input``, ``memory`` and ``overfit`` (issue 15), and what runs
on a TensorFlow run: each planted-bug script in ``examples/doctor/`` gets its finding as the
top warning (the healthy script's side is in ``tests/test_doctor.py``, on its shared run).

Real runs through the probe path, one per script (module-scoped), few steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.core.options import ProbeOptions
from reprobisect.workflows.doctor import Diagnosis, run_doctor

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "doctor"


def _diagnose(name: str, checks: tuple[str, ...], steps: int = 6, **kw) -> Diagnosis:
    return run_doctor([sys.executable, str(EXAMPLES / f"{name}.py")], ProbeOptions(steps=steps, quiet=True),
                      checks=checks, **kw)


@pytest.fixture(scope="module")
def runs() -> dict[str, Diagnosis]:
    return {"slow_loader": _diagnose("slow_loader", ("input", "memory")),
            "losses_list": _diagnose("losses_list", ("memory",)),
            "large_batch": _diagnose("large_batch", ("memory", "input"), steps=8),
            "relu_head": _diagnose("relu_head", ("overfit",))}


def _top(d: Diagnosis):
    assert d.findings, d
    return d.findings[0]


@pytest.mark.slow
def test_a_slow_dataset_is_input_bound_with_fetch_and_compute_figures(runs):
    d = runs["slow_loader"]
    f = _top(d)
    assert (f.check, f.severity) == ("input", "warning"), d
    assert f.cause.startswith("input-bound"), f
    ev = f.evidence
    assert ev["fetch_ms_per_step"] >= 100 and ev["fetch_ms_per_step"] >= ev["compute_ms_per_step"], ev  # 8 x 20 ms sleeps
    assert ev["steps_timed"] == [1, 2, 3, 4, 5] and ev["device"] == "cpu"
    assert "num_workers" in f.next and "pin_memory" in f.next and "prefetch" in f.next
    assert [g.severity for g in d.findings if g.check == "memory"] == ["info"], d  # one bug, one finding


@pytest.mark.slow
def test_losses_kept_in_a_list_are_steady_growth_from_retained_graphs(runs):
    f = _top(runs["losses_list"])
    assert (f.check, f.severity) == ("memory", "warning"), runs["losses_list"]
    assert "steady growth from retained graphs" in f.cause and "losses.append(loss)" in f.cause
    assert f.evidence["table"]["retained_losses"] == [0, 1, 2, 3, 4, 5]
    assert "loss.item()" in f.next


@pytest.mark.slow
def test_one_large_batch_is_a_spike_not_growth(runs):
    d = runs["large_batch"]
    f = _top(d)
    assert (f.check, f.severity) == ("memory", "warning"), d
    assert "spikes on large inputs, not steady growth" in f.cause
    assert f.evidence["step"] == 3 and f.evidence["spike_steps"] == [3]
    assert f.evidence["batch_shapes"][0] == [8, 128] and f.evidence["batch_elements"] == 8 * f.evidence["median_batch_elements"]
    assert max(f.evidence["table"]["retained_losses"]) == 0


@pytest.mark.slow
def test_a_relu_on_the_regression_output_cannot_fit_one_batch(runs):
    d = runs["relu_head"]
    f = _top(d)
    assert (f.check, f.severity) == ("overfit", "warning"), d
    assert f.cause.startswith("cannot fit one batch"), f
    table = f.evidence["table"]
    assert table["step"][0] == 0 and table["step"][-1] == 59 and "accuracy" not in table  # regression: no accuracy
    assert f.evidence["steps_run"] == 60 and f.evidence["wall_s"] > 0
    assert table["loss"][-1] > 0.2 * table["loss"][0]
    assert len(f.evidence["batch_ids"]) == 32
    assert "output layer" in f.next


def test_overfit_steps_below_two_is_a_usage_error(capsys):
    assert main(["doctor", "--check", "overfit", "--overfit-steps", "1", "--", "python", "x.py"]) == 2
    assert "--overfit-steps" in capsys.readouterr().err


@pytest.mark.slow
def test_tensorflow_run_says_which_checks_do_not_apply_never_a_pass():
    tf_tape = ROOT / "examples" / "corpus" / "tf_tape.py"
    d = run_doctor([sys.executable, str(tf_tape), "--steps", "6", "--sever", "1"], ProbeOptions(steps=3, quiet=True),
                   checks=("update", "input", "overfit"))
    assert d.framework == "tensorflow", d
    assert set(d.not_applicable) == {"input", "overfit"}
    f = _top(d)
    assert (f.check, f.severity) == ("update", "warning"), d  # the severed tf.Variable never gets a gradient
    skipped = [g for g in d.findings if g.check in ("input", "overfit")]
    assert [g.severity for g in skipped] == ["info", "info"] and all(g.cause.startswith("not run") for g in skipped)
    assert d.to_json()["not_applicable"].keys() == {"input", "overfit"}
