"""Each DataLoader worker seeds NumPy from its process id, so augmentation changes per run.

Adapted from pytorch/pytorch#3880: when worker re-seeding was designed, the maintainers chose
the worker id over the PID "to preserve determinism when the user sets torch.manual_seed";
seeding from os.getpid() (a common hand-written worker_init_fn) gives every run other noise.
"""

import os

import numpy as np
import torch
from torch import nn


def seed_worker(worker_id):
    """Hand-written worker seeding: distinct per worker, but different in every run."""
    np.random.seed(os.getpid() % (2 ** 32))


class Scaled(torch.utils.data.Dataset):
    """Points scaled by a random factor drawn in the worker."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        base = torch.tensor([i / 24.0, 1.0 - i / 24.0])
        return base * float(np.random.uniform(0.8, 1.2)), base.sum(0, keepdim=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(Scaled(), batch_size=4, shuffle=True, num_workers=2,
                                         worker_init_fn=seed_worker)
    net = nn.Sequential(nn.Linear(2, 6), nn.ReLU(), nn.Linear(6, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
