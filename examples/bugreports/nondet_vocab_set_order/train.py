"""Token ids come from iterating a set of strings, so they change with Python's hash seed.

Adapted from piskvorky/gensim#662: with the same seed the vectors differed between Python
sessions; the maintainer: PYTHONHASHSEED-controlled string hashing changes the iteration order
of the vocabulary, so each launch numbers the words differently.
"""

import torch
from torch import nn

corpus = ("the cat sat on the mat while the dog ran in the park and a bird sang "
          "over the quiet town as the sun set behind the hills").split()
vocab = {word: idx for idx, word in enumerate(set(corpus))}  # order of a set of str: per-process
ids = torch.tensor([vocab[w] for w in corpus])

torch.manual_seed(0)
emb = nn.Embedding(len(vocab), 6)
head = nn.Linear(6, len(vocab))
opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.5)
for step in range(8):
    ctx, nxt = ids[step * 3:step * 3 + 3], ids[step * 3 + 1:step * 3 + 4]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(head(emb(ctx)), nxt)
    loss.backward()
    opt.step()
