"""zero_grad() placed between backward() and step(): every update uses zero gradients.

Adapted from pytorch/tutorials#2799: in the thread the maintainer explains that zero_grad may
go anywhere except between loss.backward() and optimizer.step(); here it sits exactly there.
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(64, 5)
ys = (xs[:, 0] * xs[:, 1] > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Linear(12, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(10):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.zero_grad()  # clears what backward just computed
        opt.step()
