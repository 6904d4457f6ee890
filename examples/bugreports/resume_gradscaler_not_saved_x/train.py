"""Mixed-precision training whose checkpoint forgets the GradScaler.

Adapted from huggingface/transformers#34053 (fixed by #34932, "save/reload scaler"): after a
resume the learning rate no longer followed the uninterrupted run's. The scheduler was saved
and restored; the GradScaler was not, so the restarted scaler began again at its initial scale
(65536 instead of the smaller scale the run had backed off to), the scaled gradients
overflowed, the optimizer step was skipped, and the scheduler - stepped only after a real
optimizer step, as the Trainer does - fell behind.
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--resume", default=None)
parser.add_argument("--steps", type=int, default=16)
args = parser.parse_args()

torch.manual_seed(11)
feats = torch.randn(64, 6)
goal = 3.0 * feats[:, :1] - 1.0 * feats[:, 1:2] + 2.0
net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.002, momentum=0.9)
warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: min(1.0, (n + 1) / 8))
scaler = torch.amp.GradScaler("cpu")

start = 0
if args.resume:
    saved = torch.load(args.resume)
    net.load_state_dict(saved["net"])
    opt.load_state_dict(saved["opt"])
    warm.load_state_dict(saved["sched"])
    start = saved["step"]  # the scaler's state was never written, so it starts at 65536 again

for step in range(start, args.steps):
    part = slice((step * 8) % 64, (step * 8) % 64 + 8)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        pred = net(feats[part])
    loss = nn.functional.mse_loss(pred.float(), goal[part])
    scaler.scale(loss).backward()
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() >= before:  # the optimizer really stepped (no overflow): advance the warm-up
        warm.step()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "sched": warm.state_dict(),
                "step": step + 1}, "ckpt.pt")
    print(step, "scale", before, "lr", opt.param_groups[0]["lr"], "loss", round(loss.item(), 4))
