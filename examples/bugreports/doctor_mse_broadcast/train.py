"""Regression whose predictions are squeezed to [B] while the targets stay [B, 1].

Adapted from deepset-ai/FARM#229: "Using a target size (torch.Size([32, 1])) that is different
to the input size (torch.Size([32]))"; the maintainer found the logits were squeezed and fixed
the shapes. MSELoss broadcasts to [B, B] and averages every prediction against every target.
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(96, 5)
ys = (xs[:, :2].sum(1) - xs[:, 2]).unsqueeze(1)  # [N, 1]
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x).squeeze(-1), y)  # [B] vs [B, 1] -> [B, B]
        loss.backward()
        opt.step()
