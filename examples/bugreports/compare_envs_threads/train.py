"""Seeded training whose large reductions are split across CPU threads.

Adapted from pytorch/pytorch#2201: the same seeded training gave different results on
different machines; OMP_NUM_THREADS / MKL_NUM_THREADS changed the network's results. A
parallel reduction adds its partial sums in an order that depends on the thread count: the
bits differ, by rounding-sized amounts.
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(2048, 64)
ys = torch.tanh(xs @ torch.randn(64, 256))
net = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256))
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range(4):
    x, y = xs[step * 512:(step + 1) * 512], ys[step * 512:(step + 1) * 512]
    opt.zero_grad()
    loss = (net(x) - y).pow(2).sum() / y.numel()  # 131072 terms: summed in per-thread chunks
    loss.backward()
    opt.step()
    print(step, loss.item().hex())
