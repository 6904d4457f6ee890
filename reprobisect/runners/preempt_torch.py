"""A preemption-like stop for ``bisect resume``: end the run after step K's own end-of-step code.

The recorder normally ends a run from inside the last step's ``optimizer.step()``, before
the user's code that follows it (``scheduler.step()``, ``scaler.update()``, the checkpoint
save). A preemption that a resume has to survive comes later: after that code has run.
With ``RecordPolicy.defer_stop`` the recorder hands its final ``StopRun`` to ``defer``
instead of raising it; the process runs on, recording nothing, and the stop is raised at
the first sign that the next step begins:

- a training batch handed to the loop: a DataLoader fetch with gradients on that returns a
  batch (the fetch that ends an epoch with ``StopIteration`` is not one: the loop's
  end-of-epoch code — scheduler steps, validation, the per-epoch checkpoint — runs on), from
  a loader that is not an evaluation's: not another loader than the one training drew from,
  and not while a model that trained in ``train()`` mode is in ``eval()`` mode (validation
  without ``no_grad``);
- a training forward (a module in ``train()`` mode, gradients on);
- an optimizer's pre-step hook (the next step's update, the last resort),

or the process ends by itself (the launcher then seals the trace ``ok``). ``zero_grad``,
``iter(loader)``, ``model.train()`` are not boundaries: many loops call them before the next
batch. Evaluation (``no_grad``/``inference_mode``) in the end-of-step code runs freely.

What the end-of-step code saved is noted for the verdict (``environment["preempt"]`` in the
manifest, through the recorder's ``environment_extra``): each ``torch.save`` after the last step with the state it held
(the optimizer steps taken, a scheduler's ``last_epoch``, whether it holds an optimizer a
scheduler drives: ``initial_lr`` in its param groups, the GradScaler scales it holds) and the
``scheduler.step()`` calls that came after it — a checkpoint saved before its scheduler stepped
is told from one that never saved the scheduler, and a GradScaler never saved from one not loaded.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from reprobisect.runners.policy import StopRun

__all__ = ["defer"]


def _training() -> bool:
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def _evaluation_fetch(rec: Any, it: Any) -> bool:
    """A fetch with gradients on that is for evaluation: from another loader than the one
    training drew from, or while a model that trained in ``train()`` mode is in ``eval()``."""
    ref = it.__dict__.get("_reprobisect_loader")
    trained = getattr(rec, "_loader", None)
    mine, theirs = (ref() if ref is not None else None), (trained() if trained is not None else None)
    if mine is not None and theirs is not None and mine is not theirs:
        return True
    for key in getattr(rec, "_train_mode_roots", ()):
        entry = getattr(rec, "_roots", {}).get(key)
        module = entry[0]() if entry else None
        if module is not None and not module.training:
            return True
    return False


def _found_in(obj: Any, pick: Callable[[Any], list[Any] | None], depth: int = 0) -> list[Any]:
    """What ``pick`` finds inside a saved object: ``pick(x)`` returns a list for an ``x`` it
    recognises (not looked into further) or None to look inside ``x`` (nested dicts, lists and
    tuples: 4 levels, 64 items each — a checkpoint's state, not a dataset saved beside it)."""
    if depth > 4:
        return []
    hit = pick(obj)
    if hit is not None:
        return hit
    if isinstance(obj, dict):
        items = list(obj.values())[:64]
    elif isinstance(obj, (list, tuple)):
        items = list(obj)[:64]
    else:
        return []
    return [x for v in items for x in _found_in(v, pick, depth + 1)]


def _scheduler_state(obj: Any) -> list[dict[str, Any]] | None:
    """An LR scheduler's state: a ``state_dict()``, or a scheduler saved whole."""
    if hasattr(obj, "last_epoch") and hasattr(obj, "optimizer") and callable(getattr(obj, "state_dict", None)):
        return [{"last_epoch": getattr(obj, "last_epoch", None), "step_count": getattr(obj, "_step_count", None)}]
    if isinstance(obj, dict) and "last_epoch" in obj and "_step_count" in obj:
        return [{"last_epoch": obj.get("last_epoch"), "step_count": obj.get("_step_count")}]
    return None


def _optimizer_scheduled(obj: Any) -> list[bool] | None:
    """An optimizer state dict: ``[True]`` when its param groups carry ``initial_lr`` (an LR
    scheduler was attached to it: its constructor sets it), else ``[]``."""
    if isinstance(obj, dict) and isinstance(obj.get("param_groups"), list) and "state" in obj:
        return [True] if any(isinstance(g, dict) and "initial_lr" in g for g in obj["param_groups"]) else []
    return None


def _scaler_scale(obj: Any) -> list[float] | None:
    """A GradScaler's scale: ``scaler.state_dict()`` (``scale`` beside ``_growth_tracker``) or a
    GradScaler saved whole."""
    if callable(getattr(obj, "get_scale", None)) and callable(getattr(obj, "state_dict", None)):
        try:
            return [float(obj.get_scale())]
        except Exception:
            return []
    if isinstance(obj, dict) and "scale" in obj and "_growth_tracker" in obj:
        try:
            return [float(obj["scale"])]
        except (TypeError, ValueError):
            return []
    return None


def _watch_saves(rec: Any, saves: list[dict[str, Any]]) -> None:
    """Note each ``torch.save`` and ``scheduler.step()`` of the end-of-step code (``saves``)."""
    from torch.optim import lr_scheduler

    save = torch.save

    def noted_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        out = save(obj, f, *args, **kwargs)
        name = os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None
        saves.append({"file": name, "optimizer_steps": int(getattr(rec, "_opt_posts", 0) or 0),
                      "schedulers": _found_in(obj, _scheduler_state), "scheduler_steps_after": 0,
                      "scheduled_optimizer": bool(_found_in(obj, _optimizer_scheduled)),
                      "scaler_scales": _found_in(obj, _scaler_scale)})
        return out

    base = lr_scheduler.LRScheduler
    step = base.__dict__["step"]

    def noted_step(sched: Any, *args: Any, **kwargs: Any) -> Any:
        for s in saves:
            s["scheduler_steps_after"] += 1
        return step(sched, *args, **kwargs)

    rec._patch(torch, "save", noted_save)
    rec._patch(base, "step", noted_step)


def defer(rec: Any, stop: StopRun) -> None:
    """Arm ``stop`` on ``rec`` (a ``TorchRecorder`` that is done): raised when the next step begins."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module
    from torch.utils.data import dataloader as dl

    fired = False
    saves: list[dict[str, Any]] = []
    note: dict[str, Any] = {"optimizer_steps": int(getattr(rec, "_opt_posts", 0) or 0), "saves": saves}
    rec.environment_extra["preempt"] = note  # sealed with the trace (launch.seal): what the end-of-step code saved

    def fire(where: str) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        note["stopped_at"] = where
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
        if fired or not _training() or _evaluation_fetch(rec, it):
            return inner(it)
        batch = inner(it)  # StopIteration (the epoch's end) passes: its end-of-epoch code runs on
        fire("the next training batch")
        return batch

    _watch_saves(rec, saves)
    rec._patch(cls, "__next__", __next__)
    rec._handles += [nn_module.register_module_forward_pre_hook(fwd_pre),
                     optim_module.register_optimizer_step_pre_hook(opt_pre)]
