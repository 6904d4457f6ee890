"""Planted bug: steady memory growth from retained graphs. The loop keeps every step's loss
tensor in a list (``losses.append(loss)`` instead of ``loss.item()``): each keeps its
autograd graph alive, so memory grows step after step.
Expected: ``memory`` warns of steady growth from retained graphs (the loss tensors of the
earlier steps still alive).

    bisect doctor --check memory -- python examples/doctor/losses_list.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(128, 8, generator=g)
y = (x[:, 0] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss)  # BUG: keeps the tensor and its graph; loss.item() keeps a number
    print(f"epoch {epoch}: mean loss {sum(losses).item() / len(losses):.4f}")
