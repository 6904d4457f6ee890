"""NumPy's global seed is set, but the synthetic data comes from `np.random.default_rng()`.

Adapted from datawhalechina/learn-world-model#12 (fixed by #13): the dataset called
`np.random.seed(seed)`, while the function that drew each image built its own generator with
`np.random.default_rng()` and no seed. A `Generator` takes fresh OS entropy and never reads the
legacy global state `np.random.seed` sets, so the data set was different in every run.
"""

import numpy as np
import torch
from torch import nn


def draw_blob(size=6):
    """One tiny 'image': a bright square at a random place, plus a little noise."""
    rng = np.random.default_rng()  # no seed: np.random.seed below has no effect on it
    img = rng.normal(0.0, 0.1, (size, size)).astype("float32")
    top, left = rng.integers(0, size - 2, 2)
    img[top:top + 2, left:left + 2] += 1.0
    return img


class Blobs(torch.utils.data.Dataset):
    def __init__(self, count, seed=0):
        np.random.seed(seed)  # the seed the author believed made the data repeatable
        self.images = torch.from_numpy(np.stack([draw_blob() for _ in range(count)]))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i].flatten()


torch.manual_seed(0)
loader = torch.utils.data.DataLoader(Blobs(40), batch_size=8, shuffle=True)
encoder = nn.Sequential(nn.Linear(36, 8), nn.Tanh())
decoder = nn.Linear(8, 36)
opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=0.01)
for epoch in range(2):
    for batch in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(decoder(encoder(batch)), batch)
        loss.backward()
        opt.step()
    print(epoch, round(loss.item(), 5))
