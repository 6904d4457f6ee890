"""An unmodified Lightning script records under the launcher (global torch hooks, plus the
callback Lightning loads from reprobisect's entry point: names from the LightningModule,
the Trainer's settings in the environment).

Guards the packaging too: a broken Lightning entry point declared by reprobisect would
make every Lightning script fail, recorded or not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprobisect.trace import read_trace

pytest.importorskip("lightning")

SCRIPT = textwrap.dedent(
    '''
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.body(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    if __name__ == "__main__":
        L.seed_everything(0)
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g))
        trainer = L.Trainer(max_steps=6, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu", devices=1)
        trainer.fit(Net(), DataLoader(data, batch_size=16, shuffle=True, generator=g))
    '''
)


@pytest.mark.slow
def test_lightning_script_records_two_steps(tmp_path: Path) -> None:
    script = tmp_path / "train_lightning.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run.trace"
    proc = subprocess.run(
        [sys.executable, "-m", "reprobisect.runners.launch", "--trace", str(out), "--steps", "2", "--", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = read_trace(out)
    assert trace.manifest.outcome["status"] == "ok"
    assert [s.step for s in trace.steps] == [0, 1]
    kinds = {r.kind for r in trace.steps[0].records}
    assert {"batch", "activation", "loss", "grad", "param"} <= kinds
    assert trace.steps[0].scalars["no_gradients"] is False
    assert trace.steps[0].scalars["lr"] == [0.1]
    # the callback made the LightningModule the model: names are its state_dict keys
    names = {(r.kind, r.name) for r in trace.steps[0].records}
    assert {("param", "body.0.weight"), ("grad", "body.2.bias"), ("activation", "body.0"), ("activation", "body")} <= names, names
    light = trace.manifest.environment["lightning"]
    assert light["precision"] == "32-true" and light["accumulate_grad_batches"] == 1 and light["max_steps"] == 6


def test_lightning_without_the_launcher_gets_no_callback(tmp_path: Path) -> None:
    """The entry point is read by every Trainer wherever reprobisect is installed: outside a
    recorded run it adds nothing and the script runs as it always did."""
    script = tmp_path / "train_lightning.py"
    script.write_text(SCRIPT.replace(
        "trainer.fit(Net(),",
        "assert not any(type(c).__name__ == 'ReprobisectCallback' for c in trainer.callbacks), trainer.callbacks\n"
        "    trainer.fit(Net(),",
    ))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from importlib.metadata import entry_points

    assert any(ep.value == "reprobisect.runners.lightning:callbacks"
               for ep in entry_points(group="lightning.pytorch.callbacks_factory")), "entry point not installed"


EVAL_SCRIPT = SCRIPT.replace(
    "        return nn.functional.cross_entropy(self.body(x), y)\n",
    "        return nn.functional.cross_entropy(self.body(x), y)\n\n"
    "    def validation_step(self, batch, batch_idx):\n"
    "        x, y = batch\n"
    "        self.log('val_loss', nn.functional.cross_entropy(self.body(x), y))\n\n"
    "    def test_step(self, batch, batch_idx):\n"
    "        x, y = batch\n"
    "        self.log('test_loss', nn.functional.cross_entropy(self.body(x), y))\n",
).replace(
    "    trainer = L.Trainer(max_steps=6,",
    "    import sys\n    vbs = int(sys.argv[1])\n    trainer = L.Trainer(max_steps=3, val_check_interval=2,",
).replace(
    "    trainer.fit(Net(), DataLoader(data, batch_size=16, shuffle=True, generator=g))",
    "    net = Net()\n"
    "    trainer.fit(net, DataLoader(data, batch_size=16, shuffle=True, generator=g), DataLoader(data, batch_size=vbs))\n"
    "    trainer.test(net, DataLoader(data, batch_size=vbs))",
)


@pytest.mark.slow
def test_lightning_sanity_check_validation_and_test_are_evaluation(tmp_path: Path) -> None:
    """Sanity check, validation every 2 steps and a test after fit (inference tensors) never
    enter a training step: changing only their batch size changes no record. Training ends
    within the recorded steps: outcome ok. The seed_everything seed reaches the manifest."""
    from reprobisect.core.compare import compare_traces

    assert "validation_step" in EVAL_SCRIPT and "trainer.test" in EVAL_SCRIPT
    script = tmp_path / "train_eval.py"
    script.write_text(EVAL_SCRIPT)
    traces = []
    for vbs in (8, 32):
        out = tmp_path / f"v{vbs}.trace"
        proc = subprocess.run(
            [sys.executable, "-m", "reprobisect.runners.launch", "--trace", str(out), "--steps", "5", "--", str(script), str(vbs)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        traces.append(read_trace(out))
    a, b = traces
    c = compare_traces(a, b)
    assert c, str(c)
    assert a.manifest.outcome["status"] == "ok" and [s.step for s in a.steps] == [0, 1, 2]
    assert a.manifest.seed == 0
    ids = [i for s in a.steps for i in s.batch_ids]
    assert all(len(s.batch_ids) == 16 for s in a.steps) and len(set(ids)) == 48  # no batch twice, none from eval
    phases = [(s.step, e["phase"], e["after_step"], e["batches"]) for s in a.steps for e in s.scalars.get("eval", [])]
    assert phases == [(0, "sanity_check", None, 2), (2, "validation", 1, 8)]
    tail = a.manifest.extra["eval_after_last_step"]
    assert [(e["phase"], e["after_step"], e["samples"]) for e in tail] == [("test", 2, 64)]
    assert b.steps[2].scalars["eval"][0]["batches"] == 2
