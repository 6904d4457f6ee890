"""Planted bug (update, found with overfit's help): the JSON config says
``"weight_decay": 5e1`` where ``5e-4`` was meant (the exponent's sign lost). With SGD's
coupled L2 term and lr 0.1, lr x weight_decay = 5: every step overshoots and the weights
flip sign and grow, so the loss explodes within a few steps.
Expected: ``update`` (the updates diverge), with the fixed-batch run (weight decay off)
fitting: the weight decay is named as the likely cause.

    bisect doctor -- python examples/doctor/independent/weight_decay_typo.py
"""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = json.loads('{"lr": 0.1, "momentum": 0.0, "weight_decay": 5e1, "batch_size": 32, "epochs": 4}')  # BUG


def run(cfg):
    torch.manual_seed(0)
    x = torch.randn(256, 6)
    y = (x[:, 0] - x[:, 1] > 0).long()
    dl = DataLoader(TensorDataset(x, y), batch_size=cfg["batch_size"], shuffle=True,
                    generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                          weight_decay=cfg["weight_decay"])
    for _ in range(cfg["epochs"]):
        for xb, yb in dl:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()


if __name__ == "__main__":
    run(CONFIG)
