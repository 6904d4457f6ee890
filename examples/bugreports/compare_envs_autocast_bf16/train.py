"""Training whose forward runs under CPU autocast when --dtype bfloat16 is given.

Adapted from karpathy/nanoGPT#492: the reporter changed only the dtype setting (autocast
bfloat16 vs float32) and the losses changed. Under autocast the linear layers compute in
bfloat16 (8 bits of mantissa), so the two settings differ from the first forward pass.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
opts = cli.parse_args()

torch.manual_seed(0)
xs = torch.randn(48, 8)
ys = xs[:, :2].prod(1, keepdim=True)
net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
for step in range(6):
    x, y = xs[step * 8:(step + 1) * 8], ys[step * 8:(step + 1) * 8]
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=opts.dtype == "bfloat16"):
        pred = net(x)
    loss = nn.functional.mse_loss(pred.float(), y)
    loss.backward()
    opt.step()
