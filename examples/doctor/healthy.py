"""A healthy tiny training script (no bug planted): the doctor should find nothing above info.
Seeded (data, order, init, dropout), dropout and batch norm, a validation pass every two
steps under ``model.eval()`` + ``no_grad`` with ``model.train()`` after it.

    bisect doctor -- python examples/doctor/healthy.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 4, generator=g)
y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
xv = torch.randn(32, 4, generator=g)
yv = (xv[:, 0] + 0.5 * xv[:, 1] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))

model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

step = 0
for epoch in range(5):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        step += 1
        if step % 2 == 0:
            model.eval()
            with torch.no_grad():
                val = loss_fn(model(xv), yv).item()
            model.train()
