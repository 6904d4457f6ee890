"""Planted bug (the guide's "random" out-of-memory): variable-size batches. Sequences are
batched by a sampler that puts the short ones together, except one batch of long ones (8
times the tokens): that step's activation memory spikes while the others stay flat.
Expected: ``memory`` reports a spike on a large input (not steady growth), naming the step
and its batch shape.

    bisect doctor --check memory -- python examples/doctor/large_batch.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class Sequences(Dataset):
    """Token sequences: 56 of length 16, 8 of length 128."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.seqs = [torch.randint(0, 50, (16 if i < 56 else 128,), generator=g) for i in range(64)]

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        s = self.seqs[i]
        return s, s[0] % 2


def collate(items):
    xs = torch.nn.utils.rnn.pad_sequence([x for x, _ in items], batch_first=True)
    return xs, torch.stack([y for _, y in items])


# batches of 8 sequences; the 4th is the long one (BUG: no cap or bucketing of lengths)
order = [list(range(k, k + 8)) for k in (0, 8, 16)] + [list(range(56, 64))] + [list(range(k, k + 8)) for k in (24, 32, 40, 48)]
loader = DataLoader(Sequences(), batch_sampler=order, collate_fn=collate)
model = nn.Sequential(nn.Embedding(50, 32), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
head = nn.Linear(32, 2)
opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
for xb, yb in loader:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(head(model(xb).mean(1)), yb)
    loss.backward()
    opt.step()
