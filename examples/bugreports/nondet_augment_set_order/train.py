"""Word-swap augmentation picks from list(set(words)): seeded, yet not repeatable.

Adapted from jasonwei20/eda_nlp#39: the order of list(set(...)) is not reproducible even with
the random module seeded, so the augmented sentences differ between runs.
"""

import random

import torch
from torch import nn

random.seed(1)
torch.manual_seed(1)
sentences = ["quick brown foxes jump over lazy dogs", "small green frogs sing near quiet ponds",
             "old grey wolves hunt across snowy hills", "bright red kites fly above windy beaches"] * 3
vocab = {w: i for i, w in enumerate(sorted({w for s in sentences for w in s.split()}))}


def swap_two(sentence):
    """EDA-style random swap: choose two distinct words and exchange them."""
    words = sentence.split()
    a, b = random.sample(list(set(words)), 2)  # set order depends on the string hash seed
    i, j = words.index(a), words.index(b)
    words[i], words[j] = words[j], words[i]
    return words


emb = nn.EmbeddingBag(len(vocab), 8)
head = nn.Linear(8, 2)
opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.3)
for step, s in enumerate(sentences[:8]):
    ids = torch.tensor([[vocab[w] for w in swap_two(s)]])
    opt.zero_grad()
    logits = head(emb(ids))
    loss = nn.functional.cross_entropy(logits, torch.tensor([step % 2]))
    loss.backward()
    opt.step()
