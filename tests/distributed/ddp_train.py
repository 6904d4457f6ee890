"""A tiny DDP/FSDP2 training script for tests/test_distributed.py (run under torchrun, gloo, CPU).

MODE: plain | noise (rank 1, or env NOISE_RANK, adds unseeded NumPy noise) | sampler_seed (DistributedSampler
seeded by rank) | bn (BatchNorm, broadcast_buffers=False, rank-dependent data) |
no_set_epoch | sampler_rank0 (every rank's sampler says rank 0) | fsdp (FSDP2 fully_shard) | fsdp_shard (rank 1 changes
its shard of a weight after fully_shard) | allreduce (hand-written gradient all_reduce) |
user_hook (the script registers its own DDP comm hook).
DUMP=PATH saves each rank's final state dict to PATH-RANK.pt.
"""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x, y = torch.randn(16, 8), torch.randn(16, 1)
ds = TensorDataset(x, y)
sampler = DistributedSampler(ds, num_replicas=world, rank=0 if mode == "sampler_rank0" else rank, shuffle=True,
                             seed=rank if mode == "sampler_seed" else 0)
dl = DataLoader(ds, batch_size=4, sampler=sampler)
layers = [torch.nn.Linear(8, 16)] + ([torch.nn.BatchNorm1d(16)] if mode == "bn" else []) + [torch.nn.ReLU(), torch.nn.Linear(16, 1)]
model = torch.nn.Sequential(*layers)
if mode in ("fsdp", "fsdp_shard"):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    net = model
    if mode == "fsdp_shard" and rank == 1:  # rank 1 changes its own shard of the first weight
        with torch.no_grad():
            model[0].weight.to_local().add_(1e-3)
elif mode == "allreduce":
    net = model
else:
    net = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=(mode != "bn"))
    if mode == "user_hook":  # the user's own comm hook (here: torch's reference all-reduce hook)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        net.register_comm_hook(None, default_hooks.allreduce_hook)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(3):
    if mode not in ("no_set_epoch", "sampler_seed"):
        sampler.set_epoch(epoch)
    for xb, yb in dl:
        if mode == "noise" and rank == int(os.environ.get("NOISE_RANK", "1")):
            xb = xb + torch.from_numpy(np.random.randn(*xb.shape).astype("float32")) * 1e-3
        if mode == "bn":
            xb = xb + rank
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        if mode == "allreduce":
            works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
            for p, w in zip(model.parameters(), works):
                w.wait()
                p.grad.mul_(1.0 / world)
        opt.step()
if os.environ.get("DUMP"):
    sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in model.state_dict().items()}
    torch.save(sd, f"{os.environ['DUMP']}-{rank}.pt")
dist.destroy_process_group()
