"""A loop whose checkpoint is written between ``backward()`` and ``optimizer.step()``, with the
step counter already counting the step in progress.

Planted bug: the saved parameters and optimizer state are those *before* this step's update
(one step stale) while the saved counter says the step is done; the resumed run skips the
lost update and goes on with the next batch.

    python save_before_step.py -n 8
    python save_before_step.py -n 8 --continue
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("-n", type=int, default=8)
p.add_argument("--continue", dest="cont", action="store_true")
p.add_argument("--file", default="latest.pth")
args = p.parse_args()

torch.manual_seed(4)
X, Y = torch.randn(32, 6), torch.randn(32, 1)
net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.03, momentum=0.9)
start = 0
if args.cont:
    ck = torch.load(args.file)
    net.load_state_dict(ck["net"])
    opt.load_state_dict(ck["opt"])
    start = ck["done"]

ds = torch.utils.data.TensorDataset(X, Y)
i = start
while i < args.n:
    offset = (i % 8) * 4  # 8 batches of 4 an epoch, in order
    for x, y in torch.utils.data.DataLoader(ds, batch_size=4, sampler=range(offset, 32)):
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "done": i + 1}, args.file)  # before the update
        opt.step()
        print(i, loss.item(), flush=True)
        i += 1
        if i >= args.n:
            break
