"""A tiny training script with its own checkpoint/resume code, and flags that plant resume bugs.

    python train.py --total 6 --ckpt ckpt.pt                 # trains, saves after every step
    python train.py --total 6 --ckpt ckpt.pt --resume ckpt.pt  # continues from the checkpoint
    ... --bug scheduler|dataloader|rng|scaler|step|optimizer|model   # what the checkpoint forgets
    ... --stateful                                           # data order from a StatefulDataLoader

The model has dropout (RNG), SGD with momentum (optimizer state), a StepLR (scheduler) and a
CPU GradScaler whose scale grows every 2 steps. The data order of a plain DataLoader is
derived from the step counter (epoch = step // batches per epoch, one seeded permutation per
epoch); with --stateful it is the StatefulDataLoader's own state. Used by bisect resume's
tests and docs/resume.md.
"""

import argparse
import os

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--total", type=int, default=6)
p.add_argument("--ckpt", default="ckpt.pt")
p.add_argument("--resume", default=None)
p.add_argument("--bug", default="none",
               choices=["none", "scheduler", "dataloader", "rng", "scaler", "step", "optimizer", "model"])
p.add_argument("--stateful", action="store_true")
p.add_argument("--width", type=int, default=16, help="hidden width (the benchmark uses a wider model)")
a = p.parse_args()

torch.manual_seed(0)
data = torch.randn(24, 8)
target = torch.randn(24, 1)
ds = torch.utils.data.TensorDataset(data, target)
model = nn.Sequential(nn.Linear(8, a.width), nn.ReLU(), nn.Dropout(0.3), nn.Linear(a.width, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
scaler = torch.amp.GradScaler("cpu", growth_interval=2)
BS = 4
PER_EPOCH = len(ds) // BS


class EpochSampler(torch.utils.data.Sampler):
    """The epoch's seeded permutation from batch ``skip`` on."""

    def __init__(self, epoch, skip):
        self.perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(100 + epoch)).tolist()[skip * BS:]

    def __iter__(self):
        return iter(self.perm)

    def __len__(self):
        return len(self.perm)


step = 0
loader_state = None
rng_state = None
if a.resume and os.path.exists(a.resume):
    ck = torch.load(a.resume, weights_only=False)
    if a.bug != "model":
        model.load_state_dict(ck["model"])
    if a.bug != "optimizer":
        opt.load_state_dict(ck["opt"])
    if a.bug != "scheduler":
        sched.load_state_dict(ck["sched"])
    if a.bug != "scaler":
        scaler.load_state_dict(ck["scaler"])
    if a.bug != "rng":
        # restored at the first batch, after the DataLoader's iterator drew its base seed
        # from the global RNG (restoring it here, before, is itself a resume bug: RNG)
        rng_state = ck["rng"]
    step = ck["step"] + (1 if a.bug == "step" else 0)
    loader_state = ck.get("loader")
elif a.resume:
    raise SystemExit(f"no checkpoint at {a.resume}")


def batches():
    """(batch) in training order, starting where ``step`` says (or the StatefulDataLoader's state)."""
    global loader
    if a.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(ds, batch_size=BS, shuffle=True, generator=torch.Generator().manual_seed(7))
        if loader_state is not None and a.bug != "dataloader":
            loader.load_state_dict(loader_state)
        while True:
            yield from loader
    epoch, skip = divmod(step, PER_EPOCH)
    if a.bug == "dataloader" and a.resume:
        skip = 0  # the classic bug: the epoch starts over
    while True:
        loader = torch.utils.data.DataLoader(ds, batch_size=BS, sampler=EpochSampler(epoch, skip))
        yield from loader
        epoch, skip = epoch + 1, 0


loader = None
for x, y in batches():
    if step >= a.total:
        break
    if rng_state is not None:
        torch.set_rng_state(rng_state)
        rng_state = None
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
    step += 1
    ck = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
          "scaler": scaler.state_dict(), "rng": torch.get_rng_state(), "step": step}
    if a.stateful:
        ck["loader"] = loader.state_dict()
    torch.save(ck, a.ckpt + ".tmp")
    os.replace(a.ckpt + ".tmp", a.ckpt)
    print(f"step {step} loss {loss.item():.6f}", flush=True)
