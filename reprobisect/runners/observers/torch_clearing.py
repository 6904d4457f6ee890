"""The PyTorch recorder's view of gradient clearing: when ``.grad`` is cleared within a step.

The three classic bugs (the doctor's ``update`` check reads them, ``workflows.doctor.clearing``):

- never cleared: at a step's first backward a parameter's ``.grad`` is still the very tensor,
  unchanged (same object, same version counter), that the previous ``optimizer.step()`` took:
  this step's gradient adds onto the last one;
- cleared between the last backward and ``optimizer.step()``: backward gave the parameter a
  gradient, and at the optimizer's step pre-hook it is ``None`` or all zeros;
- cleared inside an accumulation loop: several backwards per step, and a gradient present
  after one backward is ``None`` or zero before the next: only the last micro-batch's survives.

``Optimizer.zero_grad`` and ``Module.zero_grad`` are wrapped to count their calls in the
step's phases (before the first backward, between backwards, after the last). Only an
abnormal step writes ``scalars["grad_clearing"]`` (a healthy trace is unchanged). Checks read
object identity and version counters; a reduction (all zeros?) runs only on a gradient changed
in place between two observations. An observer only observes: nothing here changes a tensor.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.torch_common import _version

__all__ = ["ClearingObserver"]

_PHASES = ("before_first_backward", "between_backwards", "after_last_backward")


def _compiling() -> bool:
    """Whether torch.compile is tracing this call (dynamo folds the answer into the graph)."""
    return bool(getattr(torch.compiler, "is_compiling", lambda: False)())


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"] if isinstance(p, torch.Tensor)]


def _all_zero(grads: list[torch.Tensor]) -> list[bool]:
    """Whether each gradient is all zeros (one host transfer per device)."""
    out: dict[int, bool] = {}
    by_dev: dict[Any, list[tuple[int, torch.Tensor]]] = {}
    for i, g in enumerate(grads):
        by_dev.setdefault(g.device, []).append((i, g))
    with torch.no_grad():
        for items in by_dev.values():
            flags = torch.stack([g.detach().ne(0).any() for _, g in items]).tolist()
            out.update({i: not f for (i, _), f in zip(items, flags)})
    return [out[i] for i in range(len(grads))]


class ClearingObserver(Observer):
    """Where ``.grad`` is cleared (or not) in each step; see the module docstring."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.consumed: dict[int, tuple[Any, int | None]] = {}  # id(p) -> (ref(grad), version) the last step took
        self.reset_step()

    def reset_step(self) -> None:
        self.backwards = 0
        self.stale: set[int] = set()  # ids of parameters whose gradient was the last step's at the first backward
        self.after: dict[int, tuple[Any, int | None]] = {}  # id(p) -> (ref(grad), version) after the last backward
        self.between: set[int] = set()  # ids cleared between two backwards of this step
        self.calls: list[tuple[int, str]] = []  # (backwards before the call, what was called)
        self.at_step: dict[str, Any] | None = None

    def install(self) -> Callable[[], None] | None:
        from torch.optim import optimizer as optim_module

        rec = self.rec
        for owner, label in ((torch.optim.Optimizer, "optimizer.zero_grad()"), (torch.nn.Module, "model.zero_grad()")):
            wrapper = self._counting(owner.__dict__["zero_grad"], label)
            if owner is torch.optim.Optimizer and hasattr(torch, "_disable_dynamo"):
                # torch runs Optimizer.zero_grad outside dynamo (@torch._disable_dynamo): its wrapper
                # must too, or a compiled train step splits into more graphs than without us
                wrapper = torch._disable_dynamo(wrapper)
            rec._patch(owner, "zero_grad", wrapper)
        handle = optim_module.register_optimizer_step_pre_hook(self._pre_step)
        return handle.remove

    def _counting(self, orig: Callable, label: str) -> Callable:
        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            # inside a region torch.compile traces, counting would be a side effect dynamo breaks
            # the graph on (more graphs than the run without the recorder): count eager calls only
            if not _compiling() and not self.rec.done and not self.rec._quiet:
                self.calls.append((self.backwards, label))
            return orig(obj, *args, **kwargs)

        zero_grad.__wrapped__ = orig  # type: ignore[attr-defined]
        return zero_grad

    def _watched(self) -> list[torch.Tensor]:
        """The model's parameters and those of every optimizer seen (once each)."""
        seen: dict[int, torch.Tensor] = {}
        model = self.rec.primary_module()
        if model is not None:
            seen.update((id(p), p) for p in model.parameters())
        for opt in list(self.rec._optimizers):
            seen.update((id(p), p) for p in _params(opt))
        return list(seen.values())

    def _cleared(self, pairs: list[tuple[int, torch.Tensor | None, tuple[Any, int | None]]]) -> set[int]:
        """Ids whose gradient, present at ``was``, is now None or was zeroed in place."""
        gone = {i for i, g, _ in pairs if g is None}
        changed = [(i, g) for i, g, (ref, ver) in pairs
                   if g is not None and (ref() is not g or _version(g) != ver) and not g.is_sparse]
        try:
            if changed:
                gone |= {i for (i, _), z in zip(changed, _all_zero([g for _, g in changed])) if z}
        except Exception:  # an unreadable gradient (a meta tensor): say nothing of it
            pass
        return gone

    def losses(self, ts: list[torch.Tensor]) -> None:
        """Before a backward: the step's first sees stale gradients; a later one, cleared ones."""
        if self.rec._quiet or _compiling():
            return
        params = self._watched()
        if self.backwards == 0:
            for p in params:
                was, g = self.consumed.get(id(p)), p.grad
                if was is not None and g is not None and was[0]() is g and _version(g) == was[1]:
                    self.stale.add(id(p))
            return
        self.between |= self._cleared([(id(p), p.grad, self.after[id(p)]) for p in params if id(p) in self.after])

    def after_backward(self) -> None:
        if _compiling():
            return
        self.backwards += 1
        self.after = {id(p): (weakref.ref(p.grad), _version(p.grad)) for p in self._watched() if p.grad is not None}

    def _pre_step(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """The optimizer takes its gradients: were those backward gave cleared since?"""
        if _compiling():  # a step torch.compile traces is not observed (no side effect in its graph)
            return
        try:
            if self.rec.done or self.rec._quiet:
                return
            params = _params(opt)
            mine = {id(p) for p in params}
            if self.backwards:
                had = [(id(p), p.grad, self.after[id(p)]) for p in params if id(p) in self.after]
                self.at_step = {"backwards": self.backwards, "with_gradient": len(had),
                                "cleared_before_step": len(self._cleared(had)),
                                "stale": len(self.stale & mine), "cleared_between_backwards": len(self.between & mine)}
            for p in params:
                g = p.grad
                if g is not None:
                    self.consumed[id(p)] = (weakref.ref(g), _version(g))
                else:
                    self.consumed.pop(id(p), None)
        except Exception:  # an observation never fails the user's step
            self.at_step = None

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        """``grad_clearing`` for an abnormal step only (see the module docstring)."""
        n = self.backwards
        phases = {k: 0 for k in _PHASES}
        labels: list[str] = []
        for before, label in self.calls:
            phase = _PHASES[0] if before == 0 else _PHASES[2] if before >= n else _PHASES[1]
            phases[phase] += 1
            labels += [label] if label not in labels else []
        got = dict(self.at_step or {})
        # a zero_grad after the last backward is normal where the update came first (a loop
        # without torch.optim clears after its own update): what the optimizer found cleared
        # (cleared_before_step) is the evidence, not the call
        if not (got.get("stale") or got.get("cleared_before_step") or got.get("cleared_between_backwards")
                or phases[_PHASES[1]]):
            return
        got.setdefault("backwards", n)
        scalars["grad_clearing"] = {**got, "zero_grad_calls": phases, "called": labels}


register_observer("torch", "clearing", ClearingObserver, rank=62)
