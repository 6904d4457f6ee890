"""Planted bug: ``F.binary_cross_entropy_with_logits`` is given ``torch.sigmoid(logits)``, so
the sigmoid is applied twice and the gradients shrink. Expected: ``contract`` (probabilities
fed to a loss that expects logits).

    bisect doctor --check contract -- python examples/doctor/sigmoid_bce_logits.py
"""

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
x = torch.randn(64, 4)
y = (x[:, 0] > 0).float().unsqueeze(1)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(50):
    i = (step * 16) % 64
    opt.zero_grad()
    loss = F.binary_cross_entropy_with_logits(torch.sigmoid(model(x[i:i + 16])), y[i:i + 16])  # BUG: sigmoid twice
    loss.backward()
    opt.step()
