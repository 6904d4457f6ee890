"""The model ends in a softmax and its probabilities go into CrossEntropyLoss.

Adapted from nishnik/Deep-Semantic-Similarity-Model-PyTorch#2: CrossEntropyLoss applies
log-softmax itself, so a softmax before it squashes the logits and weakens the gradients
(the maintainer: "That was a mistake").
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(80, 6)
ys = xs[:, :3].argmax(1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3), nn.Softmax(dim=1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        loss = criterion(model(x), y)  # probabilities, not logits
        loss.backward()
        opt.step()
