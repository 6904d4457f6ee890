"""A LightningModule resumed with ``trainer.fit(model, ckpt_path=...)``; the DataLoader shuffles
(``shuffle=True``, no generator), ``ModelCheckpoint`` writes ``ckpt/last.ckpt`` every step.

Planted bug: Lightning's checkpoint holds no RNG state, and a shuffling DataLoader draws each
epoch's permutation from the global RNG. Resumed at an epoch boundary, the next epoch's order
is drawn from the freshly seeded RNG, not from where the uninterrupted run's RNG was.

    python lightning_shuffle.py --steps 8
    python lightning_shuffle.py --steps 8 --ckpt-path ckpt/last.ckpt
"""

import argparse

import lightning.pytorch as L
import torch
from torch import nn


class Regressor(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(5, 10), nn.SiLU(), nn.Linear(10, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.smooth_l1_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ckpt-path", default=None)
    args = p.parse_args()
    L.seed_everything(11, verbose=False)
    ds = torch.utils.data.TensorDataset(torch.randn(16, 5), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
    ckpt = L.callbacks.ModelCheckpoint(dirpath="ckpt", save_last=True, save_top_k=0, every_n_train_steps=1,
                                       enable_version_counter=False)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, callbacks=[ckpt],
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Regressor(), train_dataloaders=loader, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
