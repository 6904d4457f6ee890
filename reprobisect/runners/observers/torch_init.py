"""The PyTorch recorder's initial parameters: ``init`` records (step 0).

The parameters before the first update, at the first training forward of each root, named
like ``param``; those of an optimizer no training forward showed (a model only ever called
compiled) at its first step. First in chain order: an unseeded or changed initialization is
the first divergence, named as such. ``scalars.frozen_params``: those with
``requires_grad=False``.
"""

from __future__ import annotations

from typing import Any

import torch

from reprobisect.runners.chain import Observer, register_observer

__all__ = ["InitObserver"]


class InitObserver(Observer):
    """Each parameter's value before any update, once."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.roots: set[int] = set()
        self.params: set[int] = set()  # parameters whose initial value is recorded (step 0)

    def training_root(self, module: torch.nn.Module, args: tuple) -> None:
        rec = self.rec
        if rec.step != 0:
            return
        for key, (ref, _) in list(rec._roots.items()):
            m = ref()
            if key in self.roots or m is None:
                continue
            self.roots.add(key)
            for path, p in m.named_parameters():
                self._add(p, rec._param_names.get(id(p)) or path)

    def before_grads(self, opt: torch.optim.Optimizer) -> None:
        """Initial values of ``opt``'s parameters no training forward showed (a model only
        ever called compiled runs no forward hook): still before the first update here."""
        rec = self.rec
        if rec.step != 0 or rec._opt_posts:
            return
        with torch.no_grad():
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    self._add(p, rec._param_name(p, g, i))

    def _add(self, p: torch.Tensor, name: str) -> None:
        """``p``'s value before any update, once (never from the fingerprint cache)."""
        if id(p) not in self.params:
            self.params.add(id(p))
            self.rec._add("init", name, p, fresh=True)
            if not p.requires_grad:  # frozen on purpose or not: doctor's update check tells them apart
                self.rec._scalars.setdefault("frozen_params", []).append(name)


register_observer("torch", "init", InitObserver, rank=80)
