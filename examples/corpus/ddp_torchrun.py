"""Data-parallel training launched by torchrun: a peer-corpus script.

Style imitated: the DDP examples of the PyTorch tutorials and of countless multi-GPU
training repositories (``torchrun --nproc_per_node N train.py``): the process group is
initialized from the environment torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``), the model is wrapped in ``DistributedDataParallel``, the
data are split across ranks by a ``DistributedSampler`` with ``set_epoch`` every epoch,
and only rank 0 prints. Written for this corpus. It runs on CPU with gloo (``--backend
nccl`` and ``--device cuda`` on GPUs), seeded identically on every rank, so two runs with
the same seed are bitwise equal rank by rank.

    torchrun --standalone --nproc_per_node 2 ddp_torchrun.py --epochs 2
    bisect capture -o ddp.trace -- torchrun --standalone --nproc_per_node 2 ddp_torchrun.py
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n: int = 256, seed: int = 1234) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    y = (x @ w + 0.1 * torch.randn(n, 1, generator=g) > 0).float()
    return TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--device", default="cpu")
    p.add_argument("--crash_rank", type=int, default=-1, help="this rank raises at --crash_step (for tests)")
    p.add_argument("--crash_step", type=int, default=1)
    args = p.parse_args()

    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if args.device == "cuda" else "cpu")
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)

    data = make_data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            if rank == args.crash_rank and step == args.crash_step:
                raise RuntimeError(f"rank {rank} failed at step {step} (--crash_rank)")
            loss.backward()
            opt.step()
            if rank == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.9g}", flush=True)
            step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
