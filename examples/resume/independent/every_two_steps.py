"""A correct resume that checkpoints every 2 steps only (``--save-every 2``) and resumes from the
last save: model, optimizer, scheduler, RNG, step. Interrupted after an odd number of steps,
the last checkpoint is one step older, and the resumed run redoes that step: still the same
run, continued bitwise from its checkpoint.

    python every_two_steps.py --steps 8
    python every_two_steps.py --steps 8 --resume checkpoints/last.pt
"""

import argparse
import os

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--save-every", type=int, default=2)
p.add_argument("--resume", default=None)
args = p.parse_args()

torch.manual_seed(77)
data = torch.randn(64, 8)
labels = (data.sum(1) > 0).long()
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.2), nn.Linear(16, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
step = 0
if args.resume:
    ck = torch.load(args.resume, weights_only=False)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    torch.set_rng_state(ck["rng"])
    step = ck["step"]

while step < args.steps:
    idx = torch.arange(step * 8, step * 8 + 8) % 64  # the data position follows the step
    loss = nn.functional.cross_entropy(model(data[idx]), labels[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    step += 1
    if step % args.save_every == 0:
        os.makedirs("checkpoints", exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "rng": torch.get_rng_state(), "step": step}, "checkpoints/last.pt")
    print(step, float(loss), flush=True)
