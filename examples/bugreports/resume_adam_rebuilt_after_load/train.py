"""The optimizer state is loaded, then a helper builds a new optimizer over the parameters.

Adapted from OpenNMT/OpenNMT-py#617: the trainer restored the optimizer from the checkpoint
and then called a set-up function that constructed a fresh one, erasing Adam's moments.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--total", type=int, default=10)
opts = cli.parse_args()


def build_optimizer(model):
    """The trainer's optimizer factory (called on every start)."""
    return torch.optim.Adam(model.parameters(), lr=0.01)


torch.manual_seed(2)
src = torch.randn(40, 6)
tgt = torch.tanh(src @ torch.randn(6, 2))
model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 2))
optim = build_optimizer(model)
begin = 0
if opts.resume:
    ck = torch.load(opts.resume)
    model.load_state_dict(ck["model"])
    optim.load_state_dict(ck["optim"])
    begin = ck["step"]
optim = build_optimizer(model)  # set-up runs after the restore and replaces the optimizer

for step in range(begin, opts.total):
    rows = torch.arange(step * 5, step * 5 + 5) % 40
    optim.zero_grad()
    loss = ((model(src[rows]) - tgt[rows]) ** 2).mean()
    loss.backward()
    optim.step()
    torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step + 1}, "ckpt.pt")
