"""A tiny GPT language model trained the way nanoGPT's train.py trains: a peer-corpus script.

Style imitated: nanoGPT (karpathy/nanoGPT, train.py + configurator.py). Written for this
corpus, not copied. Patterns it exercises:

- module-level config globals overridden from the command line, ``--key=value`` or
  ``--key value`` (``--compile=False`` / ``--compile 0`` turns torch.compile off);
- ``torch.compile(model)`` on by default;
- ``get_batch()`` slicing a NumPy token array at offsets drawn with ``torch.randint``
  (no DataLoader);
- ``estimate_loss()`` under ``torch.no_grad()`` with ``model.eval()`` at iteration 0 and
  every ``eval_interval``; its batches come from their own seeded generator, so
  ``--eval_iters`` / ``--eval_batch_size`` change only evaluation (in nanoGPT evaluation
  draws from the global RNG, so there ``eval_iters`` also moves the training batches);
- AdamW with weight-decay / no-decay parameter groups, a tied embedding / output weight;
- a warmup + cosine learning rate written into ``param_groups`` every iteration;
- gradient accumulation (2 micro-steps, loss scaled by 1/2) and gradient clipping.

Compiled on CPU with more than one thread, the embedding's backward adds in a
thread-dependent order: two runs differ in ``tok_emb.weight``'s gradient by ~1e-12 (which
``bisect repro`` names). ``--deterministic 1`` calls ``torch.use_deterministic_algorithms``
and makes compiled runs bitwise repeatable; the tests use it.

    python gpt_compile.py --max_iters=6 --compile=False
    bisect capture -o gpt.trace --steps 3 -- python gpt_compile.py --compile 0

CPU, ~30 k parameters. torch.compile's cache goes under ./.torchinductor (cwd) unless
TORCHINDUCTOR_CACHE_DIR says otherwise.
"""

import math
import os
import sys
import time

# torch.compile's cache in the working directory, not /tmp (set before torch is imported)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.getcwd(), ".torchinductor"))

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

# -- config (every name here can be overridden: --name=value or --name value) -----------
batch_size = 4
eval_batch_size = 4
block_size = 16
vocab_size = 64
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
bias = False
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 2
lr_decay_iters = 20
decay_lr = True
max_iters = 20
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
gradient_accumulation_steps = 2
eval_interval = 5
eval_iters = 2
log_interval = 1
seed = 1337
compile = True
deterministic = False  # torch.use_deterministic_algorithms: compiled CPU kernels add in a fixed order
# ---------------------------------------------------------------------------------------


def _override(argv):
    """Apply ``--key=value`` / ``--key value`` to the globals above (literal values)."""
    names = {k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (bool, int, float, str))}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            sys.exit(f"unexpected argument {arg!r} (use --key=value)")
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(argv):
                sys.exit(f"{arg} needs a value")
            key, raw = arg[2:], argv[i + 1]
            i += 2
        if key not in names:
            sys.exit(f"unknown config key {key!r}")
        old = globals()[key]
        if isinstance(old, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                sys.exit(f"--{key} takes True/False/1/0, not {raw!r}")
            new = raw.lower() in ("true", "1")
        else:
            new = type(old)(raw)
        print(f"config: {key} = {new}")
        globals()[key] = new


_override(sys.argv[1:])


# -- model -------------------------------------------------------------------------------
class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(n_embd, dim=2)
        q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout if self.training else 0.0)
        return self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = SelfAttention()
        self.ln2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=bias), nn.GELU(), nn.Linear(4 * n_embd, n_embd, bias=bias), nn.Dropout(dropout)
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied input / output embedding
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.drop(self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(beta1, beta2))


# -- data: a fixed token stream, as if read from train.bin / val.bin ---------------------
def _token_stream(n, rng):
    """Tokens with some structure (a noisy counter), so the loss can go down."""
    base = (np.arange(n) * 7 + rng.integers(0, 3, size=n)) % vocab_size
    return base.astype(np.uint16)


_rng = np.random.default_rng(2024)
train_data = _token_stream(4096, _rng)
val_data = _token_stream(1024, _rng)


def get_batch(split, bs=None, generator=None):
    data = train_data if split == "train" else val_data
    bs = bs or batch_size
    ix = torch.randint(len(data) - block_size, (bs,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


# -- setup -------------------------------------------------------------------------------
torch.manual_seed(seed)
if deterministic:
    torch.use_deterministic_algorithms(True)
model = TinyGPT()
optimizer = model.configure_optimizers()
if compile:
    print("compiling the model...")
    model = torch.compile(model)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1)  # the same evaluation batches every time
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            x, y = get_batch(split, eval_batch_size, gen)
            _, loss = model(x, y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


# -- training loop -----------------------------------------------------------------------
x, y = get_batch("train")
t0 = time.time()
iter_num = 0
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group["lr"] = lr

    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    for micro_step in range(gradient_accumulation_steps):
        _, loss = model(x, y)
        loss = loss / gradient_accumulation_steps
        x, y = get_batch("train")  # fetch the next batch while this one's backward runs
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    if iter_num % log_interval == 0:
        lossf = loss.item() * gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.9g}, lr {lr:.3e}, time {(time.time() - t0) * 1000:.0f}ms")
        t0 = time.time()
    iter_num += 1
    if iter_num >= max_iters:
        break
