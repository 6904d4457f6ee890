"""``bisect doctor`` knows the loss bugs (issue 36 item 7): cross-entropy on probabilities in any
spelling (``exp()`` of log-probabilities, a sigmoid) and the overfit plateau at its floor, a loss
identically 0, and TensorFlow trainable variables filtered out before ``apply_gradients``.

Real runs of the planted-bug scripts in ``examples/doctor/`` (one recorded run each, module
fixtures); the healthy script gets none of these findings.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.core.options import ProbeOptions
from reprobisect.trace.reader import read_trace
from reprobisect.workflows.doctor import Diagnosis, run_doctor

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "doctor"
WRONG_FIT = "fits one batch"
WRONG_NO_CHANGE = "no parameter changed"
WRONG_EVERY = "every parameter has a gradient and changes"


def _diagnose(name: str, checks: tuple[str, ...], steps: int = 6, overfit_steps: int = 30) -> Diagnosis:
    return run_doctor([sys.executable, str(EXAMPLES / f"{name}.py")], ProbeOptions(steps=steps, quiet=True),
                      checks=checks, overfit_steps=overfit_steps)


def _of(d: Diagnosis, check: str) -> list:
    return [f for f in d.findings if f.check == check]


def _causes(d: Diagnosis) -> str:
    return "\n".join(f.cause for f in d.findings)


@pytest.fixture(scope="module")
def exp_logprobs() -> Diagnosis:
    return _diagnose("ce_on_exp_logprobs", ("update", "overfit", "contract"), overfit_steps=60)


@pytest.fixture(scope="module")
def zero_loss() -> Diagnosis:
    return _diagnose("zero_loss_one_class", ("update", "overfit", "contract"))


@pytest.mark.slow
def test_exp_of_log_softmax_into_cross_entropy_is_named_with_the_measured_input(exp_logprobs):
    (f,) = _of(exp_logprobs, "contract")
    assert f.severity == "error", exp_logprobs
    assert f.cause.startswith("the loss cross_entropy expects logits but gets exp() of log_softmax"), f.cause
    assert "cannot go below 0.5514 (its floor for 3 classes)" in f.cause
    ev = f.evidence
    assert ev["made_by"] == "ExpBackward0 of LogSoftmaxBackward0" and ev["classes"] == 3
    assert ev["min"] >= 0 and ev["max"] <= 1 and ev["row_sum_dev"] < 1e-4  # rows of probabilities
    assert "no probabilities fed" not in _causes(exp_logprobs)


@pytest.mark.slow
def test_overfit_at_the_floor_of_ce_on_probabilities_is_not_a_fit(exp_logprobs):
    (f,) = _of(exp_logprobs, "overfit")
    floor = math.log(1 + 2 / math.e)  # -log(e / (e + C - 1)), C = 3
    assert f.severity == "warning", f
    assert f"the floor of cross-entropy on probabilities: with inputs in [0, 1] it cannot go below {floor:.4g}" \
        in f.cause, f.cause
    assert "plateaus at 0.55" in f.cause
    assert f.evidence["floor"] == pytest.approx(floor, abs=1e-6)
    assert WRONG_FIT not in _causes(exp_logprobs)


@pytest.mark.slow
def test_sigmoid_into_cross_entropy_is_named():
    d = _diagnose("ce_on_sigmoid", ("contract",))
    (f,) = _of(d, "contract")
    assert (f.severity, f.evidence["made_by"]) == ("error", "SigmoidBackward0"), d
    assert f.cause.startswith("the loss cross_entropy expects logits but gets a sigmoid's output"), f.cause
    assert f.evidence["row_sum_dev"] > 0.1  # not rows of a softmax: the op is the evidence
    assert "no probabilities fed" not in _causes(d)


@pytest.mark.slow
def test_loss_identically_zero_says_nothing_can_be_learned(zero_loss):
    (f,) = _of(zero_loss, "update")
    assert f.severity == "error", zero_loss
    assert f.cause.startswith("the loss is 0 at every step (and its gradients are all zero), over 6 steps: "
                              "nothing can be learned; here the model outputs 1 class"), f.cause
    assert f.evidence["loss"] == [0.0] * 6 and set(f.evidence["grad_norm"]) == {0.0}
    assert f.evidence["classes"] == 1
    assert WRONG_NO_CHANGE not in _causes(zero_loss)


@pytest.mark.slow
def test_overfit_on_a_zero_loss_is_not_a_fit(zero_loss):
    (f,) = _of(zero_loss, "overfit")
    assert f.severity == "warning" and f.cause.startswith("the loss is 0 at every step of the fixed-batch run"), f
    assert WRONG_FIT not in _causes(zero_loss)


@pytest.mark.slow
def test_healthy_script_gets_none_of_the_loss_findings():
    d = _diagnose("healthy", ("update", "overfit", "contract"))
    assert d.healthy, [f.cause for f in d.findings]
    text = _causes(d)
    for wrong in ("the loss is 0", "floor of cross-entropy", "expects logits but gets", "not passed to apply_gradients"):
        assert wrong not in text, text


@pytest.mark.slow
def test_tf_variables_filtered_before_apply_gradients_are_named_in_capture_and_doctor(tmp_path, capsys):
    pytest.importorskip("tensorflow")
    script = str(EXAMPLES / "tf_filtered_vars.py")
    assert main(["capture", "-o", str(tmp_path / "t"), "--steps", "3", "-q", "--", sys.executable, script]) == 0
    info = read_trace(tmp_path / "t").manifest.extra["tensorflow"]["unapplied_variables"]
    assert info == {"variables": ["mlp/hidden/bias", "mlp/logit/bias"], "first_step": 0}
    capsys.readouterr()
    code = main(["doctor", "--json", "--check", "update", "--steps", "3", "-q", "--", sys.executable, script])
    d = json.loads(capsys.readouterr().out)
    assert code == 1 and d["framework"] == "tensorflow", d
    (f,) = [f for f in d["findings"] if f["check"] == "update"]
    assert f["severity"] == "warning"
    assert f["cause"].startswith("trainable variables not passed to apply_gradients: mlp/hidden/bias, "
                                 "mlp/logit/bias"), f["cause"]
    assert WRONG_EVERY not in f["cause"]
