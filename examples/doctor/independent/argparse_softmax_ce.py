"""Planted bug (contract): an argparse script with a config dict whose model returns
``torch.softmax`` probabilities from ``forward`` (for "predict" convenience), and the training
loss is ``F.cross_entropy`` on them, which expects logits.
Expected: ``contract`` (probabilities fed to a loss that expects logits).

    bisect doctor -- python examples/doctor/independent/argparse_softmax_ce.py --epochs 2
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = {"hidden": 32, "classes": 4, "lr": 3e-3, "batch_size": 32, "seed": 11}


class MLP(nn.Module):
    def __init__(self, d_in, hidden, classes):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return torch.softmax(self.fc2(F.relu(self.fc1(x))), dim=-1)  # BUG: probabilities


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=CONFIG["lr"])
    args = ap.parse_args()
    cfg = {**CONFIG, **vars(args)}
    torch.manual_seed(cfg["seed"])
    x = torch.randn(256, 10)
    y = (x[:, :4].argmax(1)).long()
    dl = DataLoader(TensorDataset(x, y), batch_size=cfg["batch_size"], shuffle=True,
                    generator=torch.Generator().manual_seed(cfg["seed"]))
    model = MLP(10, cfg["hidden"], cfg["classes"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    for _ in range(cfg["epochs"]):
        for xb, yb in dl:
            probs = model(xb)
            loss = F.cross_entropy(probs, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
