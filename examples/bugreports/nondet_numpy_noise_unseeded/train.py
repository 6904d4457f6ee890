"""Torch is seeded; the dataset's NumPy augmentation draws from NumPy's unseeded global RNG.

Adapted from pytorch/pytorch#5059 (NumPy random numbers in a Dataset): torch.manual_seed does
not seed NumPy, so np.random in __getitem__ gives other noise in every run.
"""

import numpy as np
import torch
from torch import nn


class Jittered(torch.utils.data.Dataset):
    """Fixed points with NumPy noise added on every access (the augmentation)."""

    def __init__(self):
        self.x = np.linspace(-1, 1, 48, dtype="float32").reshape(24, 2)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noisy = self.x[i] + np.random.normal(0, 0.05, size=2).astype("float32")
        return torch.from_numpy(noisy), torch.tensor([self.x[i].sum()])


torch.manual_seed(0)
loader = torch.utils.data.DataLoader(Jittered(), batch_size=6, shuffle=True)
net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    opt.step()
