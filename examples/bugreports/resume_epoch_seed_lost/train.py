"""Each epoch's order is a permutation seeded with seed + epoch; the resume rebuilds epoch 0's.

Adapted from modelscope/ms-swift#10050: on resume the rebuilt sampler lost the epoch, so a
run resumed inside epoch 1 skipped the right number of batches but of epoch 0's permutation,
training again on samples it had already seen.
"""

import argparse

import torch
from torch import nn

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--total", type=int, default=12)
opts = cli.parse_args()

SEED, BATCH, N = 7, 8, 32
PER_EPOCH = N // BATCH
torch.manual_seed(SEED)
data = torch.randn(N, 3)
target = data.norm(dim=1, keepdim=True)
net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.05)


def epoch_order(epoch):
    """The epoch's permutation (seeded, so reproducible)."""
    return torch.randperm(N, generator=torch.Generator().manual_seed(SEED + epoch))


done, epoch = 0, 0
if opts.resume:
    ck = torch.load(opts.resume)
    net.load_state_dict(ck["net"])
    opt.load_state_dict(ck["opt"])
    done = ck["step"]  # the epoch is not restored: the loop below starts at epoch 0's permutation

while done < opts.total:
    order = epoch_order(epoch)
    for b in range(done % PER_EPOCH, PER_EPOCH):
        rows = order[b * BATCH:(b + 1) * BATCH]
        opt.zero_grad()
        loss = ((net(data[rows]) - target[rows]) ** 2).mean()
        loss.backward()
        opt.step()
        done += 1
        torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": done}, "ckpt.pt")
        if done >= opts.total:
            break
    epoch += 1
