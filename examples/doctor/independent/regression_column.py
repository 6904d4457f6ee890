"""Planted bug (contract): a regression Dataset returns scalar targets (a batch is ``[N]``)
while the model's head outputs ``[N, 1]``; a hand-written loss ``torch.mean((p - y) ** 2)``
broadcasts them to ``[N, N]``.
Expected: ``contract`` (broadcast of [N,1] against [N]).

    bisect doctor -- python examples/doctor/independent/regression_column.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Houses(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(5)
        self.x = torch.rand(120, 3, generator=g)
        self.price = self.x @ torch.tensor([3.0, 1.0, -2.0]) + 0.5

    def __len__(self):
        return 120

    def __getitem__(self, i):
        return self.x[i], self.price[i]  # a 0-d target: batches of shape [N]


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 16), nn.SiLU())
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(self.body(x))  # [N, 1]


def mse(pred, target):
    return torch.mean((pred - target) ** 2)  # BUG: [N,1] - [N] -> [N,N]


torch.manual_seed(0)
model = Regressor()
opt = torch.optim.RMSprop(model.parameters(), lr=1e-2)
for epoch in range(4):
    for xb, yb in DataLoader(Houses(), batch_size=24, shuffle=True, generator=torch.Generator().manual_seed(epoch)):
        opt.zero_grad()
        loss = mse(model(xb), yb)
        loss.backward()
        opt.step()
