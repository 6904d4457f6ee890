"""Cross-entropy over a one-unit output: the loss is exactly zero whatever the weights.

Adapted from darioizzo/dcgp#86: cross-entropy on a network with a single output was always
0.0; the maintainer: with one class every prediction is correct, so this is expected.
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(64, 4)
ys = torch.zeros(64, dtype=torch.long)  # "is it class 0?" encoded as the only class
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)  # log_softmax over one logit is 0
        loss.backward()
        opt.step()
