"""The saved step counter is already the next step, and the resume adds one again.

Adapted from Lightning-AI/pytorch-lightning#11555: global_step was incremented while the
checkpoint was written, so a restarted run believed it was one step further than it was and
skipped a batch.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--total", type=int, default=10)
opts = cli.parse_args()

torch.manual_seed(6)
xs = torch.randn(40, 5)
ys = (xs[:, 0] > xs[:, 1]).long()
net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
global_step = 0
if opts.resume:
    ck = torch.load(opts.resume)
    net.load_state_dict(ck["net"])
    opt.load_state_dict(ck["opt"])
    global_step = ck["global_step"] + 1  # "continue after the saved step": one too far

while global_step < opts.total:
    i = (global_step * 5) % 40
    opt.zero_grad()
    loss = nn.functional.cross_entropy(net(xs[i:i + 5]), ys[i:i + 5])
    loss.backward()
    opt.step()
    global_step += 1
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "global_step": global_step}, "ckpt.pt")
