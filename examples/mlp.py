"""A small MLP classifier trained on generated data: an example reprobisect records as is.

    python examples/mlp.py --seed 0 --steps 20
    bisect capture -o mlp.trace --steps 3 -- python examples/mlp.py --seed 0

Deterministic on CPU for a given --seed (data, init, shuffling and dropout all derive
from it). --num-workers > 0 loads batches in worker processes with the same order.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int, features: int, classes: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed + 1000)
    centers = torch.randn(classes, features, generator=g) * 2
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, features, generator=g)
    return TensorDataset(x, y)


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int, layers: int, dropout: float) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        width = features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def build(args: argparse.Namespace):
    """Model, optimizer, loader and loss for ``args`` (seeded)."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    data = make_data(args.samples, args.features, args.classes, args.seed)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        num_workers=args.num_workers,
        drop_last=True,
    )
    model = MLP(args.features, args.hidden, args.classes, args.layers, args.dropout).to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    return model, opt, loader, nn.CrossEntropyLoss()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (deterministic runs need CUBLAS_WORKSPACE_CONFIG on CUDA)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    model, opt, loader, loss_fn = build(args)
    step = 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(args.device), y.to(args.device)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if step % 10 == 0 or step == args.steps:
                print(f"step {step} loss {loss.item():.4f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
