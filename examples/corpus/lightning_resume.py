"""A LightningModule trained with ModelCheckpoint and resumed with ``trainer.fit(ckpt_path=...)``.

Style imitated: Lightning's "BoringModel" bug-report script and the checkpointing guide
("Saving and loading checkpoints": ``ModelCheckpoint(every_n_train_steps=...)``,
``save_last=True``, ``trainer.fit(model, ckpt_path="last.ckpt")``). Written for this
corpus, not copied. Patterns it exercises:

- ``ModelCheckpoint(dirpath=--ckpt_dir, every_n_train_steps=--every, save_top_k=-1,
  save_last=True)``: ``step=K.ckpt`` after every ``--every`` optimizer steps and
  ``last.ckpt``; ``--resume PATH`` continues from one (``trainer.fit(ckpt_path=PATH)``);
- a CSV logger (``--log_dir``), a validation loader with the sanity check
  (``num_sanity_val_steps=2``) and validation every ``--val_every`` steps;
- ``accumulate_grad_batches=--accumulate``;
- the training data order: ``--loader stateful`` (torchdata's ``StatefulDataLoader``,
  whose position Lightning saves in the checkpoint: a mid-epoch resume continues where it
  stopped), ``--loader plain`` (a ``DataLoader``: a mid-epoch resume restarts the epoch's
  order from its first batch, which Lightning warns about). Both shuffle with a sampler
  seeded by ``--seed`` and the epoch (``set_epoch``), so the order survives a restart;
- ``--dropout``: dropout draws from torch's global RNG, which a Lightning checkpoint does
  not hold (a resumed run draws other masks);
- ``--version_counter``: Lightning's default ``enable_version_counter=True``: a run that
  finds ``last.ckpt`` from an earlier run writes ``last-v1.ckpt``, so ``--resume
  checkpoints/last.ckpt`` after a rerun loads the earlier run's checkpoint. Off by default
  here, so that runs sharing the folder (``bisect resume``) overwrite in place.

    python lightning_resume.py --max_steps 8 --every 2
    python lightning_resume.py --max_steps 8 --every 2 --resume checkpoints/last.ckpt
    bisect resume --at 3 --steps 8 --resume-args "--resume checkpoints/last.ckpt" -- python lightning_resume.py --every 1

CPU, a two-layer MLP on generated regression data (96 samples, batch 8: 12 batches an epoch).
"""

import argparse
import os
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*")


class EpochShuffle(Sampler):
    """A permutation of the data set drawn from (seed, epoch): Lightning calls ``set_epoch``."""

    def __init__(self, n, seed):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


def datasets(features=16):
    g = torch.Generator().manual_seed(1234)  # the data set is fixed; the seed is for the model
    w = torch.randn(features, 1, generator=g)

    def split(n):
        x = torch.randn(n, features, generator=g)
        return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))

    return split(96), split(32)


class LitRegressor(L.LightningModule):
    def __init__(self, features=16, hidden=32, lr=0.05, dropout=0.0):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    p = argparse.ArgumentParser(description="LightningModule with ModelCheckpoint and ckpt_path resume")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--max_steps", type=int, default=8)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--every", type=int, default=2, help="checkpoint every N optimizer steps")
    p.add_argument("--val_every", type=int, default=4, help="validate every N training batches")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--loader", choices=("stateful", "plain"), default="stateful")
    p.add_argument("--ckpt_dir", default="checkpoints")
    p.add_argument("--log_dir", default="logs")
    p.add_argument("--resume", default=None, metavar="PATH", help="a checkpoint to continue from")
    p.add_argument("--version_counter", action="store_true", help="ModelCheckpoint's last-v1.ckpt when last.ckpt exists")
    args = p.parse_args()

    L.seed_everything(args.seed)
    train_set, val_set = datasets()
    sampler = EpochShuffle(len(train_set), args.seed)
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        train = StatefulDataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    else:
        train = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val = DataLoader(val_set, batch_size=16)
    model = LitRegressor(dropout=args.dropout)
    ckpt = ModelCheckpoint(dirpath=args.ckpt_dir, filename="{step}", every_n_train_steps=args.every,
                           save_top_k=-1, save_last=True, enable_version_counter=args.version_counter)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        accumulate_grad_batches=args.accumulate,
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=2,
        num_sanity_val_steps=2,
        callbacks=[ckpt],
        logger=CSVLogger(args.log_dir, name="run"),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        default_root_dir=os.getcwd(),
    )
    trainer.fit(model, train, val, ckpt_path=args.resume)
    print(f"global step {trainer.global_step}, last checkpoint {ckpt.last_model_path or None}")


if __name__ == "__main__":
    main()
