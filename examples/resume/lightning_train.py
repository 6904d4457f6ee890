"""A tiny Lightning run that checkpoints every step (``ModelCheckpoint``) and resumes with
``trainer.fit(ckpt_path=...)``; used by bisect resume's tests and docs/resume.md.

    python lightning_train.py --total 6                        # trains, ckpts/last.ckpt after every step
    python lightning_train.py --total 6 --resume ckpts/last.ckpt
    ... --dropout       # a Dropout layer (Lightning's checkpoint does not hold the RNG states)

With 12 samples in batches of 4 an epoch is 3 steps: a resume after step 2 starts at an epoch
boundary; after step 3 or 4 it starts mid-epoch, where Lightning restarts a plain DataLoader
at the beginning of the epoch (its documented mid-epoch limitation).
"""

import argparse

import torch
from torch import nn

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

p = argparse.ArgumentParser()
p.add_argument("--total", type=int, default=6)
p.add_argument("--resume", default=None)
p.add_argument("--dropout", action="store_true")
a = p.parse_args()


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        layers = [nn.Linear(8, 16), nn.ReLU()] + ([nn.Dropout(0.3)] if a.dropout else []) + [nn.Linear(16, 1)]
        self.body = nn.Sequential(*layers)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5),
                                                    "interval": "step"}}


pl.seed_everything(0)
ds = torch.utils.data.TensorDataset(torch.randn(12, 8), torch.randn(12, 1))
loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False)
ckpt = pl.callbacks.ModelCheckpoint(dirpath="ckpts", every_n_train_steps=1, save_last=True, save_top_k=0,
                                      enable_version_counter=False)  # overwrite last.ckpt (no last-v1.ckpt)
trainer = pl.Trainer(max_steps=a.total, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[ckpt], num_sanity_val_steps=0)
trainer.fit(Net(), loader, ckpt_path=a.resume)
