"""The PyTorch recorder's parameters and optimizer state after the update.

At the optimizer's step post-hook: every parameter of the optimizer (``param``) and every
tensor in its state (``optim_state``, ``fc.weight/exp_avg``; none under sentinel detail),
begun together (a constant number of device ops: ``batched_torch``); ``scalars.lr`` per group.
"""

from __future__ import annotations

import time

import torch

from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.torch_common import _float

__all__ = ["ParamsObserver"]


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
        rec._record_s += time.perf_counter() - t0


register_observer("torch", "params", ParamsObserver, rank=90)
