"""Lightning run that saves last.ckpt every step and resumes with fit(ckpt_path=...).

Adapted from Lightning-AI/pytorch-lightning#5030: a second run in the same folder does not
overwrite an existing last.ckpt, it writes last-v1.ckpt beside it (the version counter), so a
resume that names last.ckpt can load the first run's file instead of the latest one. The
script itself is right when each run starts from a clean folder.
"""

import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--max_steps", type=int, default=10)
opts = cli.parse_args()


class Regressor(L.LightningModule):
    """Two-layer regressor; SGD with momentum (optimizer state a checkpoint must hold)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


L.seed_everything(11, verbose=False)
xs = torch.randn(32, 4)
ys = xs[:, :1] * 2 - xs[:, 1:2]
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=4, shuffle=True)
saver = ModelCheckpoint(dirpath="ckpts", save_last=True, every_n_train_steps=1, save_top_k=1)
trainer = L.Trainer(max_steps=opts.max_steps, callbacks=[saver], logger=False, enable_progress_bar=False,
                    enable_model_summary=False, accelerator="cpu", devices=1)
trainer.fit(Regressor(), loader, ckpt_path=opts.resume)
