"""``bisect doctor`` on planted-bug scripts written apart from its own examples (issue 15):
``examples/doctor/independent/`` holds one bug per script in other styles (a class-based
Trainer, a hand-written SGD loop, a LightningModule, argparse with a config dict, a CSV
Dataset, a JSON config...) and one healthy script (AdamW, clipping, OneCycle,
evaluation under ``model.eval()`` + ``no_grad``). Each must get its planted cause as the top
finding (check, severity and a key word of the cause) and exit 1; the healthy one exit 0.

Real runs, each script diagnosed once (module-scoped, two at a time: each mostly waits on
its import of torch). The bug scripts run every check but ``repro`` (ranked last, it can
only come first when the planted bug is missed; the healthy script runs it too), and
``overfit`` (a second run whose finding is at most a warning) only where the planted cause
is a warning or its own verdict is asserted.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.core.options import ProbeOptions
from reprobisect.workflows.doctor import CHECKS, Diagnosis, run_doctor

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "doctor" / "independent"
STEPS = 6
OVERFIT_STEPS = 30

EXPECTED = {  # script: (check, severity, a word of the cause)
    "frozen_trainer": ("update", "error", "frozen"),
    "manual_sgd_item": ("update", "error", "no graph"),
    "lightning_lambda_zero": ("update", "error", "fell to 0"),
    "argparse_softmax_ce": ("contract", "error", "probabilities"),
    "one_based_labels": ("contract", "error", "out of range"),
    "float_labels": ("contract", "error", "floating targets"),
    "regression_column": ("contract", "error", "broadcasts"),
    "log_counts": ("finite", "error", "forward code"),
    "eval_before_loop": ("modes", "warning", "eval mode"),
    "inference_mode_val": ("modes", "warning", "training mode"),
    "sigmoid_prices": ("overfit", "warning", "cannot fit"),
    "slow_getitem": ("input", "warning", "input-bound"),
    "running_total": ("memory", "warning", "running total"),
    "weight_decay_typo": ("update", "warning", "weight decay is the likely cause"),
}
BUG_CHECKS = tuple(c for c in CHECKS if c != "repro")


def _script(name: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / f"{name}.py")]


def _diagnose(name: str) -> Diagnosis:
    """Every check but repro; ``overfit`` (a second run, at most a warning) only where it could
    outrank the planted cause (a warning) or where its own verdict is asserted."""
    keep_overfit = EXPECTED[name][1] == "warning" or name == "lightning_lambda_zero"
    checks = BUG_CHECKS if keep_overfit else tuple(c for c in BUG_CHECKS if c != "overfit")
    return run_doctor(_script(name), ProbeOptions(steps=STEPS, quiet=True), checks=checks,
                      overfit_steps=OVERFIT_STEPS)


def _healthy_cli() -> tuple[int, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["doctor", "--json", "--steps", str(STEPS), "--overfit-steps", str(OVERFIT_STEPS), "-q", "--",
                     *_script("healthy_clip_sched")])
    return code, json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def diagnoses() -> dict[str, object]:
    """Every bug script's diagnosis and the healthy script's (exit code, JSON), two at a time."""
    timed = ("slow_getitem",)  # fetch against compute: measured alone, not beside another run
    with ThreadPoolExecutor(max_workers=2) as pool:
        healthy = pool.submit(_healthy_cli)
        futures = {name: pool.submit(_diagnose, name) for name in EXPECTED if name not in timed}
        out: dict[str, object] = {name: f.result() for name, f in futures.items()}
        out["healthy_clip_sched"] = healthy.result()
    out.update({name: _diagnose(name) for name in timed})
    return out


def test_every_script_is_listed():
    assert {p.stem for p in EXAMPLES.glob("*.py")} == set(EXPECTED) | {"healthy_clip_sched"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_planted_cause_is_the_top_finding(diagnoses, name):
    d = diagnoses[name]
    check, severity, word = EXPECTED[name]
    top = d.findings[0]
    summary = "\n".join(f"{f.severity} [{f.check}] {f.cause}" for f in d.findings)
    assert (top.check, top.severity) == (check, severity), summary
    assert word in top.cause, summary
    assert d.exit_code == 1


@pytest.mark.slow
def test_healthy_script_has_nothing_above_info(diagnoses):
    code, js = diagnoses["healthy_clip_sched"]
    above = [f for f in js["findings"] if f["severity"] != "info"]
    assert code == 0 and not above, above
    assert [f["check"] for f in js["findings"]] == list(CHECKS)  # every check ran and said so
    fits = next(f for f in js["findings"] if f["check"] == "overfit")
    assert "fits one batch" in fits["cause"] or "still falling" in fits["cause"], fits


@pytest.mark.slow
def test_evidence_names_what_a_person_needs(diagnoses):
    frozen = diagnoses["frozen_trainer"].findings[0]
    assert "head.weight" in frozen.evidence["frozen_params"]
    assert diagnoses["manual_sgd_item"].findings[0].evidence["backwards"] >= STEPS
    nan = diagnoses["log_counts"].findings[0]
    assert nan.evidence["step"] == 4 and 37 in nan.evidence["sample_ids"] and "'proj' (Linear)" in nan.cause
    modes = diagnoses["eval_before_loop"].findings[0]
    assert modes.evidence["dropout_in_eval_mode"] == ["2", "5"] and "evaluation_before_training" in modes.evidence
    lr = diagnoses["lightning_lambda_zero"]
    over = next(f for f in lr.findings if f.check == "overfit")
    assert over.severity == "info" and "learning rate is 0" in over.cause  # not a second, misleading warning
    wd = diagnoses["weight_decay_typo"].findings[0]
    assert wd.evidence["loss_growth"] >= 10 and list(wd.evidence["weight_decay"].values()) == [50.0]
    mem = diagnoses["running_total"].findings[0]
    assert mem.evidence["retained_losses_after_last_step"] >= STEPS - 2


# ----------------------------------------------------------------------------- the parts, without a run


def test_a_running_total_keeps_the_loss_graph_alive_and_item_does_not():
    import torch

    from reprobisect.runners.memory_torch import _alive, _graph_marker

    import weakref

    w = torch.ones(3, requires_grad=True)

    def losses(keep: bool) -> tuple[list, object]:
        refs, total = [], 0.0
        for _ in range(3):
            loss = (w * w).sum()
            loss.backward()
            refs.append((weakref.ref(loss), _graph_marker(loss)))
            total = total + (loss if keep else loss.item())
            del loss
        return refs, total

    kept, total = losses(True)
    assert all(_alive(r, g) for r, g in kept)  # the tensors are gone, their graphs are not
    dropped, _ = losses(False)
    assert not any(_alive(r, g) for r, g in dropped)
    del total
    assert not any(_alive(r, g) for r, g in kept)


def test_no_update_detail_names_a_graphless_backward():
    from reprobisect.runners.torch import _no_update_detail

    assert "no graph" in _no_update_detail(5, 5)
    assert "no graph" not in _no_update_detail(5, 2)
    assert "never ran backward()" in _no_update_detail(0, 0)


def test_overfit_with_a_learning_rate_driven_to_zero_is_inconclusive_not_a_warning():
    from reprobisect.trace.format import Step
    from reprobisect.workflows.doctor.overfit import check_overfit

    class _T:
        def __init__(self, steps):
            self.steps = steps

    def steps(lrs):
        return [Step(step=k, records=(), batch_ids=[0, 1], scalars={"loss": 1.0 - 0.01 * min(k, 3), "lr": [lr],
                                                                   "overfit": {"repeated": True}})
                for k, lr in enumerate(lrs)]

    f = check_overfit(_T(steps([0.1, 0.05] + [0.0] * 10)), wall_s=1.0, asked=12)[0]
    assert f.severity == "info" and "learning rate is 0 from step 2" in f.cause
    f = check_overfit(_T(steps([0.1] * 12)), wall_s=1.0, asked=12)[0]
    assert f.severity == "warning" and "cannot fit" in f.cause  # the same losses with a live lr: a plateau


@pytest.mark.slow
def test_an_index_error_outside_the_loss_is_a_crash_not_a_label_contract(tmp_path):
    script = tmp_path / "lookup.py"
    script.write_text("import torch\n"
                      "m = torch.nn.Linear(2, 1)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "table = torch.zeros(5)\n"
                      "for i in range(4):\n"
                      "    opt.zero_grad(); m(torch.ones(1, 2)).sum().backward(); opt.step()\n"
                      "    table[2 * i + 1]  # index 7: out of bounds, no loss involved\n")
    d = run_doctor([sys.executable, str(script)], ProbeOptions(steps=STEPS, quiet=True), checks=("contract",))
    top = d.findings[0]
    assert (top.check, top.severity) == ("run", "error"), d.findings
    assert "out of bounds" in top.cause


def test_diverging_needs_a_loss_that_rises_at_most_steps_and_tenfold():
    from reprobisect.workflows.doctor.update import _diverging

    assert _diverging([0.7, 2.3, 33.0, 400.0, 15666.0, 2e5])
    assert not _diverging([0.7, 0.6, 0.65, 0.5, 0.4, 0.45])  # a noisy fall
    assert not _diverging([0.01, 0.2, 0.05, 0.3, 0.02, 0.15])  # up and down: not at 70 % of the steps, not 10x at the end
    assert not _diverging([0.7, 2.3, 33.0, None, 400.0, 2e5])  # a step without a loss: no verdict
    assert not _diverging([0.7, 7.0, 70.0])  # too few steps
