"""Planted bug: the model returns log-probabilities, and the loop turns them back into
probabilities with ``exp()`` before ``F.cross_entropy``, which expects logits (it applies
log_softmax itself). Expected: ``contract`` (probabilities fed to a loss that expects logits:
exp of log_softmax), and ``overfit`` says the loss plateaus at the floor of cross-entropy on
probabilities instead of "fits one batch".

    bisect doctor --check contract,overfit -- python examples/doctor/ce_on_exp_logprobs.py
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(64, 4)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # 3 classes
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3), nn.LogSoftmax(dim=1))
opt = torch.optim.Adam(model.parameters(), lr=0.05)

for epoch in range(4):
    for xb, yb in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(xb).exp(), yb)  # BUG: exp() gives probabilities back to a loss on logits
        loss.backward()
        opt.step()
