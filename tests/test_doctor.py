"""``bisect doctor`` (issue 15): each planted-bug script in ``examples/doctor/`` gets the right
top finding, the healthy one nothing above ``info``, and bad input is one line with exit 2.

Real runs: each script is recorded once through the probe path (module-scoped fixtures);
those tests are ``slow`` (a recorded run takes a few seconds on CPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.core.options import ProbeOptions
from reprobisect.workflows.doctor import CHECKS, Diagnosis, run_doctor

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "doctor"
STEPS = 8


def _script(name: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / f"{name}.py")]


def _diagnose(name: str, checks: tuple[str, ...] = ("finite", "update", "modes", "contract"), steps: int = STEPS) -> Diagnosis:
    return run_doctor(_script(name), ProbeOptions(steps=steps, quiet=True), checks=checks)


@pytest.fixture(scope="module")
def single_runs() -> dict[str, Diagnosis]:
    """The one-run checks on each planted-bug script (one recorded run each)."""
    names = ("detached", "optimizer_copy", "lr_zero", "detach_backward", "eval_train_mode", "no_train_after_eval",
             "broadcast_mse", "softmax_ce", "sigmoid_bce_logits", "unused_branch")
    return {name: _diagnose(name) for name in names}


@pytest.fixture(scope="module")
def nan_cli(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """``bisect doctor -o DIR --check finite`` on the log(0) script: exit code, text, DIR."""
    out = tmp_path_factory.mktemp("doctor") / "nan"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["doctor", "-o", str(out), "--check", "finite", "--steps", str(STEPS), "-q", "--",
                     *_script("nan_log")])
    return code, buf.getvalue(), out


@pytest.fixture(scope="module")
def healthy_json() -> tuple[int, dict]:
    """Every check, through the CLI with --json, on the healthy script."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["doctor", "--json", "--steps", "4", "-q", "--", *_script("healthy")])
    return code, json.loads(buf.getvalue())


def _top(d: Diagnosis):
    assert d.findings, d
    return d.findings[0]


# ----------------------------------------------------------------------------- finite


@pytest.mark.slow
def test_nan_from_log_zero_names_the_loss_at_its_step_with_the_samples(nan_cli):
    code, text, _ = nan_cli
    assert code == 1, text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines[1].startswith("ERROR [finite] step 5: the loss is non-finite while the model's outputs are finite"), text
    assert "sample ids: [40, 41, 42, 43, 44, 45, 46, 47]" in text
    assert "finite before it: [batch, input, output]" in text


@pytest.mark.slow
def test_finite_keeps_the_first_bad_batch_and_the_last_healthy_state(nan_cli):
    code, text, out = nan_cli
    kept = out / "first-nonfinite"
    assert (kept / "tensors" / "step-000005.safetensors").is_file(), text
    assert (kept / "state" / "step-4").is_dir(), text
    assert "last healthy state: state/step-4/" in text
    assert (out / "run" / "manifest.json").is_file()


# ----------------------------------------------------------------------------- update


