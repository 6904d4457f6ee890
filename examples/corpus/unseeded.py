"""A plain training loop that never seeds anything: a peer-corpus script.

Style imitated: the first-tutorial loop found in countless notebooks and scripts
(build a model, loop over batches, ``zero_grad`` / ``backward`` / ``step``) with no
``torch.manual_seed`` anywhere. Written for this corpus. Pattern it exercises: the data
are fixed (computed, not sampled) but the initial weights come from torch's default,
unseeded generator, so two runs differ from the parameters before the first step on.
``bisect repro`` should say exactly that: no seed was set.

    python unseeded.py --steps 5
    bisect repro -- python unseeded.py
"""

import argparse

import torch
from torch import nn


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()

    x = torch.linspace(-2, 2, 64).unsqueeze(1).repeat(1, 4) * torch.tensor([1.0, 0.5, -0.25, 2.0])
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))  # default, unseeded init
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    for step in range(args.steps):
        i = (step * 16) % len(x)
        opt.zero_grad()
        loss = loss_fn(model(x[i : i + 16]), y[i : i + 16])
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.9g}")


if __name__ == "__main__":
    main()
