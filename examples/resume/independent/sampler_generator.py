"""A RandomSampler with its own ``torch.Generator`` (seeded once); the loop tracks ``epoch`` and
the batch position and, on resume, rebuilds the epoch's index list and skips the consumed part.

Planted bug: the sampler's generator state is not in the checkpoint. Each epoch's permutation
comes from where the generator was left by the previous epochs; a run resumed in epoch 1
starts a fresh generator, so it replays epoch 0's permutation instead of epoch 1's.

    python sampler_generator.py --steps 8
    python sampler_generator.py --steps 8 --load run.ckpt
"""

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--load", default=None)
p.add_argument("--save", default="run.ckpt")
args = p.parse_args()

torch.manual_seed(21)
dataset = TensorDataset(torch.randn(12, 4), torch.randn(12, 3))
BATCH = 4
sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(99))
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
opt = torch.optim.RMSprop(model.parameters(), lr=0.01)

state = {"epoch": 0, "pos": 0, "step": 0}
if args.load:
    blob = torch.load(args.load)
    model.load_state_dict(blob["model"])
    opt.load_state_dict(blob["opt"])
    state = blob["progress"]

while state["step"] < args.steps:
    order = list(sampler)  # this epoch's permutation
    loader = DataLoader(dataset, batch_size=BATCH, sampler=order[state["pos"] * BATCH:])
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["step"] += 1
        state["pos"] += 1
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "progress": dict(state)}, args.save)
        print(state, f"{loss.item():.4f}", flush=True)
        if state["step"] >= args.steps:
            break
    else:
        state["epoch"] += 1
        state["pos"] = 0
