"""Planted bug: the validation pass calls ``model.eval()`` but training never calls
``model.train()`` again, so after the first validation the model trains with dropout off and
batch norm frozen. Expected: ``modes`` (training in eval mode).

    bisect doctor --check modes -- python examples/doctor/no_train_after_eval.py
"""

import torch
from torch import nn

torch.manual_seed(0)
x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
xv, yv = torch.randn(32, 4), torch.randint(0, 2, (32,))
model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

model.train()
for step in range(40):
    i = (step * 16) % 64
    opt.zero_grad()
    loss_fn(model(x[i:i + 16]), y[i:i + 16]).backward()
    opt.step()
    if step % 2 == 1:
        model.eval()
        with torch.no_grad():
            val = loss_fn(model(xv), yv).item()
        # BUG: no model.train() here
