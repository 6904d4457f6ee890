"""A linear warmup/decay schedule whose horizon is far shorter than the run: the LR reaches 0.

Adapted from determined-ai/determined#711: the BERT fine-tuning example set the schedule's
`num_training_steps` (the number of optimizer steps the linear decay ends at) to a value far
below the steps the run takes, so the learning rate reached zero early and stayed there and
learning flatlined; the fix sets it to the run's real number of optimizer steps.
"""

import torch
from torch import nn
from torch.nn import functional as F

CONFIG = {"lr": 0.05, "epochs": 6, "batch_size": 8, "num_warmup_steps": 2, "num_training_steps": 6}

torch.manual_seed(0)
tokens = torch.randn(96, 12)
intent = (tokens[:, :4].sum(1) > 0).long() + (tokens[:, 8] > 0.7).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens, intent),
                                     batch_size=CONFIG["batch_size"], shuffle=True)
classifier = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(classifier.parameters(), lr=CONFIG["lr"])


def warmup_then_linear_decay(step, warmup=CONFIG["num_warmup_steps"], total=CONFIG["num_training_steps"]):
    """The LR factor: linear up to 1 over `warmup` steps, then linearly down to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_linear_decay)
for epoch in range(CONFIG["epochs"]):
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(classifier(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
