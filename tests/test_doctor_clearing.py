"""The doctor knows the gradient-clearing bugs (issue 36 item 7): gradients never cleared,
``zero_grad`` between ``backward`` and ``step``, ``zero_grad`` inside an accumulation loop;
and a one-run check whose script ended before the steps it needs says "not checked".

Real runs of the tiny scripts in ``examples/doctor/`` through the probe path (module-scoped:
one recorded run each); ``slow`` (a recorded run takes a few seconds on CPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.workflows.doctor import Diagnosis, run_doctor

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "doctor"
STEPS = 4
OLD_WRONG = ("update path works", "the loss is detached", "cannot fit one batch", "no parameter changed")


def _diagnose(script: Path, checks: tuple[str, ...] = ("update",), steps: int = STEPS) -> Diagnosis:
    return run_doctor([sys.executable, str(script)], ProbeOptions(steps=steps, quiet=True), checks=checks)


@pytest.fixture(scope="module")
def runs() -> dict[str, Diagnosis]:
    names = ("no_zero_grad", "zero_grad_in_accumulation", "healthy")
    out = {n: _diagnose(EXAMPLES / f"{n}.py") for n in names}
    # with the fixed-batch run too: its "cannot fit one batch" is explained by the clearing bug
    out["zero_grad_between"] = _diagnose(EXAMPLES / "zero_grad_between.py", checks=("update", "overfit"))
    return out


def _text(d: Diagnosis) -> str:
    return "\n".join(f"{f.severity} [{f.check}] {f.cause} | {f.next}" for f in d.findings)


def _no_old_wrong_text(d: Diagnosis) -> None:
    text = _text(d)
    for old in OLD_WRONG:
        assert old not in text, text


@pytest.mark.slow
def test_gradients_never_cleared_is_an_update_error_with_stale_grad_evidence(runs):
    d = runs["no_zero_grad"]
    top = d.findings[0]
    assert (top.check, top.severity) == ("update", "error"), _text(d)
    assert top.cause.startswith("the gradients are never cleared: at the first backward of 3 of 4 step(s)"), top.cause
    assert top.evidence["steps"] == [1, 2, 3]
    assert top.evidence["called"] == [] and top.evidence["backwards_per_step"] == 1
    assert top.evidence["parameters"].startswith("4 of the 4 with a gradient still held the previous step's")
    assert "zero_grad()" in top.next
    _no_old_wrong_text(d)


@pytest.mark.slow
def test_zero_grad_between_backward_and_step_is_not_called_a_detached_loss(runs):
    d = runs["zero_grad_between"]
    top = d.findings[0]
    assert (top.check, top.severity) == ("update", "error"), _text(d)
    assert top.cause.startswith("the gradients are cleared between backward() and optimizer.step() "
                                "(optimizer.zero_grad() after the last backward)"), top.cause
    assert "(the loss is not detached)" in top.cause
    assert top.evidence["zero_grad_calls"]["after_last_backward"] == 1
    assert top.evidence["steps"] == [0, 1, 2, 3]
    fit = next(f for f in d.findings if f.check == "overfit")
    assert fit.severity == "info", fit
    assert fit.cause.startswith("inconclusive: the gradients are cleared wrongly (see [update])"), fit.cause
    assert fit.evidence["fixed_batch_result"].startswith("cannot fit one batch"), fit.evidence
    assert not [f for f in d.findings if f.severity == "error" and f is not top], _text(d)
    text = _text(d).replace("(the loss is not detached)", "")
    for old in OLD_WRONG:
        assert old not in text, text


@pytest.mark.slow
def test_zero_grad_inside_accumulation_keeps_only_the_last_micro_batch(runs):
    d = runs["zero_grad_in_accumulation"]
    top = d.findings[0]
    assert (top.check, top.severity) == ("update", "error"), _text(d)
    assert top.cause.startswith("the gradients are cleared inside the accumulation loop: 4 backwards per optimizer "
                                "step"), top.cause
    assert "only the last micro-batch's gradient" in top.cause
    assert top.evidence["zero_grad_calls"] == {"before_first_backward": 1, "between_backwards": 3,
                                               "after_last_backward": 0}
    _no_old_wrong_text(d)


@pytest.mark.slow
def test_healthy_script_gets_no_clearing_finding(runs):
    d = runs["healthy"]
    assert all(f.severity == "info" for f in d.findings), _text(d)
    assert "cleared" not in _text(d) and not any("zero_grad_calls" in f.evidence for f in d.findings)
    assert any("update path works" in f.cause for f in d.findings), _text(d)


_ONE_STEP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
opt.zero_grad()
nn.functional.cross_entropy(model(x), y).backward()
opt.step()
"""


@pytest.mark.slow
def test_update_check_on_a_script_that_ends_after_one_step_says_not_checked(tmp_path):
    script = tmp_path / "one_step.py"
    script.write_text(_ONE_STEP)
    d = _diagnose(script)
    upd = [f for f in d.findings if f.check == "update"]
    assert len(upd) == 1, _text(d)
    assert upd[0].severity == "info"
    assert upd[0].cause == "not checked — the script ended after 1 step(s); it needs 2", upd[0].cause
    assert upd[0].next == "let the script run at least 2 optimizer steps"
    assert "update path works" not in _text(d)
