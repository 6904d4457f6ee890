"""Seeded training whose model is built before the shuffled DataLoader draws its order.

Adapted from Lightning-AI/pytorch-lightning#3335: adding code that looked unrelated changed the
training results of a seeded run. Commit "model: initialise the first layer's bias" adds one
random initialisation: it changes the initial parameters and, because it draws from the same
global generator before the loader shuffles, the data order too.
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.arange(48, dtype=torch.float32).reshape(24, 2) / 48
ys = xs.sum(1, keepdim=True)
model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
nn.init.normal_(model[0].bias, std=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=4, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
