"""Training that reads its data from a file git ignores: a peer-corpus script.

Style imitated: the many small projects whose ``train.py`` loads a prepared array
(``data/train.npy``, written by a separate ``prepare`` / ``make_data`` step and listed in
``.gitignore``, so a fresh checkout of any commit has no data). Written for this corpus.
Pattern it exercises: ``bisect runs`` checks out each commit into its own worktree, where
``data/`` does not exist; ``bisect runs --link data -- python train.py`` brings the
user's copy in.

    python make_data.py           # writes data/train.npy (ignored by git)
    python train.py --steps 5
    bisect runs --good C1 --bad C2 --link data -- python train.py

The learning rate is a module constant (``LR``) on purpose: a commit that edits it is a
commit that changes training. CPU, a linear model with momentum SGD.
"""

import argparse

import numpy as np
import torch
from torch import nn

LR = 0.05
DATA = "data/train.npy"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=16)
    args = p.parse_args()

    table = np.load(DATA)  # (n, features + 1): inputs, then the target
    x = torch.from_numpy(table[:, :-1].astype(np.float32))
    y = torch.from_numpy(table[:, -1:].astype(np.float32))

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(x.shape[1], 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    order = torch.Generator().manual_seed(args.seed)
    step = 0
    while step < args.steps:
        perm = torch.randperm(len(x), generator=order)
        for i in range(0, len(x) - args.batch_size + 1, args.batch_size):
            idx = perm[i : i + args.batch_size]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            print(f"step {step}: loss {loss.item():.9g}")
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
