"""The shapes given to an element-wise loss, for the doctor's ``contract``.

The element-wise losses of ``torch.nn.functional`` (``mse_loss``, ``l1_loss``,
``smooth_l1_loss``, ``huber_loss``, ``soft_margin_loss``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits``, ``poisson_nll_loss``, ``kl_div``; the ``nn`` loss
modules call them) compare input and target element by element. Given shapes that differ,
most of them broadcast (torch only warns "Using a target size ... that is different to the
input size"): predictions ``[B]`` against targets ``[B, 1]`` (or ``[B, 1]`` against ``[B]``)
become ``[B, B]``, every prediction against every target, and the loss is wrong even for
perfect predictions. Each is wrapped: a call compares the two shapes before it runs, until
the first whose broadcast shape holds more elements than either argument, noted once per
run as ``scalars.loss_shape_broadcast`` = ``{"loss", "input", "target", "to"}`` of the step
it happened in (a loss that refuses the shapes, BCE, raises; the doctor reads its crash).
Shapes only: no tensor value is read. Two arguments that both require grad (both from the
model: a pairwise expression) are not noted. Nothing is written for a run whose shapes
agree, so its trace is unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from reprobisect.runners.chain import Observer, register_observer

__all__ = ["LossShapeObserver", "broadcast_growth"]

_ELEMENTWISE = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss", "binary_cross_entropy",
                "binary_cross_entropy_with_logits", "poisson_nll_loss", "kl_div")
"""The functional losses whose (input, target) are compared element by element."""


class LossShapeObserver(Observer):
    """The first call of an element-wise loss whose input and target broadcast to more elements."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.found: dict[str, Any] | None = None
        self.pending = False

    def install(self) -> Callable[[], None] | None:
        import torch.nn.functional as F

        for name in _ELEMENTWISE:
            orig = F.__dict__.get(name)
            if orig is not None:
                self.rec._patch(F, name, self._wrap(name, orig))
        return None

    def _wrap(self, name: str, orig: Callable) -> Callable:
        def loss(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            if self.found is None and not self.rec.done:
                hit = broadcast_growth(input, target)
                if hit is not None:
                    self.found, self.pending = {"loss": name, **hit}, True
            return orig(input, target, *args, **kwargs)

        loss.__wrapped__ = orig  # type: ignore[attr-defined]
        return loss

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        if self.pending and self.found:
            scalars["loss_shape_broadcast"] = self.found
        self.pending = False


def broadcast_growth(a: Any, b: Any) -> dict[str, list[int]] | None:
    """``{"input", "target", "to"}`` when tensors ``a`` and ``b`` broadcast to a shape with more
    elements than either of them (``[B]`` with ``[B, 1]`` -> ``[B, B]``), else None (equal
    shapes, a scalar or a ``[1]`` target, shapes that do not broadcast, two tensors that both
    require grad, anything that is not a tensor)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape == b.shape:
        return None
    if a.requires_grad and b.requires_grad:
        return None
    try:
        to = torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return None
    if math.prod(to) <= max(a.numel(), b.numel()):
        return None
    return {"input": list(a.shape), "target": list(b.shape), "to": list(to)}


register_observer("torch", "lossshapes", LossShapeObserver, rank=63)
