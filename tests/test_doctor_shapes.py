"""``bisect doctor`` on what enters a loss (issue 36 item 7): predictions and targets whose
shapes broadcast to a bigger shape in an element-wise loss (``[B]`` against ``[B, 1]`` into
``MSELoss``, the other way round, the BCE pair that refuse it), and a loss on logits fed
probabilities whose fixed-batch run reaches 100 % accuracy above the loss's floor (never "fits
one batch"), in plain torch and under Lightning.

Tiny scripts of this file's own, written to a tmp dir; each diagnosed once (module-scoped)
through the real probe path. The recorded runs are ``slow`` (each imports torch in a child).
"""

from __future__ import annotations

import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from reprobisect.core.options import ProbeOptions
from reprobisect.runners.observers.torch_lossshapes import broadcast_growth
from reprobisect.workflows.doctor import Diagnosis, run_doctor
from reprobisect.workflows.doctor.contract import CRASH_CONTRACT, crash_cause

HEAD = """
import sys
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
"""
SCRIPTS = {
    # nn.MSELoss given predictions [B] (squeezed) and targets [B, 1]
    "mse_squeezed": """
xs = torch.randn(64, 3)
ys = xs.sum(1, keepdim=True)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
crit = nn.MSELoss()
for epoch in range(4):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x).squeeze(-1), y).backward()
        opt.step()
""",
    # the same regression, shapes that agree: no broadcast finding
    "mse_aligned": """
xs = torch.randn(64, 3)
ys = xs.sum(1, keepdim=True)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    opt.zero_grad()
    F.smooth_l1_loss(model(x), y).backward()
    opt.step()
""",
    # BCE-with-logits refuses [B] against [B, 1]: the run crashes in the loss at step 0
    "bce_shapes": """
xs = torch.randn(64, 3)
ys = (xs[:, :1] > 0).float()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    F.binary_cross_entropy_with_logits(model(x).view(-1), y).backward()
    opt.step()
""",
    # a sigmoid's output into BCE-with-logits; the model ends in the sigmoid, so 0.5 thresholds it
    "sigmoid_into_bce_logits": """
xs = torch.randn(64, 4)
ys = (xs[:, 0] > 0).float()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0), nn.Sigmoid())
opt = torch.optim.SGD(model.parameters(), lr=5.0)
for epoch in range(4):
    for x, y in loader:
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(x), y).backward()
        opt.step()
""",
}
LIGHTNING = """
import lightning as L
import torch
from torch import nn


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.body(x).log_softmax(-1).exp()  # probabilities, spelled as exp() of log-probabilities

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.6)


L.seed_everything(0, verbose=False)
xs = torch.randn(64, 4)
ys = (xs[:, 0] > 0).long() + (xs[:, 1] > 0.5).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
L.Trainer(max_steps=60, logger=False, enable_progress_bar=False, enable_model_summary=False,
          enable_checkpointing=False, accelerator="cpu", devices=1).fit(Net(), loader)
"""
OVERFIT_STEPS = 24


def _script(tmp: Path, name: str, body: str) -> list[str]:
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def _text(d: Diagnosis) -> str:
    return "\n".join(f"{f.severity} [{f.check}] {f.cause} | {f.next}" for f in d.findings)


def _one(d: Diagnosis, check: str):
    (f,) = [f for f in d.findings if f.check == check]
    return f


