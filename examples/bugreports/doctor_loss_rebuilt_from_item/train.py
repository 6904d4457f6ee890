"""The loss is rebuilt from a Python float, so backward() reaches no parameter.

Adapted from isayev/ReLeaSE#39: the reporter changed the loss to use .item()/numpy() values;
the maintainer explained that this detaches it from the graph, leaving nothing to propagate,
hence gradients of None and weights that never change.
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(64, 3)
ys = xs.sum(1, keepdim=True)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        value = nn.functional.mse_loss(model(x), y).item()
        loss = torch.tensor(value, requires_grad=True)  # a new leaf: no graph back to the model
        loss.backward()
        opt.step()
