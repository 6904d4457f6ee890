"""Planted bug (finite): a bag-of-words regressor takes ``torch.log(counts)`` inside its
forward (meant: ``log1p``). Counts are >= 1 in the first batches, but sample 37 has a zero
count, so the forward produces -inf and NaN at step 4 (samples 32..39), with every batch
finite.
Expected: ``finite`` (the forward is the first non-finite tensor, at step 4, samples 32..39).

    bisect doctor -- python examples/doctor/independent/log_counts.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class CountModel(nn.Module):
    def __init__(self, vocab=20):
        super().__init__()
        self.proj = nn.Linear(vocab, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, counts):
        feats = torch.log(counts)  # BUG: log(0) = -inf for an absent word; log1p was meant
        return self.out(torch.tanh(self.proj(feats)))


torch.manual_seed(0)
counts = torch.randint(1, 6, (96, 20)).float()
counts[37, 4] = 0.0  # one document without word 4
target = counts[:, :3].sum(1, keepdim=True) / 10
loader = DataLoader(TensorDataset(counts, target), batch_size=8, shuffle=False)
model = CountModel()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for xb, yb in loader:
    opt.zero_grad()
    nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
