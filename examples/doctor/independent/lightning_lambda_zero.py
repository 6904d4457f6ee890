"""Planted bug (update): a LightningModule with a LambdaLR meant per epoch
(``1 - epoch / max_epochs``) but stepped every batch (``interval="step"``): the factor
reaches 0 after ``max_epochs`` batches and is clamped there, so training stops moving.
Expected: ``update`` (the learning rate fell to 0 at a step > 0: a scheduler).

    bisect doctor -- python examples/doctor/independent/lightning_lambda_zero.py
"""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MAX_EPOCHS = 4


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: max(0.0, 1.0 - e / MAX_EPOCHS))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}  # BUG: per step


if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    x = torch.randn(160, 8)
    y = torch.randint(0, 3, (160,))
    dl = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, num_workers=0)
    trainer = L.Trainer(max_epochs=MAX_EPOCHS, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LitClassifier(), dl)
