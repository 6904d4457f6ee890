"""Planted bug: nothing is seeded, so two runs start from different weights and batches.
Expected: ``repro`` (the runs differ first at the initial parameters).

    bisect doctor --check repro -- python examples/doctor/unseeded.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

x = torch.linspace(-1, 1, 64).reshape(16, 4)  # the data is fixed
y = (x[:, 0] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)  # BUG: unseeded shuffle
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # BUG: unseeded init
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
