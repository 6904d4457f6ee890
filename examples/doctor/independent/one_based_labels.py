"""Planted bug (contract): labels read from a "CSV" are 1-based (1..3) while the model
has 3 outputs (classes 0..2): class 3 is out of range for CrossEntropyLoss.
Expected: ``contract`` (a class index out of range).

    bisect doctor -- python examples/doctor/independent/one_based_labels.py
"""

import io

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ROWS = "\n".join(f"{(i * 37) % 11 / 10:.2f},{(i * 53) % 7 / 7:.2f},{1 + i % 3}" for i in range(90))


class CsvRows(Dataset):
    def __init__(self, text):
        self.rows = [line.split(",") for line in io.StringIO(text).read().splitlines()]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        a, b, label = self.rows[i]
        return torch.tensor([float(a), float(b)]), int(label)  # BUG: labels are 1..3, not 0..2


torch.manual_seed(0)
loader = DataLoader(CsvRows(ROWS), batch_size=15, shuffle=False)
model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
criterion = nn.CrossEntropyLoss()
for epoch in range(3):
    for feats, labels in loader:
        opt.zero_grad(set_to_none=True)
        criterion(model(feats), labels).backward()
        opt.step()
