"""Healthy (no bug planted), in a different style: a ``fit()``/``evaluate()`` pair with a
dataclass config, AdamW with weight decay, gradient-norm clipping, a OneCycle-style
cosine schedule stepped per batch, BatchNorm and dropout, a validation pass after every
few batches under ``model.eval()`` + ``torch.no_grad()`` and ``model.train()`` after it,
and the mean training loss kept as a float.
Expected: nothing above ``info`` (exit 0).

    bisect doctor -- python examples/doctor/independent/healthy_clip_sched.py
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    lr: float = 3e-3
    weight_decay: float = 1e-2
    clip: float = 1.0
    epochs: int = 6
    batch_size: int = 16
    eval_every: int = 3


def make_model():
    return nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))


@torch.no_grad()
def evaluate(model, loader):
    was = model.training
    model.eval()
    tot = n = 0.0
    for xb, yb in loader:
        tot += nn.functional.cross_entropy(model(xb), yb, reduction="sum").item()
        n += len(yb)
    model.train(was)
    return tot / n


def fit(cfg: Cfg):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(160, 6, generator=g)
    y = torch.bucketize(x[:, 0] + x[:, 1], torch.tensor([-0.5, 0.5]))
    train = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=cfg.batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(8), num_workers=0)
    val = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr * 3, total_steps=cfg.epochs * len(train))
    step = 0
    for epoch in range(cfg.epochs):
        model.train()
        running = 0.0
        for xb, yb in train:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            sched.step()
            running += loss.item()
            step += 1
            if step % cfg.eval_every == 0:
                evaluate(model, val)
        print(f"epoch {epoch} train {running / len(train):.3f} val {evaluate(model, val):.3f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    fit(Cfg())
