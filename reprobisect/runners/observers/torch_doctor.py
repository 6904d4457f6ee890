"""The doctor's extras on the PyTorch recorder: what ``bisect doctor`` reads from a step.

- Layer modes (doctor's ``modes``): ``scalars.eval_mode_layers`` (and ``eval_mode_dropout``)
  when the model trains with dropout/batch-norm layers in eval mode.
- The loss expression (doctor's ``contract``, step 0): ``scalars.loss_broadcast`` (an op
  that broadcast ``[N,1]`` against ``[N]`` to ``[N,N]``) and ``loss_probabilities`` (a loss
  on logits fed a softmax or sigmoid), read from the autograd graph of the first loss.
- ``bisect doctor``'s switches (``runners.doctor_torch``: overfit, memory) when the policy
  asks for them; their ``step_observers`` add to the step's scalars.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.torch_common import _MODE_NAMES, _is_norm, _mode_layers

__all__ = ["DoctorObserver"]


class DoctorObserver(Observer):
    """Layer modes, the loss expression, and ``bisect doctor``'s switches."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.graph_read = False
        self.mode_cache: dict[int, list[tuple[str, torch.nn.Module]]] = {}

    def install(self) -> Callable[[], None] | None:
        rec = self.rec
        if rec.policy.overfit or rec.policy.memory:  # bisect doctor's switches (their own modules)
            from reprobisect.runners import doctor_torch

            return doctor_torch.install(rec)
        return None

    def training_root(self, module: torch.nn.Module, args: tuple) -> None:
        rec = self.rec
        if id(module) == rec._primary and "eval_mode_layers" not in rec._scalars:
            layers = self.mode_cache.get(id(module))
            if layers is None:
                layers = self.mode_cache[id(module)] = _mode_layers(module)  # once per model: modules rarely change
            names = [n for n, m in layers if not m.training]
            if names:  # the model trains with dropout/batch norm in eval mode (doctor's ``modes``)
                rec._scalars["eval_mode_layers"] = names[:_MODE_NAMES]
                drop = [n for n, m in layers if not m.training and not _is_norm(m)]
                if drop:
                    rec._scalars["eval_mode_dropout"] = drop[:_MODE_NAMES]

    def losses(self, ts: list[torch.Tensor]) -> None:
        rec = self.rec
        if ts and rec.step == 0 and not self.graph_read:
            # [N,1] against [N] made [N,N], probabilities into a loss on logits (doctor's ``contract``)
            self.graph_read = True
            rec._scalars.update(_loss_graph(ts[0]))

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        for observe in self.rec.__dict__.get("step_observers", ()):  # bisect doctor's (runners.doctor_torch)
            scalars.update(observe())


_GRAPH_NODES = 64
"""Autograd nodes ``_loss_broadcast`` looks at, from the loss back (the loss expression)."""


def _shape_of(fn: Any, i: int) -> tuple[int, ...] | None:
    """The shape of output ``i`` of autograd node ``fn`` (None when torch does not say)."""
    try:
        if type(fn).__name__ == "AccumulateGrad":
            return tuple(fn.variable.shape)
        return tuple(fn._input_metadata[i].shape)
    except Exception:
        return None


def _builtin_broadcast(node: Any) -> dict[str, Any] | None:
    """A regression loss (mse/l1/smooth_l1/huber) given ``[N, 1]`` predictions and ``[N]``
    targets: it broadcasts them to ``[N, N]`` (an expand of the ``[N, 1]`` side; torch only warns)."""
    name = type(node).__name__
    if name == "ExpandBackward0":  # F.mse_loss & co. broadcast their arguments with an expand first
        src, out = tuple(node._saved_self_sym_sizes), _shape_of(node, 0)
        if len(src) == 2 and src[1] == 1 and src[0] > 1 and out == (src[0], src[0]):
            return {"op": name, "from": [src[0], 1], "to": [src[0], src[0]]}
        return None
    if name not in ("MseLossBackward0", "L1LossBackward0", "SmoothL1LossBackward0", "HuberLossBackward0"):
        return None
    a, b = tuple(node._saved_self.shape), tuple(node._saved_target.shape)
    for p, t in ((a, b), (b, a)):
        if len(p) == 2 and p[1] == 1 and p[0] > 1 and t == (p[0],):
            return {"op": type(node).__name__, "from": [p[0], 1], "to": [p[0], p[0]]}
    return None


_PROBABILITIES = {  # loss op on logits -> the op producing probabilities that must not feed it
    "LogSoftmaxBackward0": ("SoftmaxBackward0", "cross_entropy/log_softmax of a softmax"),
    "NllLossBackward0": ("SoftmaxBackward0", "nll_loss of a softmax (it expects log-probabilities)"),
    "BinaryCrossEntropyWithLogitsBackward0": ("SigmoidBackward0", "binary_cross_entropy_with_logits of a sigmoid"),
}


def _broadcast_at(node: Any, parents: list[tuple[Any, tuple[int, ...] | None]]) -> dict[str, Any] | None:
    """``node`` broadcasting an ``[N, 1]`` input against an ``[N]`` one (or a constant) to ``[N, N]``."""
    hit = _builtin_broadcast(node)
    if hit:
        return hit
    out = _shape_of(node, 0)
    if out is not None and len(out) == 2 and out[0] == out[1] > 1 and len(parents) == 2:
        n = out[0]
        shapes = [sh for _, sh in parents]
        if (n, 1) in shapes and all(sh in (None, (n, 1), (n,)) for sh in shapes):
            return {"op": type(node).__name__, "from": [n, 1], "to": [n, n]}
    return None


def _loss_graph(loss: torch.Tensor) -> dict[str, Any]:
    """What the loss expression (the autograd graph from ``loss`` back, at most
    ``_GRAPH_NODES`` nodes) shows: ``loss_broadcast`` (``{"op", "from", "to"}``: an ``[N, 1]``
    tensor broadcast against an ``[N]`` one or a constant, the labels, into ``[N, N]``;
    pairwise ``[N, 1]`` against ``[1, N]`` is not reported) and ``loss_probabilities``
    (``{"op", "after", "what"}``: a loss on logits fed a softmax's or sigmoid's output).
    Never raises: an unreadable graph says nothing."""
    out: dict[str, Any] = {}
    try:
        todo, seen = [loss.grad_fn], 0
        while todo and seen < _GRAPH_NODES:
            node = todo.pop(0)
            seen += 1
            if node is None:
                continue
            parents = [(f, _shape_of(f, i)) if f is not None else (None, None) for f, i in node.next_functions]
            if "loss_broadcast" not in out:
                hit = _broadcast_at(node, parents)
                if hit:
                    out["loss_broadcast"] = hit
            rule = _PROBABILITIES.get(type(node).__name__)
            if rule and "loss_probabilities" not in out and parents and type(parents[0][0]).__name__ == rule[0]:
                out["loss_probabilities"] = {"op": type(node).__name__, "after": rule[0], "what": rule[1]}
            todo += [f for f, _ in parents if f is not None]
    except Exception:
        pass
    return out


register_observer("torch", "doctor", DoctorObserver, rank=60)

# the gradient-clearing observer is the doctor's too (registered on import, with its rank)
from reprobisect.runners.observers import torch_clearing  # noqa: E402,F401
