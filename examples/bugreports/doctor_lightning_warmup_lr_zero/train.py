"""Lightning module whose per-step warmup factor is an integer division: 0 for the whole warmup.

Adapted from pytorch/torchtitan#1010: a warmup/decay LambdaLR whose factor formula produced a
learning rate of 0.0 at steps where it should not; here `step // WARMUP` is 0 for every step
before WARMUP, so training starts with a learning rate of zero.
"""

import lightning as L
import torch
from torch import nn

WARMUP = 1000


class Net(L.LightningModule):
    """MLP regressor with a per-step warmup schedule."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.f(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1, step // WARMUP))  # meant step / WARMUP
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warm, "interval": "step"}}


L.seed_everything(0, verbose=False)
xs = torch.randn(64, 4)
ys = xs[:, :1] - 0.5 * xs[:, 1:2]
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
trainer = L.Trainer(max_steps=80, logger=False, enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, accelerator="cpu", devices=1)
trainer.fit(Net(), loader)
