"""Planted bug (memory): a Trainer keeps ``self.running = self.running + loss`` to print the
mean loss per epoch: each step's loss stays alive through the running total's autograd graph,
so memory grows every step.
Expected: ``memory`` (steady growth from retained graphs).

    bisect doctor -- python examples/doctor/independent/running_total.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, loader):
        self.model, self.loader = model, loader
        self.opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
        self.running = 0.0

    def epoch(self):
        self.running = 0.0
        for i, (xb, yb) in enumerate(self.loader):
            self.opt.zero_grad()
            loss = nn.functional.smooth_l1_loss(self.model(xb), yb)
            loss.backward()
            self.opt.step()
            self.running = self.running + loss  # BUG: keeps the graph; should be loss.item()
        return self.running / (i + 1)


torch.manual_seed(0)
x = torch.randn(512, 32)
y = torch.randn(512, 8)
dl = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
t = Trainer(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 8)), dl)
for e in range(2):
    print("epoch", e, float(t.epoch()))
