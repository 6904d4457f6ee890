"""A character model trained by a minGPT-like Trainer class: a peer-corpus script.

Style imitated: minGPT (karpathy/minGPT, mingpt/trainer.py and projects/chargpt).
Written for this corpus, not copied. Patterns it exercises:

- a ``Trainer`` object that owns the loop, with ``add_callback("on_batch_end", fn)``
  callbacks and ``iter_num`` / ``loss`` attributes the callbacks read;
- a training DataLoader with ``num_workers=2``, ``pin_memory=False`` and a
  ``RandomSampler(replacement=True, num_samples=huge)`` driven by a seeded generator
  (an "infinite" loader, re-created if it ever runs out);
- evaluation from a callback: its own DataLoader (``--eval_batch_size``, no shuffling)
  under ``torch.no_grad()`` with ``model.eval()``;
- AdamW with weight-decay parameter groups chosen by module type (Linear weights decay;
  biases, LayerNorm and Embedding weights do not), gradient clipping, dropout.

    python mingpt_trainer.py --max_iters 6 --seed 3
    bisect capture -o mingpt.trace --steps 3 -- python mingpt_trainer.py --eval_batch_size 8

CPU, a few thousand parameters; the workers only slice a fixed text.
"""

import argparse
from collections import defaultdict

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

TEXT = (
    "the quick brown fox jumps over the lazy dog. "
    "pack my box with five dozen liquor jugs. "
    "how vexingly quick daft zebras jump! "
) * 12


class CharDataset(Dataset):
    """Every window of ``block_size + 1`` characters: x is the window, y the window shifted by one."""

    def __init__(self, text, block_size, chars=None):
        self.chars = chars or sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.block_size = block_size
        self.data = [self.stoi[c] for c in text]

    @property
    def vocab_size(self):
        return len(self.chars)

    def __len__(self):
        return len(self.data) - self.block_size

    def __getitem__(self, idx):
        chunk = torch.tensor(self.data[idx : idx + self.block_size + 1], dtype=torch.long)
        return chunk[:-1], chunk[1:]


class CausalBlock(nn.Module):
    def __init__(self, n_embd, n_head, block_size, pdrop):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=pdrop, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 2 * n_embd), nn.GELU(), nn.Linear(2 * n_embd, n_embd), nn.Dropout(pdrop))
        self.register_buffer("mask", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), diagonal=1))

    def forward(self, x):
        t = x.size(1)
        h = self.ln_1(x)
        a, _ = self.attn(h, h, h, attn_mask=self.mask[:t, :t], need_weights=False)
        x = x + a
        return x + self.mlp(self.ln_2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer=1, n_head=2, n_embd=24, pdrop=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(pdrop)
        self.h = nn.ModuleList(CausalBlock(n_embd, n_head, block_size, pdrop) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device).unsqueeze(0)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, lr, weight_decay, betas):
        decay, no_decay = set(), set()
        for mn, m in self.named_modules():
            for pn, _ in m.named_parameters(recurse=False):
                fpn = f"{mn}.{pn}" if mn else pn
                if pn.endswith("bias") or isinstance(m, (nn.LayerNorm, nn.Embedding)):
                    no_decay.add(fpn)
                elif pn.endswith("weight") and isinstance(m, (nn.Linear, nn.MultiheadAttention)):
                    decay.add(fpn)  # in_proj_weight of attention too
                else:
                    decay.add(fpn)
        params = dict(self.named_parameters())
        assert not decay & no_decay and decay | no_decay == params.keys()
        groups = [
            {"params": [params[n] for n in sorted(decay)], "weight_decay": weight_decay},
            {"params": [params[n] for n in sorted(no_decay)], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config = config
        self.model = model
        self.train_dataset = train_dataset
        self.callbacks = defaultdict(list)
        self.iter_num = 0
        self.loss = None

    def add_callback(self, event, fn):
        self.callbacks[event].append(fn)

    def trigger_callbacks(self, event):
        for fn in self.callbacks.get(event, []):
            fn(self)

    def run(self):
        cfg, model = self.config, self.model
        self.optimizer = model.configure_optimizers(cfg.lr, cfg.weight_decay, (0.9, 0.95))
        sampler = RandomSampler(
            self.train_dataset,
            replacement=True,
            num_samples=int(1e10),
            generator=torch.Generator().manual_seed(cfg.seed),
        )
        loader = DataLoader(
            self.train_dataset,
            sampler=sampler,
            shuffle=False,
            pin_memory=False,
            batch_size=cfg.batch_size,
            num_workers=cfg.num_workers,
        )
        model.train()
        data_iter = iter(loader)
        while True:
            try:
                x, y = next(data_iter)
            except StopIteration:
                data_iter = iter(loader)
                x, y = next(data_iter)
            _, self.loss = model(x, y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_norm_clip)
            self.optimizer.step()
            self.trigger_callbacks("on_batch_end")
            self.iter_num += 1
            if cfg.max_iters is not None and self.iter_num >= cfg.max_iters:
                break


@torch.no_grad()
def evaluate(model, dataset, batch_size, max_batches):
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=0, drop_last=False)
    total, count = 0.0, 0
    for i, (x, y) in enumerate(loader):
        if i >= max_batches:
            break
        _, loss = model(x, y)
        total += loss.item() * x.size(0)
        count += x.size(0)
    model.train()
    return total / max(count, 1)


def main():
    p = argparse.ArgumentParser(description="minGPT-style Trainer on a tiny character corpus")
    p.add_argument("--seed", type=int, default=3407)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--eval_batch_size", type=int, default=16)
    p.add_argument("--eval_batches", type=int, default=2)
    p.add_argument("--eval_interval", type=int, default=2)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--block_size", type=int, default=12)
    p.add_argument("--max_iters", type=int, default=20)
    p.add_argument("--grad_norm_clip", type=float, default=1.0)
    cfg = p.parse_args()

    torch.manual_seed(cfg.seed)
    split = int(0.8 * len(TEXT))
    train_dataset = CharDataset(TEXT[:split], cfg.block_size)
    val_dataset = CharDataset(TEXT[split:], cfg.block_size, chars=train_dataset.chars)
    model = CharGPT(train_dataset.vocab_size, cfg.block_size)
    trainer = Trainer(cfg, model, train_dataset)

    def batch_end_callback(tr):
        print(f"iter {tr.iter_num}: train loss {tr.loss.item():.9g}")
        if tr.iter_num % cfg.eval_interval == 0:
            val = evaluate(tr.model, val_dataset, cfg.eval_batch_size, cfg.eval_batches)
            print(f"iter {tr.iter_num}: val loss {val:.4f}")

    trainer.add_callback("on_batch_end", batch_end_callback)
    trainer.run()


if __name__ == "__main__":
    main()
