"""Planted bug (update): a hand-written SGD loop (``p.data -= lr * p.grad``, no torch.optim)
whose loss is rebuilt from ``.item()`` as a fresh leaf tensor (to "log it as a float"): backward
runs but no parameter of the model gets a gradient, so the update never happens.
Expected: ``update`` (no gradient: the loss is detached from the model).

    bisect doctor -- python examples/doctor/independent/manual_sgd_item.py
"""

import torch

torch.manual_seed(0)
X = torch.randn(64, 5)
w_true = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0])
Y = X @ w_true + 0.1

W = torch.zeros(5, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
lr = 0.05

for it in range(40):
    idx = torch.arange(it * 8, it * 8 + 8) % 64
    pred = X[idx] @ W + b
    mse = ((pred - Y[idx]) ** 2).mean().item()
    loss = torch.tensor(mse, requires_grad=True)  # BUG: a new leaf, no graph to W and b
    loss.backward()
    with torch.no_grad():
        for p in (W, b):
            if p.grad is not None:
                p.data -= lr * p.grad
                p.grad.zero_()
