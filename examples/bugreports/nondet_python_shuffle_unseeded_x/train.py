"""Torch is seeded, but the batch order comes from Python's own, unseeded `random.shuffle`.

Adapted from speechbrain/speechbrain#135: with `sort=random` the data preparation shuffled the
example ids with `random.shuffle`; the recipe seeded torch but never Python's `random`, so
every run trained on another order (the merged fix removed the unseeded shuffle).
"""

import random

import torch
from torch import nn

torch.manual_seed(1234)

# "utterances" of varying length, keyed by id and first sorted by duration
lengths = {f"utt{i:02d}": 3 + (i * 7) % 11 for i in range(30)}
order = sorted(lengths, key=lengths.get)
feats = {u: torch.randn(6) * (lengths[u] / 10) for u in order}
labels = {u: torch.tensor(lengths[u] % 3) for u in order}
random.shuffle(order)  # Python's global RNG: nothing seeds it

model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for start in range(0, len(order), 5):
    batch = order[start:start + 5]
    x = torch.stack([feats[u] for u in batch])
    y = torch.stack([labels[u] for u in batch])
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(start // 5, round(loss.item(), 4))
