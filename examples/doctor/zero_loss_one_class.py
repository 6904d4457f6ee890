"""Planted bug: a classifier with ONE output class (``nn.Linear(16, 1)``) trained with
``CrossEntropyLoss``: log_softmax over one class is 0, so the loss is exactly 0 at every step
and every gradient is 0. Expected: ``update`` says the loss is 0 at every step (nothing can be
learned), not "no parameter changed although they have gradients"; ``overfit`` does not
call a loss of 0 from the start a fit.

    bisect doctor --check update,overfit -- python examples/doctor/zero_loss_one_class.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(64, 4)
y = torch.zeros(64, dtype=torch.long)  # every label is class 0: the only class the head has
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))  # BUG: one output class
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(4):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
