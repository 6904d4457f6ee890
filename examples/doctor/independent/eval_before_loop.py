"""Planted bug (modes): the script measures the initial validation accuracy with
``model.eval()`` before training and never calls ``model.train()``: the whole training runs
with dropout off.
Expected: ``modes`` (training in eval mode).

    bisect doctor -- python examples/doctor/independent/eval_before_loop.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def build():
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 64), nn.ReLU(),
                         nn.Dropout(0.3), nn.Linear(64, 2))


torch.manual_seed(42)
xs = torch.randn(200, 12)
ys = (xs[:, 0] * xs[:, 1] > 0).long()
train = DataLoader(TensorDataset(xs[:160], ys[:160]), batch_size=20, shuffle=True,
                   generator=torch.Generator().manual_seed(0))
model = build()
print("initial val acc", accuracy(model, xs[160:], ys[160:]))  # leaves the model in eval mode
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
# BUG: no model.train() here
for epoch in range(3):
    for xb, yb in train:
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
