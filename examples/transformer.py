"""A tiny transformer language model on generated token sequences, for reprobisect to record.

    python examples/transformer.py --seed 0 --steps 20 [--bf16]

Deterministic on CPU for a given --seed. --bf16 runs the forward pass under bfloat16
autocast on CPU (parameters stay float32), the mixed-precision path a trace records
with its dtype. The learning rate follows a warm-up schedule (LambdaLR).
"""

from __future__ import annotations

import argparse
import contextlib
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int, seq: int, vocab: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed + 3000)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab  # learnable arithmetic sequences
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:n]
        for block in self.blocks:
            x = block(x, self.mask[:n, :n])
        return self.head(self.ln_f(x))


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the forward pass")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (deterministic runs need CUBLAS_WORKSPACE_CONFIG on CUDA)")
    return p.parse_args(argv)


def build(args: argparse.Namespace):
    """Model, optimizer, scheduler and loader for ``args`` (seeded)."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    data = make_data(args.samples, args.seq, args.vocab, args.seed)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        num_workers=args.num_workers,
        drop_last=True,
    )
    model = TinyTransformer(args.vocab, args.d_model, args.heads, args.layers, args.seq, args.dropout).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    return model, opt, sched, loader


def main(argv=None) -> None:
    args = parse(argv)
    model, opt, sched, loader = build(args)
    loss_fn = nn.CrossEntropyLoss()
    autocast = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    step = 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(args.device), y.to(args.device)
            opt.zero_grad()
            with autocast:
                logits = model(x)
            loss = loss_fn(logits.float().reshape(-1, args.vocab), y.reshape(-1))
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 10 == 0 or step == args.steps:
                print(f"step {step} loss {loss.item():.4f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
