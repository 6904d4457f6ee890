"""Resume that restores the model and the step but builds a new Adam optimizer.

Planted bug: ``optimizer.state_dict()`` is saved but never loaded: the resumed run's Adam
starts with zero moments and step count 0 (the bias correction of a first step).

    python fresh_optimizer.py --iters 8
    python fresh_optimizer.py --iters 8 --from-checkpoint ck/state.pt
"""

import argparse
import os

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=8)
p.add_argument("--from-checkpoint", default=None)
args = p.parse_args()

torch.manual_seed(8)
xs = torch.randn(40, 3)
ys = (xs @ torch.tensor([[1.0], [-2.0], [0.5]])) + 0.1 * torch.randn(40, 1)
model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
first = 0
if args.from_checkpoint:
    saved = torch.load(args.from_checkpoint)
    model.load_state_dict(saved["model"])
    first = saved["iteration"]
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)  # new, whatever was saved
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=5)
for it in range(first, args.iters):
    x, y = next(iter(torch.utils.data.DataLoader(loader.dataset, batch_size=5,
                                                 sampler=range((it * 5) % 40, (it * 5) % 40 + 5))))
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    os.makedirs("ck", exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": it + 1}, "ck/state.pt")
    print(it, loss.item(), flush=True)