class _Runs(dict):
    """Each script diagnosed once, when a test first asks for it (so ``-k`` runs only what it needs)."""

    CHECKS = {"mse_squeezed": ("overfit", "contract"), "mse_aligned": ("contract",), "bce_shapes": ("contract",),
              "sigmoid_into_bce_logits": ("overfit", "contract")}

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name: str) -> Diagnosis:
        self[name] = run_doctor(_script(self.tmp, name, HEAD + SCRIPTS[name]), ProbeOptions(steps=4, quiet=True),
                                checks=self.CHECKS[name], overfit_steps=OVERFIT_STEPS)
        return self[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    return _Runs(tmp_path_factory.mktemp("shapes"))


# -- the shapes given to an element-wise loss ------------------------------------------------


def test_broadcast_growth_names_the_shapes_that_grow_and_only_those():
    p = torch.zeros(8, requires_grad=True)
    assert broadcast_growth(p, torch.zeros(8, 1)) == {"input": [8], "target": [8, 1], "to": [8, 8]}
    assert broadcast_growth(p.view(8, 1), torch.zeros(8)) == {"input": [8, 1], "target": [8], "to": [8, 8]}
    assert broadcast_growth(torch.zeros(5), torch.zeros(2, 5, 1))["to"] == [2, 5, 5]
    for target in (torch.zeros(8), torch.zeros(1), torch.tensor(0.5), torch.zeros(3)):
        assert broadcast_growth(p, target) is None  # same shape, a constant, shapes that do not broadcast
    q = torch.zeros(8, requires_grad=True)
    assert broadcast_growth(p.view(8, 1), q.view(1, 8)) is None  # both from the model: pairwise by design


@pytest.mark.slow
def test_mse_loss_of_squeezed_predictions_against_column_targets_is_named_with_its_shapes(runs):
    d = runs["mse_squeezed"]
    f = _one(d, "contract")
    assert f.severity == "error", _text(d)
    assert f.cause.startswith("the loss mse_loss gets predictions of shape [8] and targets of shape [8, 1], which "
                              "broadcast to [8, 8]: every prediction is compared with every target"), f.cause
    assert (f.evidence["input_shape"], f.evidence["target_shape"], f.evidence["broadcast_to"]) == ([8], [8, 1], [8, 8])
    assert "pred.unsqueeze(-1) (or target.squeeze(-1))" in f.next
    assert "no shape broadcast" not in _text(d)


@pytest.mark.slow
def test_fixed_batch_run_of_a_broadcasting_loss_is_inconclusive_not_cannot_fit(runs):
    f = _one(runs["mse_squeezed"], "overfit")
    assert f.severity == "info", f
    assert f.cause.startswith("inconclusive: the loss broadcasts [8] against [8, 1] to [8, 8] (see [contract])"), f.cause
    assert "fixed_batch_result" in f.evidence and f.evidence["loss_broadcast"]["loss"] == "mse_loss"
    assert not re.search(r"cannot fit|fits one batch", f.cause)


@pytest.mark.slow
def test_aligned_shapes_get_no_broadcast_finding_and_say_what_was_looked_at(runs):
    f = _one(runs["mse_aligned"], "contract")
    assert f.severity == "info", f
    assert f.cause.startswith("no shape broadcast into the loss and no probabilities fed to a loss that expects "
                              "logits were seen over 4 step(s) (looked at: the shapes given to element-wise losses"), f
    assert "broadcast to" not in f.cause


@pytest.mark.slow
def test_bce_with_logits_refusing_the_shapes_is_a_contract_error_with_them_and_nothing_claimed_unchecked(runs):
    d = runs["bce_shapes"]
    errors = [f for f in d.findings if f.severity == "error"]
    assert [(f.check, f.cause) for f in errors] == [
        ("contract", "the loss raised at step 0: the targets' shape ([8, 1]) differs from the predictions' ([8]) and "
                     "this loss refuses to broadcast them")], _text(d)
    assert "view_as(target)" in errors[0].next
    rest = [f.cause for f in d.findings if f.severity == "info" and f.check == "contract"]
    assert rest == ["not checked — the run recorded no training step, so no loss was seen"], _text(d)


def test_crash_cause_fills_in_both_spellings_of_the_shape_message():
    line, _, cause, _ = next(e for e in CRASH_CONTRACT if "{target}" in e[2])
    for msg, want in (("ValueError: Target size (torch.Size([4, 1])) must be the same as input size "
                       "(torch.Size([4]))", ("[4, 1]", "[4]")),
                      ("ValueError: Using a target size (torch.Size([4])) that is different to the input size "
                       "(torch.Size([4, 1])) is deprecated. Please ensure they have the same size.", ("[4]", "[4, 1]"))):
        m = re.search(line, msg)
        assert m is not None, msg
        assert crash_cause(cause, m).startswith(f"the targets' shape ({want[0]}) differs from the predictions' "
                                                f"({want[1]})")


# -- probabilities into a loss on logits: the fixed-batch run is not a fit --------------------------


@pytest.mark.slow
def test_sigmoid_into_bce_with_logits_is_named_with_its_floor(runs):
    d = runs["sigmoid_into_bce_logits"]
    f = _one(d, "contract")
    floor = math.log(1 + 1 / math.e)
    assert f.severity == "error" and "sigmoid" in f.cause, _text(d)
    assert f"the loss cannot go below {floor:.4g} (its floor per element with 0/1 targets)" in f.cause, f.cause


@pytest.mark.slow
def test_fixed_batch_run_on_probabilities_is_not_shown_to_fit_even_at_full_accuracy(runs):
    d = runs["sigmoid_into_bce_logits"]
    f = _one(d, "overfit")
    floor = math.log(1 + 1 / math.e)
    assert f.severity == "warning", _text(d)
    assert f.cause.startswith("not shown to fit one batch: the loss went from"), f.cause
    assert f"the loss binary_cross_entropy_with_logits is fed a sigmoid's output (each value in [0, 1]), so it " \
           f"cannot go below {floor:.4g} per element with 0/1 targets" in f.cause
    assert f.evidence["table"]["accuracy"][-1] == 1.0  # what the old verdict called "fits one batch"
    assert f.evidence["floor"] == pytest.approx(floor, abs=1e-6)
    assert "fits one batch" not in _text(d)


@pytest.mark.slow
def test_lightning_ce_on_exp_of_log_softmax_is_named_and_its_fixed_batch_run_is_not_a_fit(tmp_path):
    pytest.importorskip("lightning")
    d = run_doctor(_script(tmp_path, "lit", LIGHTNING), ProbeOptions(steps=4, quiet=True, timeout=240),
                   checks=("overfit", "contract"), overfit_steps=30)
    c = _one(d, "contract")
    assert c.severity == "error" and "exp() of log_softmax" in c.cause, _text(d)
    o = _one(d, "overfit")
    assert o.severity == "warning", _text(d)  # "not shown to fit", or a plateau at the floor: never a fit
    assert "cannot go below 0.5514 for 3 classes" in o.cause, o.cause
    assert "fits one batch" not in _text(d)


def _step(i: int, loss: float, bad_kind: str | None) -> "Step":
    from reprobisect.trace.format import Record, Step

    def rec(kind: str, name: str) -> Record:
        stats = {"nan": 1 if kind == bad_kind else 0, "inf": 0}
        return Record(name=name, kind=kind, dtype="float32", shape=(4,), fingerprint=f"{kind}{i}", stats=stats)

    records = tuple(rec(k, n) for k, n in (("input", "input"), ("output", "output"), ("loss", "loss"),
                                           ("grad", "fc.weight"), ("param", "fc.weight")))
    return Step(step=i, records=records, batch_ids=[0, 1], scalars={"loss": loss, "overfit": {"repeated": True}})


@pytest.mark.parametrize("kind, says, never", [
    ("loss", "the loss arithmetic breaks on this batch", "lower the learning rate"),
    ("grad", "the update is unstable", "loss arithmetic"),
    ("input", "the batch itself holds NaN/Inf", "lower the learning rate"),
])
def test_a_fixed_batch_run_that_goes_non_finite_blames_what_broke_first(kind, says, never):
    """A NaN loss over finite outputs (log of a saturated sigmoid) is the loss's arithmetic, not
    an unstable update: "lower the learning rate" would send the user the wrong way."""
    from reprobisect.workflows.doctor.overfit import _verdict

    steps = [_step(0, 1.0, None), _step(1, 0.8, None), _step(2, float("nan"), kind)]
    (f,) = _verdict(steps, wall_s=1.0, asked=3)
    assert f.check == "overfit" and f.severity == "warning"
    assert says in f.cause and never not in f.cause + f.next, (f.cause, f.next)
    assert f.evidence["first_nonfinite_kind"] == kind


def test_layers_replaced_after_the_optimizer_was_built_are_named_from_both_sets():
    """Pruning swapped two layers for new modules after the optimizer was built: the model's new
    parameters are in no optimizer AND the optimizer holds tensors the forward never uses. Both
    sets together point at the rebuild, not at "add them to the param groups"."""
    from reprobisect.trace.format import Record, Step
    from reprobisect.workflows.doctor.update import _membership

    def rec(kind: str, name: str) -> Record:
        return Record(name=name, kind=kind, dtype="float32", shape=(2,), fingerprint=kind + name)

    init = [rec("init", n) for n in ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight")]
    stepped = [rec("param", n) for n in ("param_groups.0.0", "param_groups.0.1", "4.weight")]
    (f,) = _membership([Step(step=0, records=tuple(init + stepped))], frozen=set())
    assert f.severity == "warning" and "were layers replaced after the optimizer was built" in f.cause
    assert f.evidence["not_in_optimizer"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert f.evidence["optimizer_parameters_unused"] == ["param_groups.0.0", "param_groups.0.1"]
    assert "after the model's last structural change" in f.next
