"""Planted bug: the model's output is ``.detach()``-ed before the loss, so ``loss.backward()``
raises at the first step ("element 0 of tensors does not require grad").
Expected: ``update`` (backward refused the loss: no graph to the model).

    bisect doctor -- python examples/doctor/detach_backward.py
"""

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(32, 4)
y = torch.randn(32, 1)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(20):
    opt.zero_grad()
    pred = model(x).detach()  # BUG: cuts the graph
    loss = ((pred - y) ** 2).mean()
    loss.backward()
    opt.step()
