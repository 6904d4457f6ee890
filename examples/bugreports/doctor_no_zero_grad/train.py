"""Training loop that never clears the gradients.

Adapted from IBM/aihwkit#446: the examples had no opt.zero_grad(), so every step applied the
sum of all gradients so far; the loss fell, then climbed back (maintainer confirmed and fixed).
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(64, 4)
ys = xs @ torch.tensor([[0.3], [-0.6], [0.9], [0.1]])
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(10):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients add up: nothing clears them
        opt.step()
