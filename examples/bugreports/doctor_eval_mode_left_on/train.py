"""A test pass after each epoch calls model.eval(); the train function never calls model.train().

Adapted from pytorch/tutorials#1624: test() switches the model to evaluation mode and the next
epoch's train() does not switch it back, so from the second epoch on dropout is off during
training.
"""

import torch
from torch import nn

torch.manual_seed(0)
xs = torch.randn(48, 4)
ys = (xs[:, 0] + xs[:, 3] > 0).long()
train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs[:32], ys[:32]), batch_size=8,
                                           shuffle=True)
test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs[32:], ys[32:]), batch_size=8)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train():
    for x, y in train_loader:  # no model.train() here
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test():
    model.eval()
    with torch.no_grad():
        return sum((model(x).argmax(1) == y).sum().item() for x, y in test_loader)


for epoch in range(15):
    train()
    test()
