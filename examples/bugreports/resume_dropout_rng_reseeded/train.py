"""Dropout draws from the global torch RNG; a restart seeds it again instead of restoring it.

Adapted from unit8co/darts#2463: model, optimizer and progress were restored, but the random
state was re-created from the original seed on every start, so the random draws after a
resume (dropout masks here) replay the start of the run instead of continuing it.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--total", type=int, default=10)
opts = cli.parse_args()

torch.manual_seed(3)
xs = torch.randn(32, 4)
ys = (xs[:, :1] - xs[:, 1:2]).sigmoid()
net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.4), nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
at = 0
if opts.resume:
    blob = torch.load(opts.resume)
    net.load_state_dict(blob["net"])
    opt.load_state_dict(blob["opt"])
    at = blob["step"]
torch.manual_seed(3)  # "make the run reproducible" on every start: the resumed run replays the first masks

for step in range(at, opts.total):
    i = (step * 4) % 32
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(net(xs[i:i + 4]), ys[i:i + 4])
    loss.backward()
    opt.step()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step + 1}, "ckpt.pt")
