"""Planted bug: the model ends in a softmax and its probabilities go into CrossEntropyLoss,
which expects logits (it applies log_softmax itself). Expected: ``contract`` (probabilities
fed to a loss that expects logits).

    bisect doctor --check contract -- python examples/doctor/softmax_ce.py
"""

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(64, 4)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # 3 classes
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3), nn.Softmax(dim=1))  # BUG: softmax before the loss
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for step in range(50):
    i = (step * 16) % 64
    opt.zero_grad()
    loss = loss_fn(model(x[i:i + 16]), y[i:i + 16])
    loss.backward()
    opt.step()
