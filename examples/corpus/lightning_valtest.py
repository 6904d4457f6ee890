"""A LightningModule fitted, validated and tested by a Lightning Trainer: a peer-corpus script.

Style imitated: Lightning's bug-report template (the "BoringModel" script) and the
LightningModule / LightningDataModule documentation. Written for this corpus, not copied.
Patterns it exercises:

- ``training_step`` / ``validation_step`` / ``test_step`` on one LightningModule, data
  from a ``LightningDataModule`` (train, val and test loaders; ``--val_batch_size``);
- ``Trainer(max_steps=..., val_check_interval=..., limit_val_batches=...,
  num_sanity_val_steps=2, enable_progress_bar=False, logger=False,
  enable_checkpointing=False, deterministic=True)``: a sanity check (2 validation batches)
  before the first training step, validation every ``val_check_interval`` steps;
- ``trainer.fit(model, datamodule=dm)`` then ``trainer.test(model, datamodule=dm)``;
- ``seed_everything(seed)`` before the model is built; dropout during training.

    python lightning_valtest.py --max_steps 4 --seed 7
    bisect capture -o pl.trace --steps 3 -- python lightning_valtest.py --limit_val_batches 3

CPU, a two-layer MLP on generated regression data; writes nothing (no logger, no checkpoints).
"""

import argparse
import os
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*")


class RegressionData(L.LightningDataModule):
    def __init__(self, batch_size=8, val_batch_size=8, features=16):
        super().__init__()
        self.batch_size, self.val_batch_size, self.features = batch_size, val_batch_size, features

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(1234)  # the data set is fixed; the seed is for the model
        w = torch.randn(self.features, 1, generator=g)

        def split(n):
            x = torch.randn(n, self.features, generator=g)
            return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))

        self.train_set, self.val_set, self.test_set = split(96), split(48), split(32)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.val_batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.val_batch_size)


class LitRegressor(L.LightningModule):
    def __init__(self, features=16, hidden=32, lr=0.05, dropout=0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        print(f"train step {self.global_step}: loss {loss.item():.9g}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    p = argparse.ArgumentParser(description="LightningModule fit + test")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--max_steps", type=int, default=8)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--val_batch_size", type=int, default=8)
    p.add_argument("--val_check_interval", type=int, default=2)
    p.add_argument("--limit_val_batches", type=int, default=2)
    args = p.parse_args()

    L.seed_everything(args.seed, workers=True)
    dm = RegressionData(args.batch_size, args.val_batch_size)
    model = LitRegressor(lr=args.lr)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        val_check_interval=args.val_check_interval,
        limit_val_batches=args.limit_val_batches,
        num_sanity_val_steps=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        deterministic=True,
        default_root_dir=os.getcwd(),
    )
    trainer.fit(model, datamodule=dm)
    results = trainer.test(model, datamodule=dm, verbose=False)
    print(f"test loss {results[0]['test_loss']:.4f}")


if __name__ == "__main__":
    main()
