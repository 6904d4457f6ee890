"""The PyTorch recorder's forward records: ``input``, ``activation``, ``output``.

From the global module forward pre-hooks and hooks (``runners.torch`` keeps the call stack
and tells training from evaluation): every training call of the model (each micro-batch)
and a step's first root call record their tensor arguments as ``input``; the model's own
result is ``output``; every other module's result is an ``activation`` named by its path
(``#k`` for its k-th call in the step, ``[i]`` for the i-th tensor of a structured result),
carrying its inputs' fingerprints. None under sentinel detail; at most
``policy.max_records_per_step`` a step (the rest counted).
"""

from __future__ import annotations

from typing import Any

import torch

from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.torch_common import _fingerprintable, _tensors

__all__ = ["ForwardObserver"]


class ForwardObserver(Observer):
    """Inputs, activations and outputs of training forwards."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.reset_step()

    def reset_step(self) -> None:
        self.inputs_done = False
        self.cur_call = ""

    def training_root(self, module: torch.nn.Module, args: tuple) -> None:
        """The model's every call (each micro-batch of an accumulation), or a step's first root call."""
        rec = self.rec
        if id(module) in rec._primary_mods or not self.inputs_done:
            self.inputs_done = True
            ts = _tensors(args)
            for i, t in enumerate(ts):
                rec._add("input", "input" if len(ts) == 1 else f"input[{i}]", t)

    def module_inputs(self, args: tuple) -> list[fpt.Pending]:
        """The fingerprints of a module call's tensor arguments (its activations carry them)."""
        begin = self.rec._begin
        return [begin(t) for t in _tensors(args) if _fingerprintable(t)]

    def module_output(self, module: torch.nn.Module, kwargs: dict, output: Any, inputs: list | None,
                      top: bool) -> None:
        """A training call's result: ``output`` of the model, else ``activation``."""
        rec = self.rec
        is_model = top and id(module) == rec._primary
        name = rec._module_name(module)
        if top and not inputs and kwargs:
            inputs = self.module_inputs(kwargs)
        ts = _tensors(output)
        cls = type(module).__name__
        for i, t in enumerate(ts):
            if is_model:
                base = "output" if len(ts) == 1 else f"output[{i}]"
                rec._add("output", base, t, module=cls, inputs=inputs)
            else:
                self._activation(name, i, len(ts), t, cls, inputs)

    def _activation(self, name: str, i: int, n: int, t: torch.Tensor, cls: str, inputs: list | None) -> None:
        rec = self.rec
        if i == 0:
            k = rec._occ.get(("activation", name), 0)
            rec._occ[("activation", name)] = k + 1
            self.cur_call = name if k == 0 else f"{name}#{k}"
        full = self.cur_call if n == 1 else f"{self.cur_call}[{i}]"
        if not _fingerprintable(t) or not rec._room():
            return
        rec._push("activation", full, t, module=cls, inputs=inputs)


register_observer("torch", "forward", ForwardObserver, rank=85)
