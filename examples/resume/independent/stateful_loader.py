"""A correct resume with torchdata's ``StatefulDataLoader`` (shuffle=True): the checkpoint holds
the loader's state with the model, optimizer, scheduler and RNG, saved after every step; the
resumed run loads them all and iterates on from where the loader was.

``--generator`` gives the loader its own seeded ``torch.Generator`` instead of the global RNG.
With torchdata 0.11 a restore mid-epoch then continues that epoch right but draws the *next*
epoch's shuffle differently from the uninterrupted run (checked without any recorder: the
same loader, state_dict after 4 of 8 batches, load_state_dict into a fresh one), so bisect
resume rightly says "data order" at the first step of the next epoch.

The first version of this script restored the RNG right after loading the checkpoint, before
the loader's iterator was created; bisect resume said "RNG: activation '2' (Dropout) differs
while its inputs agree" at the first resumed step, rightly: iter(loader) draws its base seed
from the global RNG, so restoring before it shifts every dropout mask that follows.

    python stateful_loader.py --num-steps 8
    python stateful_loader.py --num-steps 8 --restart-from sdl.ckpt
"""

import argparse

import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

p = argparse.ArgumentParser()
p.add_argument("--num-steps", type=int, default=8)
p.add_argument("--restart-from", default=None)
p.add_argument("--generator", action="store_true")
args = p.parse_args()

torch.manual_seed(5)
ds = torch.utils.data.TensorDataset(torch.randn(18, 7), torch.randn(18, 2))
loader = StatefulDataLoader(ds, batch_size=6, shuffle=True,
                            generator=torch.Generator().manual_seed(123) if args.generator else None)
model = nn.Sequential(nn.Linear(7, 14), nn.ReLU(), nn.Dropout(0.1), nn.Linear(14, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[3, 6], gamma=0.3)
done = 0
rng = None
if args.restart_from:
    ck = torch.load(args.restart_from, weights_only=False)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    loader.load_state_dict(ck["loader"])
    rng = ck["rng"]  # restored at the first batch: creating the loader's iterator draws a seed from the global RNG
    done = ck["done"]

while done < args.num_steps:
    for x, y in loader:
        if rng is not None:
            torch.set_rng_state(rng)
            rng = None
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        done += 1
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "loader": loader.state_dict(), "rng": torch.get_rng_state(), "done": done}, "sdl.ckpt")
        if done >= args.num_steps:
            break
