"""The EMA's saved state is loaded, then replaced by a fresh EMA built from the live weights.

Adapted from ai2cm/ace#819 (fixing #668/#682/#483): the trainer restored the EMA tracker from
the checkpoint and afterwards built a new one from the model's current parameters with its
update count at zero, so after a restart the averaged weights used for validation jumped to
the raw weights. Training itself (the optimized weights) continues exactly; only the EMA, and
every validation number computed with it, does not.
"""

import argparse
import copy

import torch
from torch import nn


class ShadowAverage:
    """An exponential moving average of a module's weights, warmed up by its update count."""

    def __init__(self, module):
        self.avg = copy.deepcopy(module).eval()
        self.updates = 0

    def update(self, module):
        self.updates += 1
        rate = min(0.99, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            for mine, live in zip(self.avg.parameters(), module.parameters()):
                mine.mul_(rate).add_(live, alpha=1 - rate)

    def state_dict(self):
        return {"weights": self.avg.state_dict(), "updates": self.updates}

    def load_state_dict(self, state):
        self.avg.load_state_dict(state["weights"])
        self.updates = state["updates"]


parser = argparse.ArgumentParser()
parser.add_argument("--resume", default=None)
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

torch.manual_seed(3)
inputs = torch.randn(60, 4)
targets = torch.sin(inputs.sum(1, keepdim=True))
held_x, held_y = torch.randn(12, 4), torch.randn(12, 1)
model = nn.Sequential(nn.Linear(4, 10), nn.Tanh(), nn.Linear(10, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.02)
shadow = ShadowAverage(model)

begin = 0
if args.resume:
    state = torch.load(args.resume)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    shadow.load_state_dict(state["shadow"])
    begin = state["step"]
    shadow = ShadowAverage(model)  # set-up code that runs after the restore: the EMA starts over

for step in range(begin, args.steps):
    rows = slice((step * 6) % 60, (step * 6) % 60 + 6)
    model.train()
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(inputs[rows]), targets[rows])
    loss.backward()
    opt.step()
    shadow.update(model)
    with torch.no_grad():
        val = nn.functional.mse_loss(shadow.avg(held_x), held_y)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "shadow": shadow.state_dict(), "step": step + 1}, "ckpt.pt")
    print(step, round(loss.item(), 5), "ema val", round(val.item(), 5))
