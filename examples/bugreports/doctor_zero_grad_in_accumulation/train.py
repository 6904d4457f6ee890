"""Gradient accumulation over 4 micro-batches with zero_grad() inside the micro-batch loop.

Adapted from huggingface/accelerate#1299: with zero_grad() at the start of every iteration of
the accumulation loop, each micro-batch discards the gradients accumulated before it, so only
the last micro-batch of each update counts.
"""

import torch
from torch import nn

ACCUM = 4
torch.manual_seed(0)
xs = torch.randn(96, 4)
ys = xs.pow(2).sum(1, keepdim=True)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=4, shuffle=True)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.02)
for epoch in range(10):
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()  # inside the accumulation window: drops the earlier micro-batches
        loss = nn.functional.mse_loss(model(x), y) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
