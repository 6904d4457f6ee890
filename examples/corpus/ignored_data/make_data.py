"""Write data/train.npy for train.py (the file is ignored by git: see .gitignore)."""

import os

import numpy as np

rng = np.random.default_rng(7)
x = rng.normal(size=(128, 6))
y = np.sin(x[:, :1]) + 0.5 * x[:, 1:2] + 0.05 * rng.normal(size=(128, 1))
os.makedirs("data", exist_ok=True)
np.save("data/train.npy", np.concatenate([x, y], axis=1).astype(np.float32))
print("wrote data/train.npy", (128, 7))
