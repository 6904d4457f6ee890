"""A ``Trainer`` class with ``epoch``/``global_step``, a DataLoader with ``shuffle=True`` and a
seeded generator, re-seeded per epoch (``seed + epoch``, as DistributedSampler.set_epoch does).

A correct resume: the checkpoint (every step) holds the model, optimizer, scheduler, epoch
and global step; the resumed run rebuilds the epoch's shuffle from the epoch number and skips
the batches already consumed by drawing and discarding them (as skip-first-batches helpers do).

    python trainer_class.py --max-steps 8
    python trainer_class.py --max-steps 8 --resume-from state.pt
"""

import argparse
import os

import torch
from torch import nn


class Trainer:
    def __init__(self, args):
        self.args = args
        torch.manual_seed(args.seed)
        self.model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 2))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.8, nesterov=True)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=0.9)
        ds = torch.utils.data.TensorDataset(torch.randn(20, 6), torch.randint(2, (20,)))
        self.generator = torch.Generator()
        self.loader = torch.utils.data.DataLoader(ds, batch_size=5, shuffle=True, generator=self.generator)
        self.epoch = 0
        self.global_step = 0

    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "global_step": self.global_step}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.epoch, self.global_step = sd["epoch"], sd["global_step"]

    def save(self):
        torch.save(self.state_dict(), self.args.ckpt + ".part")
        os.replace(self.args.ckpt + ".part", self.args.ckpt)

    def training_step(self, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss

    def fit(self):
        per_epoch = len(self.loader)
        while self.global_step < self.args.max_steps:
            self.generator.manual_seed(self.args.seed + self.epoch)
            it = iter(self.loader)
            for _ in range(self.global_step - self.epoch * per_epoch):  # batches this epoch already trained on
                next(it)
            for batch in it:
                loss = self.training_step(batch)
                self.global_step += 1
                self.save()
                print(f"epoch {self.epoch} step {self.global_step} loss {loss.item():.4f}", flush=True)
                if self.global_step >= self.args.max_steps:
                    return
            self.epoch += 1


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--ckpt", default="state.pt")
    p.add_argument("--resume-from", default=None)
    args = p.parse_args()
    trainer = Trainer(args)
    if args.resume_from:
        trainer.load_state_dict(torch.load(args.resume_from))
    trainer.fit()
