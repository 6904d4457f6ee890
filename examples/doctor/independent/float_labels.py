"""Planted bug (contract): labels come from a float column (a NumPy array of 0.0/1.0/2.0,
as read from a CSV) and go straight into ``nn.CrossEntropyLoss``, which takes int64 class
indices (or per-class probabilities of the input's shape).
Expected: ``contract`` (targets of the wrong dtype).

    bisect doctor -- python examples/doctor/independent/float_labels.py
"""

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

rng = np.random.default_rng(0)
table = rng.normal(size=(120, 5)).astype(np.float32)
labels = np.digitize(table[:, 0], [-0.4, 0.4]).astype(np.float32)  # BUG: class ids as float32

torch.manual_seed(0)
ds = TensorDataset(torch.from_numpy(table), torch.from_numpy(labels))
loader = DataLoader(ds, batch_size=20, shuffle=True, generator=torch.Generator().manual_seed(0))
net = nn.Sequential(nn.Linear(5, 16), nn.LeakyReLU(), nn.Linear(16, 3))
optim = torch.optim.Adam(net.parameters(), lr=1e-2)
ce = nn.CrossEntropyLoss(label_smoothing=0.1)
for epoch in range(3):
    for feats, target in loader:
        optim.zero_grad()
        ce(net(feats), target).backward()
        optim.step()
