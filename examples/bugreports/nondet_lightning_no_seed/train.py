"""A LightningModule trained without seed_everything: the initial weights differ per run.

Adapted from allenai/tango#446: the step's results (and cache ids) differed between runs of the
same Lightning training until seed_everything was called before building the model.
"""

import lightning as L
import torch
from torch import nn


class Classifier(L.LightningModule):
    """Small MLP classifier."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.mlp(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


xs = torch.linspace(-1, 1, 60).reshape(20, 3)
ys = (xs[:, 0] > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=4)
trainer = L.Trainer(max_steps=5, logger=False, enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, accelerator="cpu", devices=1)
trainer.fit(Classifier(), loader)
