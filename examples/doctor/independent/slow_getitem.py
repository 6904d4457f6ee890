"""Planted bug (input): a Dataset that "decodes" every sample in ``__getitem__`` with a
blocking call (``time.sleep``, standing in for a slow disk read or JPEG decode) and a
DataLoader with ``num_workers=0``: each step waits far longer for data than it computes.
Expected: ``input`` (input-bound, with the fetch and compute figures).

    bisect doctor -- python examples/doctor/independent/slow_getitem.py
"""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.015)  # BUG: slow per-sample decoding on the main process
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 8, 8, generator=g)
        return img, int(img.mean() > 0.5)


torch.manual_seed(0)
torch.set_num_threads(1)  # a tiny model: one thread (no thread wake-ups between the slow fetches)
loader = DataLoader(SlowImages(), batch_size=8, shuffle=True, num_workers=0,
                    generator=torch.Generator().manual_seed(0))
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for img, label in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(img), label).backward()
        opt.step()
