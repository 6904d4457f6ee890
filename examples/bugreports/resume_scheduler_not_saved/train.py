"""A resume that restores the weights and the optimizer but rebuilds the StepLR from scratch.

Adapted from D-X-Y/NAS-Bench-201#19: the training script predated torch's schedulers, so the
checkpoint never held one; after a restart the step decay started counting again from zero.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--total", type=int, default=10)
opts = cli.parse_args()

torch.manual_seed(1)
feats = torch.randn(48, 5)
labels = feats[:, :2].sum(1, keepdim=True)
net = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
decay = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

first = 0
if opts.resume:
    saved = torch.load(opts.resume)
    net.load_state_dict(saved["net"])
    opt.load_state_dict(saved["opt"])
    first = saved["step"]  # the scheduler was never saved, so it starts over

for step in range(first, opts.total):
    lo = (step * 8) % 48
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(feats[lo:lo + 8]), labels[lo:lo + 8])
    loss.backward()
    opt.step()
    decay.step()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step + 1}, "ckpt.pt")
    print(step, round(loss.item(), 5))
