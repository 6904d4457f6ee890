"""Planted bug (update): a class-based fine-tuning Trainer freezes the backbone and then
"unfreezes the head" by a name that does not exist (``classifier`` instead of ``head``),
so every parameter is frozen; the optimizer only takes trainable parameters.
Expected: ``update`` (every parameter is frozen).

    bisect doctor -- python examples/doctor/independent/frozen_trainer.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Blobs(Dataset):
    def __init__(self, n: int = 96):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "label": self.y[i]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU())
        self.head = nn.Linear(24, 2)

    def forward(self, x):
        return self.head(self.backbone(x))


class Trainer:
    def __init__(self, model, lr=1e-2, epochs=3):
        self.model = model
        self.epochs = epochs
        for p in self.model.parameters():
            p.requires_grad = False
        for name, p in self.model.named_parameters():
            if name.startswith("classifier"):  # BUG: the head is called "head"
                p.requires_grad = True
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad] or
                                     list(self.model.parameters()), lr=lr)
        self.crit = nn.CrossEntropyLoss()

    def fit(self, loader):
        self.model.train()
        for _ in range(self.epochs):
            for batch in loader:
                self.opt.zero_grad()
                out = self.model(batch["features"])
                loss = self.crit(out, batch["label"])
                loss.backward()
                self.opt.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(Blobs(), batch_size=16, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(1))
    Trainer(Net()).fit(loader)
