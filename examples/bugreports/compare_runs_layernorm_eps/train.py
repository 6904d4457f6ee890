"""A small encoder block with a LayerNorm; a later commit changes the norm's epsilon.

Adapted from keras-team/keras-hub#665: BERT's encoder layers were built with the default
layer-norm epsilon (1e-5) instead of BERT's 1e-12; the reviewed fix passes the right epsilon.
"""

import torch
from torch import nn

EPS = 1e-5

torch.manual_seed(0)
tokens = torch.randn(32, 6)
target = torch.randn(32, 1)
block = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16, eps=EPS), nn.GELU(), nn.Linear(16, 1))
opt = torch.optim.Adam(block.parameters(), lr=1e-2)
for step in range(6):
    x, y = tokens[step * 4:step * 4 + 4], target[step * 4:step * 4 + 4]
    opt.zero_grad()
    loss = nn.functional.mse_loss(block(x), y)
    loss.backward()
    opt.step()
