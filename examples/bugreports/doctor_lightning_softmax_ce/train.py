"""LightningModule that feeds softmax probabilities to F.cross_entropy.

Adapted from MicrosoftDocs/ml-basics#48: the torch model ended with a softmax layer before
CrossEntropyLoss, which expects logits (the maintainer fixed it by removing the softmax).
"""

import lightning as L
import torch
from torch import nn


class Penguins(L.LightningModule):
    """Three-class classifier whose forward returns probabilities."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 10), nn.ReLU(), nn.Linear(10, 3))

    def forward(self, x):
        return torch.softmax(self.layers(x), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)  # probabilities into a loss that expects logits

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


L.seed_everything(0, verbose=False)
xs = torch.randn(96, 4)
ys = (xs[:, 0] > 0).long() + (xs[:, 1] > 0.5).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=8, shuffle=True)
trainer = L.Trainer(max_steps=80, logger=False, enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, accelerator="cpu", devices=1)
trainer.fit(Penguins(), loader)