@pytest.mark.slow
def test_item_round_trip_is_a_detached_graph(single_runs):
    f = _top(single_runs["detached"])
    assert (f.check, f.severity) == ("update", "error")
    assert "no parameter got a gradient" in f.cause and "detached" in f.cause
    assert set(f.evidence["parameters_without_gradient"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert len(set(f.evidence["loss"])) == 1  # the symptom: the loss does not move


@pytest.mark.slow
def test_detach_before_the_loss_crash_is_named_a_detached_graph(single_runs):
    d = single_runs["detach_backward"]
    f = _top(d)
    assert (f.check, f.severity) == ("update", "error"), d
    assert "no graph to the model" in f.cause
    assert "does not require grad" in f.evidence["last_line"]
    assert d.exit_code == 1


@pytest.mark.slow
def test_optimizer_on_a_copy_is_named(single_runs):
    f = _top(single_runs["optimizer_copy"])
    assert (f.check, f.severity) == ("update", "error")
    assert "built on a copy of the model" in f.cause
    assert f.evidence["model_parameters_not_in_optimizer"] == ["0.bias", "0.weight", "2.bias", "2.weight"]


@pytest.mark.slow
def test_scheduler_driving_lr_to_zero_is_named_with_its_step(single_runs):
    f = _top(single_runs["lr_zero"])
    assert (f.check, f.severity) == ("update", "error")
    assert "fell to 0 at step 2" in f.cause and "schedule" in f.cause
    assert f.evidence["zero_from_step"] == 2
    assert [f.check for f in single_runs["lr_zero"].findings].count("finite") == 1  # finite ran too: info
    assert single_runs["lr_zero"].findings[-1].severity == "info"


@pytest.mark.slow
def test_parameters_that_never_get_a_gradient_are_named(single_runs):
    f = _top(single_runs["unused_branch"])
    assert (f.check, f.severity) == ("update", "warning"), single_runs["unused_branch"]
    assert f.evidence["never_gradient"] == ["aux.bias", "aux.weight"]
    assert "never received a gradient" in f.cause


# ----------------------------------------------------------------------------- repro


@pytest.mark.slow
def test_unseeded_script_is_not_reproducible_at_step_0():
    d = _diagnose("unseeded", checks=("repro",), steps=2)
    f = _top(d)
    assert (f.check, f.severity) == ("repro", "warning"), d
    assert f.evidence["step"] == 0
    assert "not seeded" in f.cause
    assert d.exit_code == 1


# ----------------------------------------------------------------------------- modes


@pytest.mark.slow
def test_evaluation_under_no_grad_in_training_mode_is_named(single_runs):
    d = single_runs["eval_train_mode"]
    f = _top(d)
    assert (f.check, f.severity) == ("modes", "warning"), d
    assert "in training mode" in f.cause and f.evidence["phase"] == "no_grad"
    assert f.evidence["after_step"] == 1
    assert f.evidence["layers_in_training_mode"] == ["1", "3"]  # the BatchNorm1d and the Dropout


@pytest.mark.slow
def test_training_on_in_eval_mode_after_validation_is_named(single_runs):
    d = single_runs["no_train_after_eval"]
    f = _top(d)
    assert (f.check, f.severity) == ("modes", "warning"), d
    assert "trains in eval mode" in f.cause and "model.train()" in f.cause
    assert f.evidence["steps_in_eval_mode"][0] == 2
    assert f.evidence["trained_in_train_mode_until"] == 1


@pytest.mark.slow
def test_a_planted_bug_leaves_the_other_checks_at_info(single_runs):
    for name in ("optimizer_copy", "eval_train_mode"):
        d = single_runs[name]
        assert [f.severity for f in d.findings].count("info") == len(d.findings) - 1, d


# ----------------------------------------------------------------------------- contract


@pytest.mark.slow
def test_n1_against_n_broadcasting_to_nn_in_a_hand_written_loss_is_named(single_runs):
    f = _top(single_runs["broadcast_mse"])
    assert (f.check, f.severity) == ("contract", "error"), single_runs["broadcast_mse"]
    assert (f.evidence["from"], f.evidence["to"]) == ([16, 1], [16, 16])
    assert "[16, 1] against targets of shape [16] into [16, 16]" in f.cause


@pytest.mark.slow
def test_softmax_into_cross_entropy_is_named(single_runs):
    f = _top(single_runs["softmax_ce"])
    assert (f.check, f.severity) == ("contract", "error"), single_runs["softmax_ce"]
    assert "probabilities" in f.cause and "logits" in f.cause
    assert (f.evidence["op"], f.evidence["after"]) == ("LogSoftmaxBackward0", "SoftmaxBackward0")


@pytest.mark.slow
def test_sigmoid_into_bce_with_logits_is_named(single_runs):
    f = _top(single_runs["sigmoid_bce_logits"])
    assert (f.check, f.severity) == ("contract", "error"), single_runs["sigmoid_bce_logits"]
    assert "binary_cross_entropy_with_logits of a sigmoid" in f.cause


# ----------------------------------------------------------------------------- healthy


@pytest.mark.slow
def test_healthy_script_gets_nothing_above_info_from_every_check(healthy_json):
    code, doc = healthy_json
    assert code == 0, doc
    assert {f["check"] for f in doc["findings"]} == set(CHECKS)
    assert all(f["severity"] == "info" for f in doc["findings"]), doc
    assert set(doc["findings"][0]) == {"check", "severity", "cause", "evidence", "next"}
    assert (doc["framework"], doc["not_applicable"]) == ("torch", {}), doc


@pytest.mark.slow
def test_healthy_script_fits_one_batch_and_is_neither_input_bound_nor_growing(healthy_json):
    _, doc = healthy_json
    by = {f["check"]: f for f in doc["findings"]}
    fit = by["overfit"]
    assert fit["cause"].startswith("fits one batch"), fit
    assert fit["evidence"]["table"]["accuracy"][-1] == 1.0 and fit["evidence"]["wall_s"] > 0
    assert fit["evidence"]["dropout_calls_zeroed"] > 0  # healthy.py has a Dropout(0.1): switched off
    assert by["input"]["cause"].startswith(("compute-bound", "neither dominates")), by["input"]
    assert by["memory"]["cause"].startswith("memory steady"), by["memory"]
    table = by["memory"]["evidence"]["table"]
    assert table["retained_losses"] == [0] * len(table["step"])


# ----------------------------------------------------------------------------- bad input


def test_unknown_check_is_one_line_naming_the_valid_ones(capsys):
    assert main(["doctor", "--check", "vibes", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: unknown check 'vibes'; the checks are: {', '.join(CHECKS)}"]


def test_missing_command_is_a_usage_error(capsys):
    assert main(["doctor"]) == 2
    assert main(["doctor", "--"]) == 2
    assert "give the training command after --" in capsys.readouterr().err


def test_a_command_that_crashes_is_a_finding_not_a_traceback(tmp_path, capsys):
    script = tmp_path / "boom.py"
    script.write_text("raise ValueError('boom: the data file is missing')\n")
    code = main(["doctor", "--check", "finite", "-q", "--", sys.executable, str(script)])
    out = capsys.readouterr()
    assert code == 1, out
    assert "Traceback" not in out.out
    assert "ERROR [run] the command crashed" in out.out
    assert "boom: the data file is missing" in out.out


def test_checks_parse_in_priority_order_and_the_json_is_strict():
    from reprobisect.workflows.doctor import Finding, parse_checks

    assert parse_checks(None) == CHECKS
    assert CHECKS == ("finite", "update", "overfit", "contract", "modes", "input", "memory", "repro")
    assert parse_checks(["repro", "finite,update", "finite"]) == ("finite", "update", "repro")
    doc = Finding("finite", "error", "x", {"norms": [1.0, float("nan"), float("inf")]}).to_json()
    assert json.loads(json.dumps(doc, allow_nan=False))["evidence"]["norms"] == [1.0, "nan", "inf"]
