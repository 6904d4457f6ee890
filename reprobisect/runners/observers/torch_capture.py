"""The PyTorch recorder's state capture: complete state after the policy's state steps.

The stateful objects seen so far (model(s), optimizer(s), LR schedulers, the GradScaler)
are captured with the DataLoader's position (``runners.torch_state.capture_state``) after
every step the policy wants (``state_steps``, ``state_every``), within ``--max-disk``. Also
notes the first ``torch.manual_seed`` the program calls (``seed_everything`` calls it): the
manifest's seed when the launcher was given none.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import torch

from reprobisect.runners.chain import Observer, register_observer

__all__ = ["StateObserver"]


class StateObserver(Observer):
    """Schedulers and the seed, seen; state captured after the steps the policy wants."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.schedulers: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def install(self) -> Callable[[], None] | None:
        self._wrap_schedulers()
        self._wrap_seed()
        return None

    def _wrap_schedulers(self) -> None:
        try:
            from torch.optim import lr_scheduler
        except ImportError:
            return
        cls = lr_scheduler.LRScheduler
        orig = cls.__dict__["__init__"]
        schedulers = self.schedulers

        def __init__(sched, *args, **kwargs):
            orig(sched, *args, **kwargs)
            schedulers.add(sched)

        self.rec._patch(cls, "__init__", __init__)

    def _wrap_seed(self) -> None:
        """Note the first ``torch.manual_seed`` (Lightning's ``seed_everything`` calls it):
        the manifest's seed when the launcher was given none. Reads the argument only."""
        import torch.random as trandom

        orig = trandom.__dict__["manual_seed"]
        rec = self.rec

        @functools.wraps(orig)
        def manual_seed(seed, *args, **kwargs):
            if rec.seed is None:
                try:
                    rec.seed = int(seed)
                except (TypeError, ValueError):
                    pass
            return orig(seed, *args, **kwargs)

        rec._patch(trandom, "manual_seed", manual_seed)
        if torch.__dict__.get("manual_seed") is orig:
            rec._patch(torch, "manual_seed", manual_seed)

    def objects(self, opt: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """The stateful objects seen so far: model(s), optimizer(s), schedulers, scaler."""
        rec = self.rec
        objs: dict[str, Any] = {}
        for ref, prefix in rec._roots.values():
            m = ref()
            if m is not None:
                objs["model" if prefix == "" else f"model.{prefix}"] = m
        opts = list(rec._optimizers)
        if opt is not None and opt in opts:
            opts.remove(opt)
            opts.insert(0, opt)
        for i, o in enumerate(opts):
            objs["optimizer" if i == 0 else f"optimizer{i}"] = o
        for i, s in enumerate(self.schedulers):
            objs["scheduler" if i == 0 else f"scheduler{i}"] = s
        scaler = rec._scaler() if rec._scaler is not None else None
        if scaler is not None:
            objs["scaler"] = scaler
        return objs

    def after_step(self, step: int, opt: Any) -> None:
        if self.rec.policy.wants_state(step):
            self.capture(step, opt)

    def capture(self, step: int, opt: torch.optim.Optimizer) -> None:
        rec = self.rec
        budget = rec.policy.max_disk
        if budget is not None and rec._disk_used >= budget:
            rec._say(f"state at step {step} not captured: the trace already holds {rec._disk_used} bytes "
                     f"(--max-disk {budget})")
            return
        try:
            from reprobisect.runners.torch_state import capture_state
        except ImportError:
            rec.notes.append(f"state at step {step} not captured: state capture is not available in this build")
            return
        loader = rec._loader() if rec._loader is not None else None
        try:
            capture_state(rec.writer, step, self.objects(opt), loader=loader)
        except NotImplementedError:
            rec.notes.append(f"state at step {step} not captured: state capture is not available in this build")
            return
        if budget is not None:
            rec.writer.drain()  # (the state is written in the background)
            rec._disk_used = rec._trace_bytes()
        if budget is not None and rec._disk_used > budget:
            rec._say(f"the state at step {step} took the trace to {rec._disk_used} bytes, over --max-disk {budget}")


register_observer("torch", "state", StateObserver, rank=100)
