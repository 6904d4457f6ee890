"""Planted bug: the validation pass runs under ``torch.no_grad()`` but the model stays in
training mode (no ``model.eval()``), so dropout is active and batch norm updates its running
statistics during validation. Expected: ``modes`` (evaluation in training mode).

    bisect doctor --check modes -- python examples/doctor/eval_train_mode.py
"""

import torch
from torch import nn

torch.manual_seed(0)
x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
xv, yv = torch.randn(32, 4), torch.randint(0, 2, (32,))
model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for step in range(40):
    i = (step * 16) % 64
    opt.zero_grad()
    loss_fn(model(x[i:i + 16]), y[i:i + 16]).backward()
    opt.step()
    if step % 2 == 1:
        with torch.no_grad():  # BUG: no model.eval() before (nor model.train() after)
            val = loss_fn(model(xv), yv).item()
