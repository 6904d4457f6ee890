"""A word-level LSTM language model with a hand-written SGD update: a peer-corpus script.

Style imitated: pytorch/examples word_language_model (main.py, model.py, data.py).
Written for this corpus, not copied. Patterns it exercises:

- no ``torch.optim``: after ``loss.backward()`` and ``clip_grad_norm_`` the update is
  ``p.data.add_(p.grad, alpha=-lr)`` for every parameter, and ``model.zero_grad()``
  before the next batch;
- a tokenizing ``Corpus`` / ``Dictionary``, ``batchify`` into columns, ``get_batch``
  slices of ``--bptt`` rows (truncated backpropagation through time);
- the LSTM's hidden state carried from batch to batch and detached each time
  (``repackage_hidden``);
- ``evaluate()`` under ``torch.no_grad()`` with ``model.eval()`` at the end of each
  epoch, on its own batchified data (``--eval_batch_size``); an epoch is 2 batches here.
  (main.py also divides lr by 4 when validation stops improving; left out so that
  evaluation settings do not feed back into training.)

    python lstm_sgd.py --epochs 2 --seed 1111
    bisect capture -o lstm.trace --steps 3 -- python lstm_sgd.py --eval_batch_size 5

CPU, a vocabulary of ~20 words, two tiny LSTM layers.
"""

import argparse
import math
import time

import torch
import torch.nn as nn

TRAIN = (
    "the cat sat on the mat . the dog sat on the log . a cat saw a dog . "
    "the dog saw the cat on the mat . a bird sat on a log . the bird saw a cat . "
)
VALID = "the cat saw the bird . a dog sat on the mat . the bird sat on a log . "


class Dictionary:
    def __init__(self):
        self.word2idx, self.idx2word = {}, []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus:
    def __init__(self):
        self.dictionary = Dictionary()
        self.train = self.tokenize(TRAIN)
        self.valid = self.tokenize(VALID)

    def tokenize(self, text):
        ids = [self.dictionary.add_word(w) for line in text.split(" . ") for w in line.split() + ["<eos>"]]
        return torch.tensor(ids, dtype=torch.int64)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, inp, hidden):
        emb = self.drop(self.encoder(inp))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output))
        return torch.log_softmax(decoded.view(-1, decoded.size(-1)), dim=1), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(self.nlayers, bsz, self.nhid), w.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    """Cut the graph at the batch boundary: hidden values carry on, their history does not."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def main():
    p = argparse.ArgumentParser(description="word-level LSTM language model, hand-written SGD")
    p.add_argument("--lr", type=float, default=5.0)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--eval_batch_size", type=int, default=2)
    p.add_argument("--bptt", type=int, default=6)
    p.add_argument("--emsize", type=int, default=16)
    p.add_argument("--nhid", type=int, default=16)
    p.add_argument("--nlayers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--log-interval", type=int, default=1)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    corpus = Corpus()
    train_data = batchify(corpus.train, args.batch_size)
    val_data = batchify(corpus.valid, args.eval_batch_size)
    ntokens = len(corpus.dictionary)
    model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers, args.dropout)
    criterion = nn.NLLLoss()
    lr = args.lr

    def evaluate(data_source):
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(args.eval_batch_size)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, args.bptt):
                data, targets = get_batch(data_source, i, args.bptt)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        return total_loss / (len(data_source) - 1)

    def train(epoch):
        model.train()
        hidden = model.init_hidden(args.batch_size)
        start = time.time()
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i, args.bptt)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p_ in model.parameters():
                p_.data.add_(p_.grad, alpha=-lr)
            if batch % args.log_interval == 0:
                ms = (time.time() - start) * 1000 / args.log_interval
                print(f"| epoch {epoch} | batch {batch} | lr {lr:.2f} | ms/batch {ms:.1f} | loss {loss.item():.9g}")
                start = time.time()

    for epoch in range(1, args.epochs + 1):
        train(epoch)
        val_loss = evaluate(val_data)
        print(f"| end of epoch {epoch} | valid loss {val_loss:.4f} | valid ppl {math.exp(val_loss):.2f}")


if __name__ == "__main__":
    main()
