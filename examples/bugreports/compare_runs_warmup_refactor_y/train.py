"""A tiny attention block trained with the "noam" learning-rate schedule.

Adapted from tensorflow/tensor2tensor#555: a commit that refactored the learning-rate code
(the warmup split out of the decay, "Updated learning rate decay and warmup") also changed the
default warmup of the "noam" schedule from linear to exponential, without saying so; old
experiments no longer replicated. The maintainers reverted "noam" to the linear warmup.
"""

import torch
from torch import nn

from lr_schedule import noam_factor

D_MODEL, WARMUP = 16, 8

torch.manual_seed(0)
seqs = torch.randn(48, 5, D_MODEL)
targets = seqs.flip(1).mean(dim=2, keepdim=True)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(D_MODEL, num_heads=2, batch_first=True)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, 1)

    def forward(self, x):
        mixed, _ = self.attn(x, x, x, need_weights=False)
        return self.head(self.norm(x + mixed))


model = Block()
opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: noam_factor(step, WARMUP, D_MODEL))
for step in range(6):
    x, y = seqs[step * 8:step * 8 + 8], targets[step * 8:step * 8 + 8]
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
