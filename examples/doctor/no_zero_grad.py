"""Planted bug: the gradients are never cleared (no ``zero_grad()``, no ``grad = None``), so
each step's gradient adds onto every earlier one and the update grows step after step.
The doctor's ``update`` check names it (stale ``.grad`` at each step's first backward).

    bisect doctor -- python examples/doctor/no_zero_grad.py
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
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(50):
    for xb, yb in loader:
        loss = loss_fn(model(xb), yb)
        loss.backward()  # BUG: no opt.zero_grad() anywhere in the loop
        opt.step()
