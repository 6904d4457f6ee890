"""A preemption-like stop for ``bisect resume``: end the run after step K's own end-of-step code.

The recorder normally ends a run from inside the last step's ``optimizer.step()``, before
the user's code that follows it (``scheduler.step()``, ``scaler.update()``, the checkpoint
save). A preemption that a resume has to survive comes later: after that code has run.
With ``RecordPolicy.defer_stop`` the recorder hands its final ``StopRun`` to ``defer``
instead of raising it; the process runs on, recording nothing, and the stop is raised at
the first sign that the next step begins:

- a training DataLoader fetch (``_BaseDataLoaderIter.__next__`` with gradients on),
- a training forward (a module in ``train()`` mode, gradients on),
- an optimizer's pre-step hook (the next step's update, the last resort),

or the process ends by itself (the launcher then seals the trace ``ok``). ``zero_grad`` is
not a boundary: many loops call it right after ``optimizer.step()``, before the save.
Evaluation (``no_grad``/``inference_mode``) in the end-of-step code runs freely.
"""

from __future__ import annotations

from typing import Any

import torch

from reprobisect.runners.policy import StopRun

__all__ = ["defer"]


def _training() -> bool:
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def defer(rec: Any, stop: StopRun) -> None:
    """Arm ``stop`` on ``rec`` (a ``TorchRecorder`` that is done): raised when the next step begins."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module
    from torch.utils.data import dataloader as dl

    fired = False

    def fire(where: str) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        stop.detail = f"{stop.detail}; stopped as the next step began ({where}), after the step's own code had run"
        rec.stop = stop
        raise stop

    def fwd_pre(module: torch.nn.Module, args: Any) -> None:
        if module.training and _training():
            fire(f"forward of {type(module).__name__}")

    def opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
        fire(f"{type(opt).__name__}.step()")

    cls = dl._BaseDataLoaderIter
    inner = cls.__dict__["__next__"]

    def __next__(it: Any) -> Any:  # noqa: N807 - the recorder's wrapper, guarded
        if _training():
            fire("the next training batch")
        return inner(it)

    rec._patch(cls, "__next__", __next__)
    rec._handles += [nn_module.register_module_forward_pre_hook(fwd_pre),
                     optim_module.register_optimizer_step_pre_hook(opt_pre)]
