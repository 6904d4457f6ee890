"""Planted bug: ``zero_grad()`` between ``backward()`` and ``step()``: the optimizer always
sees empty gradients, so nothing trains (the loss is not detached: backward did produce
gradients). The doctor's ``update`` check names it.

    bisect doctor -- python examples/doctor/zero_grad_between.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 4, generator=g)
y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))

model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(50):
    for xb, yb in loader:
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.zero_grad()  # BUG: clears the gradients backward just computed
        opt.step()
