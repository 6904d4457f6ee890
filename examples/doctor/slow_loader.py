"""Planted bug: an input-bound run. The dataset's ``__getitem__`` does slow work per sample
(a 20 ms sleep standing in for decoding from slow storage) in the main process
(``num_workers=0``), so each step waits ~160 ms for its batch and computes for ~1 ms.
Expected: ``input`` warns input-bound with the fetch and compute times per step.

    bisect doctor --check input -- python examples/doctor/slow_loader.py
"""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class SlowDataset(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(256, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(0.02)  # BUG: slow per-sample work in the main process
        return self.x[i], self.y[i]


loader = DataLoader(SlowDataset(), batch_size=8, shuffle=False)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for xb, yb in loader:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
