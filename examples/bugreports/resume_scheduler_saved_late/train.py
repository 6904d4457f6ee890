"""The checkpoint is written after optimizer.step() but before scheduler.step().

Adapted from allenai/allennlp#1650: the trainer saved its checkpoint before updating the
learning-rate scheduler, so a restored scheduler was one period behind the weights it was
saved with.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--total", type=int, default=10)
opts = cli.parse_args()

torch.manual_seed(4)
inp = torch.randn(30, 4)
out = inp @ torch.tensor([[0.5], [-1.0], [2.0], [0.0]])
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.04)
sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)
step0 = 0
if opts.resume:
    st = torch.load(opts.resume)
    net.load_state_dict(st["net"])
    opt.load_state_dict(st["opt"])
    sched.load_state_dict(st["sched"])
    step0 = st["step"]

for step in range(step0, opts.total):
    k = (step * 6) % 30
    opt.zero_grad()
    loss = ((net(inp[k:k + 6]) - out[k:k + 6]) ** 2).mean()
    loss.backward()
    opt.step()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "step": step + 1}, "ckpt.pt")
    sched.step()  # after the save: the checkpoint's scheduler is one step behind
