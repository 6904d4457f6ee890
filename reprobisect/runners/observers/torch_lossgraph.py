"""What enters a loss on logits, for the doctor's ``contract`` (and the loss floor of ``overfit``).

``torch.nn.functional.cross_entropy`` (which ``nn.CrossEntropyLoss`` calls) and
``binary_cross_entropy_with_logits`` (``nn.BCEWithLogitsLoss``) expect logits. Both are
wrapped: the first call of the first step that builds a graph (a training call, not an
evaluation under ``no_grad``) measures the tensor it is given, once:
``scalars.loss_input`` = ``{"loss", "shape", "classes", "min", "max", "row_sum_dev",
"made_by"}``: its range, for a cross-entropy the largest distance of a row's sum over the
class dimension from 1 (0 for rows that already sum to 1: probabilities), and the autograd
op that produced it (``SoftmaxBackward0``, ``SigmoidBackward0``, ``ExpBackward0`` of
``LogSoftmaxBackward0``: probabilities in any spelling). Measured on the tensor itself, so a
hand-written normalisation (``x / x.sum(1, keepdim=True)``) counts too. The call is made
exactly as the script made it; a measurement that fails says nothing. It is written only
when it can matter (inputs in [0, 1], a probability op, one class): an ordinary run on
logits keeps the trace it had before this observer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from reprobisect.runners.chain import Observer, register_observer

__all__ = ["LossInputObserver"]

_WRAPPED = ("cross_entropy", "binary_cross_entropy_with_logits")
"""The functional losses on logits whose input is measured."""


class LossInputObserver(Observer):
    """The first training call's input of a loss on logits: range, row sums, producing op."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.measured: dict[str, Any] | None = None
        self.pending = False

    def install(self) -> Callable[[], None] | None:
        import torch.nn.functional as F

        for name in _WRAPPED:
            orig = F.__dict__.get(name)
            if orig is not None:
                self.rec._patch(F, name, self._wrap(name, orig))
        return None

    def _wrap(self, name: str, orig: Callable) -> Callable:
        def loss(input: Any, *args: Any, **kwargs: Any) -> Any:
            if self.measured is None and not self.rec.done and isinstance(input, torch.Tensor) \
                    and input.requires_grad and torch.is_grad_enabled():
                self.measured = _measure(name, input)
                self.pending = True
            return orig(input, *args, **kwargs)

        loss.__wrapped__ = orig  # type: ignore[attr-defined]
        return loss

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        if self.pending and self.measured and _suspect(self.measured):
            scalars["loss_input"] = self.measured
        self.pending = False


_PROBABILITY_OPS = ("SoftmaxBackward0", "SigmoidBackward0", "ExpBackward0")


def _suspect(m: dict[str, Any]) -> bool:
    """Whether the measured input can be what the doctor looks for (probabilities, one class):
    only then is it written, so the trace of an ordinary run on logits is unchanged."""
    in_unit = m.get("min", -1.0) >= 0.0 and m.get("max", 2.0) <= 1.0
    made = str(m.get("made_by") or "")
    return in_unit or made.startswith(_PROBABILITY_OPS) or m.get("classes") == 1


def _made_by(t: torch.Tensor) -> str | None:
    """The autograd op that produced ``t`` ("ExpBackward0 of LogSoftmaxBackward0" for an
    ``exp`` of log-probabilities), or None."""
    fn = t.grad_fn
    if fn is None:
        return None
    name = type(fn).__name__
    if name == "ExpBackward0" and fn.next_functions and fn.next_functions[0][0] is not None:
        return f"{name} of {type(fn.next_functions[0][0]).__name__}"
    return name


def _measure(name: str, x: torch.Tensor) -> dict[str, Any]:
    """Range, row sums (cross-entropy: over dim 1, the classes) and producing op of ``x``; {} on failure."""
    try:
        with torch.no_grad():
            d = x.detach().float()
            out: dict[str, Any] = {"loss": name, "shape": list(x.shape), "made_by": _made_by(x),
                                   "min": float(d.min()), "max": float(d.max())}
            if name == "cross_entropy" and d.dim() >= 2:
                out["classes"] = int(d.shape[1])
                out["row_sum_dev"] = float((d.sum(dim=1) - 1).abs().max())
            return out
    except Exception:
        return {}


register_observer("torch", "lossgraph", LossInputObserver, rank=62)

# the shapes given to element-wise losses are the contract's too (registered on import, with its rank)
from reprobisect.runners.observers import torch_lossshapes  # noqa: E402,F401
