"""A small CNN classifier trained on generated 1x16x16 images, for reprobisect to record.

    python examples/cnn.py --seed 0 --steps 20

Deterministic on CPU for a given --seed. Uses BatchNorm (running statistics) and
gradient clipping, so a trace shows grad norms before clipping and buffers changing.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int, size: int, classes: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed + 2000)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, 1, size, size, generator=g) * 0.5
    for c in range(classes):  # one bright stripe per class
        x[y == c, 0, c % size, :] += 2.0
    return TensorDataset(x, y)


class CNN(nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, channels * 2, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(channels * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--channels", type=int, default=8)
    p.add_argument("--clip", type=float, default=1.0, help="max grad norm (0 disables clipping)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    data = make_data(args.samples, 16, 10, args.seed)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        num_workers=args.num_workers,
        drop_last=True,
    )
    model = CNN(args.channels, 10)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            step += 1
            if step % 10 == 0 or step == args.steps:
                print(f"step {step} loss {loss.item():.4f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
