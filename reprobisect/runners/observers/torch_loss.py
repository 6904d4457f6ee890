"""The PyTorch recorder's losses: ``loss`` records, and the GradScaler.

``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped: the tensors
backward starts from are the loss, one record per backward as the script computed it
(``loss``, ``loss#1``, ... with accumulation). With a GradScaler that is the scaled loss;
``scalars.scaler_scale`` says by how much, and a step whose inf/NaN gradients made the
scaler skip ``optimizer.step()`` is ended here (``scalars.scaler_skipped``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from reprobisect.runners.chain import Observer, register_observer

__all__ = ["LossObserver"]


class LossObserver(Observer):
    """The loss each backward starts from; the GradScaler's scale and skipped steps."""

    def install(self) -> Callable[[], None] | None:
        self._wrap_backward()
        self._wrap_scaler()
        return None

    def _wrap_backward(self) -> None:
        import torch.autograd as autograd

        orig = autograd.__dict__["backward"]
        rec = self.rec

        def backward(tensors, *args, **kwargs):
            if not rec.done:
                rec._add_losses(tensors)
                ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
                if ts and all(isinstance(t, torch.Tensor) and t.grad_fn is None for t in ts):
                    rec.graphless_backwards += 1
            out = orig(tensors, *args, **kwargs)
            if not rec.done:
                rec._after_backward()
            return out

        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        rec._patch(autograd, "backward", backward)

    def _wrap_scaler(self) -> None:
        try:
            from torch.amp import grad_scaler
        except ImportError:
            return
        cls = grad_scaler.GradScaler
        orig = cls.__dict__["scale"]
        rec = self.rec

        def scale(scaler, outputs):
            rec._scaler = weakref.ref(scaler)
            return orig(scaler, outputs)

        orig_step = cls.__dict__["step"]

        def step(scaler, optimizer, *args, **kwargs):
            # a scaler that finds inf/NaN gradients skips optimizer.step(): no optimizer
            # hook fires, so the step is ended here, one trace step per training iteration
            rec._scaler = weakref.ref(scaler)
            before = rec._opt_posts
            out = orig_step(scaler, optimizer, *args, **kwargs)
            if not rec.done and rec._opt_posts == before and rec._entries:
                rec._skipped_step(optimizer)
            return out

        rec._patch(cls, "scale", scale)
        rec._patch(cls, "step", step)

    def losses(self, ts: list[torch.Tensor]) -> None:
        """The tensors a backward starts from: one ``loss`` record each."""
        for t in ts:
            self.rec._add("loss", "loss", t)

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        rec = self.rec
        scaler = rec._scaler() if rec._scaler is not None else None
        if scaler is not None and scaler.is_enabled():
            try:
                scalars["scaler_scale"] = float(scaler.get_scale())
            except Exception:
                pass


register_observer("torch", "loss", LossObserver, rank=30)
