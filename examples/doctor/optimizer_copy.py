"""Planted bug: the optimizer is built on a deep copy of the model, so it steps parameters the
training forward never uses, and the model that computes the loss never changes.
Expected: ``update`` (parameters missing from the optimizer).

    bisect doctor -- python examples/doctor/optimizer_copy.py
"""

import copy

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(32, 4)
y = (x[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
shadow = copy.deepcopy(model)
opt = torch.optim.SGD(shadow.parameters(), lr=0.1)  # BUG: should be model.parameters()
loss_fn = nn.CrossEntropyLoss()

for step in range(50):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
