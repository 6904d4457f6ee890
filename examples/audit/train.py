"""A tiny seeded training loop for the audit's tests and docs (torch on CPU, a second a run).

Knobs, all by environment so an audit config's ``env:`` can turn them:
``AUDIT_UNSEEDED=1`` — no seed: two runs differ from the first parameters on;
``AUDIT_NOISE=X`` — add unseeded uniform noise of amplitude X to every input batch (a
stand-in for rounding noise: small, different every run);
``AUDIT_LR=X`` — the learning rate (a change of training: a golden check diverges).

    python train.py --steps 3 --seed 0
"""

import argparse
import os
import random

import torch
from torch import nn


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if os.environ.get("AUDIT_UNSEEDED") != "1":
        torch.manual_seed(args.seed)
    noise = float(os.environ.get("AUDIT_NOISE", "0"))
    lr = float(os.environ.get("AUDIT_LR", "0.1"))
    jitter = random.SystemRandom()
    x = torch.linspace(-1, 1, 128).reshape(32, 4)
    y = x.sum(dim=1, keepdim=True).sin()
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(args.steps):
        xb = x[(step * 8) % 32:(step * 8) % 32 + 8]
        if noise:
            xb = xb + torch.tensor([[jitter.uniform(-noise, noise) for _ in range(4)] for _ in range(8)])
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), y[(step * 8) % 32:(step * 8) % 32 + 8])
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.9g}")


if __name__ == "__main__":
    main()
