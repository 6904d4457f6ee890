"""Shards are loaded by a thread pool and trained on in the order the threads finish.

Adapted from keras-team/keras#2280 (the thread's summary of how to get repeatable runs: seed
everything and avoid parallelism, whose order varies between runs). Every seed is set; the
batch order follows which loader thread finishes first, which the OS scheduler decides.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import torch
from torch import nn

torch.manual_seed(0)
shards = [torch.randn(6, 3) for _ in range(8)]


def load(i):
    """Read shard i (the sleep stands for file I/O whose latency varies)."""
    time.sleep(int.from_bytes(os.urandom(1), "little") / 255 * 0.02)
    return shards[i]


net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.05)
with ThreadPoolExecutor(max_workers=4) as pool:
    for fut in as_completed([pool.submit(load, i) for i in range(len(shards))]):
        x = fut.result()
        opt.zero_grad()
        loss = (net(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        opt.step()
