"""A correct resume whose checkpoint is written once per epoch, at the epoch's end.

Adapted from Lightning-AI/pytorch-lightning#19403 (a resume from an end-of-epoch checkpoint
ran one step too many there: bookkeeping around the epoch-end save). Here the loop is plain
torch and its epoch-end save is right: the resumed run continues the uninterrupted one.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--epochs", type=int, default=4)
opts = cli.parse_args()

torch.manual_seed(5)
xs = torch.randn(24, 3)
ys = xs.sum(1, keepdim=True).sin()
ds = torch.utils.data.TensorDataset(xs, ys)
net = nn.Sequential(nn.Linear(3, 10), nn.Tanh(), nn.Linear(10, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.5)
first_epoch = 0
if opts.resume:
    ck = torch.load(opts.resume)
    net.load_state_dict(ck["net"])
    opt.load_state_dict(ck["opt"])
    first_epoch = ck["epoch"] + 1

for epoch in range(first_epoch, opts.epochs):
    gen = torch.Generator().manual_seed(100 + epoch)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, generator=gen)  # 3 batches
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, "ckpt.pt")
    print("epoch", epoch, round(loss.item(), 5))
