"""Planted bug: a learning-rate scheduler that drives the learning rate to zero after two
steps (a LambdaLR whose factor is meant per epoch but hits 0), so parameters stop moving.
Expected: ``update`` (learning rate at zero, set by the scheduler).

    bisect doctor -- python examples/doctor/lr_zero.py
"""

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(32, 4)
y = (x[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1.0 - step / 2))  # BUG: 0 from step 2 on
loss_fn = nn.CrossEntropyLoss()

for step in range(50):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
