"""Planted bug: the model ends in a sigmoid and its outputs (each in [0, 1]) go into
``nn.CrossEntropyLoss``, which expects logits. Expected: ``contract`` (probabilities fed to a
loss that expects logits: a sigmoid before cross_entropy).

    bisect doctor --check contract -- python examples/doctor/ce_on_sigmoid.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(64, 4)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # 3 classes
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3), nn.Sigmoid())  # BUG: sigmoid before the loss
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(4):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
