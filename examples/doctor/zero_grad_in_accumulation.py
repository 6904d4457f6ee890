"""Planted bug: gradient accumulation over 4 micro-batches with ``zero_grad()`` inside the
accumulation loop: each backward's gradient is cleared before the next, so the step uses
the last micro-batch's gradient alone (a quarter of the data, 4x the noise). The doctor's
``update`` check names it.

    bisect doctor -- python examples/doctor/zero_grad_in_accumulation.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(256, 4, generator=g)
y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))

model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
ACCUM = 4

for epoch in range(50):
    for k, (xb, yb) in enumerate(loader):
        opt.zero_grad()  # BUG: belongs after opt.step() (or before the accumulation loop), not here
        loss = loss_fn(model(xb), yb) / ACCUM
        loss.backward()
        if (k + 1) % ACCUM == 0:
            opt.step()
