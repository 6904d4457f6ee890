"""Planted bug: a model that cannot fit even one batch. A regression whose targets are half
negative ends in a ReLU (``nn.ReLU()`` after the last ``Linear``), so it can never output
a negative value: on one repeated batch the loss stays far from zero.
Expected: ``overfit`` warns that the model cannot fit one batch, with the loss table.

    bisect doctor --check overfit -- python examples/doctor/relu_head.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(128, 4, generator=g)
y = (2 * x[:, :1] - x[:, 1:2])  # targets of both signs
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(2))
model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1), nn.ReLU())  # BUG: ReLU on the output
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(100):
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
