"""Planted bug (overfit): a regression on unnormalised targets (prices in the tens) whose
head ends in ``torch.sigmoid`` (copied from a classifier): the output can never exceed 1,
so even one repeated batch cannot be fit; the loss plateaus far from zero.
Expected: ``overfit`` (cannot fit one batch).

    bisect doctor -- python examples/doctor/independent/sigmoid_prices.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class PriceModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(5, 32)
        self.l2 = nn.Linear(32, 1)

    def forward(self, x):
        return torch.sigmoid(self.l2(torch.relu(self.l1(x)))).squeeze(-1)  # BUG: outputs in (0, 1)


torch.manual_seed(0)
x = torch.rand(200, 5)
price = 10 + 40 * x[:, 0] + 5 * x[:, 1]  # 10..55
dl = DataLoader(TensorDataset(x, price), batch_size=25, shuffle=True, generator=torch.Generator().manual_seed(0))
model = PriceModel()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(5):
    for xb, yb in dl:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
