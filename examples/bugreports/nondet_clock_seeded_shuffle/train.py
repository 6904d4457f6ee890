"""The training order is shuffled by Python's random module seeded from the clock.

Adapted from jessamynsmith/talkbackbot#1: random.seed() was relied on for the order, and a
seed taken from the current time makes every run draw another sequence.
"""

import random
import time

import torch
from torch import nn

torch.manual_seed(0)
feats = torch.randn(36, 4)
labels = (feats.sum(1) > 0).long()
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

order = list(range(36))
random.seed(time.time_ns())  # "a fresh shuffle each run"
random.shuffle(order)
for step in range(6):
    rows = torch.tensor(order[step * 6:(step + 1) * 6])
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(feats[rows]), labels[rows])
    loss.backward()
    opt.step()
