"""Planted bug: a hand-written mean squared error on predictions of shape [N, 1] and labels
of shape [N]: ``pred - y`` broadcasts to [N, N], so the loss compares every prediction with
every label. Expected: ``contract`` ([N,1] against [N] broadcasting to [N,N]).

    bisect doctor --check contract -- python examples/doctor/broadcast_mse.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(64, 3)
y = x @ torch.tensor([1.0, -2.0, 0.5])  # shape [64]: scalar regression targets
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
model = nn.Linear(3, 1)  # predictions of shape [N, 1]
opt = torch.optim.SGD(model.parameters(), lr=0.05)

for epoch in range(5):
    for xb, yb in loader:
        opt.zero_grad()
        loss = ((model(xb) - yb) ** 2).mean()  # BUG: [N, 1] - [N] -> [N, N]
        loss.backward()
        opt.step()
