"""Planted bug (modes): a separate ``evaluate(model, loader)`` runs validation under
``torch.inference_mode()`` after every epoch but never calls ``model.eval()``: BatchNorm
normalises with the validation batch and updates its running statistics, dropout drops.
Expected: ``modes`` (evaluation in training mode).

    bisect doctor -- python examples/doctor/independent/inference_mode_val.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(1, 8, 3, padding=1), nn.BatchNorm1d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool1d(4))
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(32, 2)

    def forward(self, x):
        return self.fc(self.drop(self.features(x.unsqueeze(1)).flatten(1)))


def evaluate(model, loader):
    correct = total = 0
    with torch.inference_mode():  # BUG: no model.eval()
        for xb, yb in loader:
            correct += (model(xb).argmax(1) == yb).sum().item()
            total += len(yb)
    return correct / total


torch.manual_seed(1)
x = torch.randn(96, 16)
y = (x.mean(1) > 0).long()
train_dl = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16, shuffle=True,
                      generator=torch.Generator().manual_seed(1))
val_dl = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=16)
model = ConvNet()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
for epoch in range(4):
    model.train()
    for xb, yb in train_dl:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    print(epoch, evaluate(model, val_dl))
