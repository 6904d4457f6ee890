"""A model with dropout whose checkpoint saves the CUDA RNG states only (the author trained on a
GPU and thought of ``torch.cuda.get_rng_state_all()``); the CPU generator is never saved.

Planted bug: on CPU (and on GPU for any CPU-side randomness) the resumed run's dropout masks
come from the re-seeded generator, not from where the uninterrupted run was.

    python rng_dropout.py --total-steps 8
    python rng_dropout.py --total-steps 8 --restore snap.pt
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--total-steps", type=int, default=8)
p.add_argument("--restore", default=None)
args = p.parse_args()

torch.manual_seed(2024)
device = "cuda" if torch.cuda.is_available() else "cpu"
data = torch.utils.data.TensorDataset(torch.randn(24, 10), torch.randint(3, (24,)))
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.total_steps)
step = 0
if args.restore:
    snap = torch.load(args.restore, weights_only=False)
    model.load_state_dict(snap["model"])
    opt.load_state_dict(snap["opt"])
    sched.load_state_dict(snap["sched"])
    step = snap["step"]
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all(snap["cuda_rng"])

batches = torch.utils.data.DataLoader(data, batch_size=6)  # sequential: batch = step % 4
while step < args.total_steps:
    for i, (x, y) in enumerate(batches):
        if i < step % len(batches):
            continue
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}, "snap.pt")
        if step >= args.total_steps:
            break
