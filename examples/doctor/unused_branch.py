"""Planted bug: the model computes an auxiliary head whose output is never part of the loss
(the sum meant to include it was dropped), so its parameters are in the optimizer but never
receive a gradient. Expected: ``update`` (parameters that never receive a gradient).

    bisect doctor --check update -- python examples/doctor/unused_branch.py
"""

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(32, 4)
y = (x[:, 0] > 0).long()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)
        self.aux = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.body(x))
        return self.head(h), self.aux(h)


model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()

for step in range(50):
    opt.zero_grad()
    main, aux = model(x)
    loss = loss_fn(main, y)  # BUG: the auxiliary loss (loss_fn(aux, y)) was meant to be added
    loss.backward()
    opt.step()
