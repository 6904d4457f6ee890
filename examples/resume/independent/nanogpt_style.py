"""nanoGPT-style loop: ``iter_num`` in the checkpoint, ``--init_from resume``, a checkpoint every
``--ckpt_interval`` iterations (saved at the top of the iteration, after an evaluation), the
learning rate computed from the iteration number (warmup + cosine), batches sampled with
``torch.randint`` from the global RNG.

Planted bug (the one nanoGPT-style loops have): the checkpoint holds no RNG state, and the
resumed run re-seeds, so ``get_batch`` draws the batches of the run's beginning again.

    python nanogpt_style.py --max_iters 8                       # from scratch
    python nanogpt_style.py --max_iters 8 --init_from resume    # from out/ckpt.pt
"""

import argparse
import math
import os

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--max_iters", type=int, default=8)
p.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
p.add_argument("--out_dir", default="out")
p.add_argument("--ckpt_interval", type=int, default=2)
cfg = p.parse_args()

block_size, batch_size, vocab, n_embd = 8, 4, 32, 16
learning_rate, min_lr, warmup_iters, lr_decay_iters = 1e-2, 1e-3, 2, 12

torch.manual_seed(1337)
train_data = torch.randint(vocab, (400,), generator=torch.Generator().manual_seed(5))
val_data = torch.randint(vocab, (100,), generator=torch.Generator().manual_seed(6))


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.lm_head = nn.Linear(n_embd, vocab)

    def forward(self, idx, targets=None):
        h = self.wte(idx)
        h = h + self.mlp(h)
        logits = self.lm_head(h)
        loss = None if targets is None else nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        return logits, loss


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


iter_num = 0
best_val_loss = 1e9
model = TinyLM()
if cfg.init_from == "resume":
    checkpoint = torch.load(os.path.join(cfg.out_dir, "ckpt.pt"), map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
if cfg.init_from == "resume":
    optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.stack([model(*get_batch("val"))[1] for _ in range(2)])
    model.train()
    return losses.mean().item()


X, Y = get_batch("train")
while True:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if iter_num % cfg.ckpt_interval == 0 and iter_num > 0:
        val_loss = estimate_loss()
        best_val_loss = min(best_val_loss, val_loss)
        os.makedirs(cfg.out_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                    "best_val_loss": best_val_loss}, os.path.join(cfg.out_dir, "ckpt.pt"))
    if iter_num >= cfg.max_iters:
        break
    _, loss = model(X, Y)
    X, Y = get_batch("train")  # prefetch the next batch, as nanoGPT does
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
    iter_num += 1
