"""The PyTorch recorder's parameters and optimizer state after the update.

At the optimizer's step post-hook: every parameter of the optimizer (``param``) and every
tensor in its state (``optim_state``, ``fc.weight/exp_avg``; none under sentinel detail),
begun together (a constant number of device ops: ``batched_torch``); ``scalars.lr`` per group,
and ``scalars.hyperparams`` per group: the update rule's other settings (``betas``, ``eps``,
``weight_decay``, ``momentum``, ...; plain numbers and bools only), so that a changed setting
can be named as the likely explanation of a divergence, like a changed learning rate.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from reprobisect.runners.chain import Observer, plain_settings, register_observer
from reprobisect.runners.observers.torch_common import _float

__all__ = ["ParamsObserver", "HYPERPARAMS"]

HYPERPARAMS = ("betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad", "maximize",
               "alpha", "centered", "rho", "lr_decay", "decoupled_weight_decay")
"""Param-group keys of ``torch.optim`` optimizers that change the update besides ``lr``
(Adam/AdamW, SGD, RMSprop, Adadelta, Adagrad), recorded when a group holds them."""


def _hyperparams(group: dict[str, Any]) -> dict[str, Any]:
    """One param group's ``HYPERPARAMS`` that it holds as plain values."""
    return plain_settings(group.get, HYPERPARAMS)


class ParamsObserver(Observer):
    """Parameters and optimizer state as the update left them."""

    def after_update(self, opt: torch.optim.Optimizer) -> None:
        rec = self.rec
        t0 = time.perf_counter()
        items: list[tuple[str, str, torch.Tensor]] = []
        with torch.no_grad():
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    items.append(("param", rec._param_name(p, g, i), p))
            for g, group in enumerate(opt.param_groups if not rec._sentinel else ()):  # sentinel: no optimizer state
                for i, p in enumerate(group["params"]):
                    state = opt.state.get(p)
                    if not state:
                        continue
                    name = rec._param_name(p, g, i)
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor):
                            items.append(("optim_state", f"{name}/{key}", value))
            rec._add_many(items)  # together: a constant number of device ops (batched_torch)
        rec._scalars["lr"] = [_float(group.get("lr")) for group in opt.param_groups]
        rec._scalars["hyperparams"] = [_hyperparams(group) for group in opt.param_groups]
        rec._record_s += time.perf_counter() - t0


register_observer("torch", "params", ParamsObserver, rank=90)
