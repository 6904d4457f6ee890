"""Planted bug: a NaN from log(0) at a late step. A hand-written binary cross-entropy takes
``log(1 - sigmoid(z))``; one batch (samples 40..47, the 6th batch) holds inputs a thousand
times larger, the sigmoid rounds to exactly 1.0 in float32 and the log gives -inf/NaN.
Expected: ``finite`` names the loss at step 5 with samples 40..47 (batch and forward finite).

    bisect doctor -- python examples/doctor/nan_log.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(64, 4, generator=g)
y = (x[:, 0] > 0).float()
x[40:48] *= 1000.0  # a late batch of large (but finite) inputs
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        p = torch.sigmoid(model(xb)).squeeze(1)
        loss = -(yb * torch.log(p) + (1 - yb) * torch.log(1 - p)).mean()  # BUG: log(0) once p rounds to 1
        loss.backward()
        opt.step()
