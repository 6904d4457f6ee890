"""Planted bug: a detached graph through a ``.item()`` round trip. The loss is rebuilt from a
Python float, so backward runs but no parameter gets a gradient and nothing trains.
Expected: ``update`` (no parameter received a gradient: a detached graph).

    bisect doctor -- python examples/doctor/detached.py
"""

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(32, 4)
y = (x[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for step in range(50):
    opt.zero_grad()
    value = loss_fn(model(x), y).item()
    loss = torch.tensor(value, requires_grad=True)  # BUG: the graph to the model is gone
    loss.backward()
    opt.step()
