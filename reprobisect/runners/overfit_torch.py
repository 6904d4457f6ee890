"""The guide's first move, on the user's unmodified script: overfit one fixed batch.

Installed on the PyTorch recorder when ``RecordPolicy.overfit`` is set (``bisect doctor
--check overfit``):

- the first batch a ``DataLoader`` yields for training (gradients on) is repeated at every
  later draw of that loader's dataset: ``_BaseDataLoaderIter._next_data`` (under the
  recorder's ``__next__``, so the trace records batch 0's IDs and tensors each step)
  returns it without fetching, and the epoch does not end (the recorder ends the run after
  its steps: a script whose own loop is shorter still gets them);
- dropout is off: ``torch.nn.functional``'s dropout functions (which every ``nn.Dropout*``
  module calls) and ``scaled_dot_product_attention`` run with ``p=0``;
- weight decay is off: every optimizer param group's ``weight_decay`` is set to 0 before
  each step (the value it had is reported).

Each step's scalars get ``overfit``: whether the batch was the repeated one, the dropout
calls zeroed, the weight decays zeroed, and ``accuracy`` on the fixed batch when the
model's output and an integer (or 0/1) label tensor of the batch look like
classification (computed under ``no_grad`` from the model's training forward).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["OverfitIntervention"]

_DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def _tensors(data: Any) -> list[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, dict):
        return [t for v in data.values() for t in _tensors(v)]
    if isinstance(data, (list, tuple)):
        return [t for v in data for t in _tensors(v)]
    return []


def _output(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = out.get("logits", next(iter(out.values()), None))
        return out if isinstance(out, torch.Tensor) else None
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def accuracy(out: torch.Tensor, batch: list[torch.Tensor]) -> float | None:
    """Accuracy of ``out`` on the batch's labels when it looks like classification, else None:
    ``[N,C]`` scores (C >= 2) against integer labels ``[N]`` in range; ``[N]``/``[N,1]`` scores
    against 0/1 labels (threshold 0 for logits, 0.5 for values in [0, 1])."""
    if out.dim() == 0 or not out.is_floating_point():
        return None
    n = out.shape[0]
    with torch.no_grad():
        for y in batch:
            if y.dim() != 1 or y.shape[0] != n or y.device != out.device:
                continue
            if out.dim() == 2 and out.shape[1] >= 2 and not y.is_floating_point() and y.dtype != torch.bool:
                if int(y.min()) >= 0 and int(y.max()) < out.shape[1]:
                    return float((out.argmax(1) == y).float().mean())
            if out.dim() == 1 or (out.dim() == 2 and out.shape[1] == 1):
                yy = y.float()
                if bool(((yy == 0) | (yy == 1)).all()):
                    o = out.reshape(-1).float()
                    cut = 0.5 if bool(((o >= 0) & (o <= 1)).all()) else 0.0
                    return float(((o > cut).float() == yy).float().mean())
    return None


class OverfitIntervention:
    """The fixed-batch test's changes to the run (see the module docstring)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self._first: dict[int, tuple[Any, Any, list[torch.Tensor], Any]] = {}  # id(dataset) -> (data, ids, tensors, dataset)
        self._batch: list[torch.Tensor] | None = None
        self._repeated = False
        self._dropout = 0
        self._decay: dict[str, float] = {}
        self._accuracy: float | None = None

    def install(self) -> Callable[[], None]:
        from torch.nn import functional as F
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module
        from torch.utils.data import dataloader as dl

        undo: list[Callable[[], None]] = []

        def patch(owner: Any, attr: str, new: Any) -> None:
            old = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            setattr(owner, attr, new)
            undo.append(lambda: setattr(owner, attr, old))

        for cls in (dl._SingleProcessDataLoaderIter, dl._MultiProcessingDataLoaderIter):
            if "_next_data" in cls.__dict__:
                patch(cls, "_next_data", self._next_data(cls.__dict__["_next_data"]))
        for name in _DROPOUTS:
            if hasattr(F, name):
                patch(F, name, self._no_dropout(getattr(F, name)))
        if hasattr(F, "scaled_dot_product_attention"):
            patch(F, "scaled_dot_product_attention", self._no_attention_dropout(F.scaled_dot_product_attention))
        handles = [optim_module.register_optimizer_step_pre_hook(self._no_decay),
                   nn_module.register_module_forward_hook(self._forward)]
        undo += [h.remove for h in handles]

        def remove() -> None:
            while undo:
                undo.pop()()

        return remove

    # -- the fixed batch ---------------------------------------------------------------

    def _next_data(self, orig: Callable) -> Callable:
        me = self

        def _next_data(it: Any) -> Any:
            if not torch.is_grad_enabled() or me.rec.done:
                return orig(it)
            key = id(it._dataset)
            hit = me._first.get(key)
            if hit is None:
                data = orig(it)
                q = it.__dict__.get("_reprobisect_ids")
                ids = q[0] if q else None
                me._first[key] = (data, ids, _tensors(data), it._dataset)
                if me._batch is None:
                    me._batch = me._first[key][2]
                return data
            data, ids, _, _ = hit
            q = it.__dict__.get("_reprobisect_ids")
            if q is not None:  # the recorder pops the batch's IDs after this returns
                q.clear()
                q.append(ids)
            me._repeated = True
            return data

        return _next_data

    # -- dropout and weight decay off ----------------------------------------------------

    def _no_dropout(self, orig: Callable) -> Callable:
        me = self

        def dropout(input: Any, p: float = 0.5, *args: Any, **kwargs: Any) -> Any:
            p = kwargs.pop("p", p)
            if p:
                me._dropout += 1
            return orig(input, 0.0, *args, **kwargs)

        return dropout

    def _no_attention_dropout(self, orig: Callable) -> Callable:
        me = self

        def sdpa(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("dropout_p"):
                me._dropout += 1
                kwargs["dropout_p"] = 0.0
            if len(args) > 4 and args[4]:
                me._dropout += 1
                args = (*args[:4], 0.0, *args[5:])
            return orig(*args, **kwargs)

        return sdpa

    def _no_decay(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        for g, group in enumerate(opt.param_groups):
            wd = group.get("weight_decay")
            if isinstance(wd, (int, float)) and wd:
                self._decay[f"{type(opt).__name__}.param_groups[{g}]"] = float(wd)
                group["weight_decay"] = 0.0

    # -- accuracy on the fixed batch -------------------------------------------------------

    def _forward(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self._batch is None or not module.training or not torch.is_grad_enabled():
            return
        if module is not self.rec.primary_module():
            return
        out = _output(output)
        if out is not None:
            try:
                self._accuracy = accuracy(out.detach(), self._batch)
            except Exception:  # a measure, never a failure of the user's run
                self._accuracy = None

    def step_scalars(self) -> dict[str, Any]:
        """The step's ``overfit`` scalar (and forget the step's accuracy)."""
        s = {"repeated": self._repeated, "dropout_zeroed": self._dropout, "weight_decay_zeroed": dict(self._decay),
             "accuracy": self._accuracy}
        self._accuracy = None
        return {"overfit": s}
