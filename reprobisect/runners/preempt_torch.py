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
from typing import Any

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


def _scheduler_states(obj: Any, depth: int = 0) -> list[dict[str, Any]]:
    """The LR-scheduler states inside a saved object (state dicts, or schedulers saved whole;
    nested dicts/lists, a few levels)."""
    if depth > 4:
        return []
    if hasattr(obj, "last_epoch") and hasattr(obj, "optimizer") and callable(getattr(obj, "state_dict", None)):
        return [{"last_epoch": getattr(obj, "last_epoch", None), "step_count": getattr(obj, "_step_count", None)}]
    if isinstance(obj, dict):
        if "last_epoch" in obj and "_step_count" in obj:
            return [{"last_epoch": obj.get("last_epoch"), "step_count": obj.get("_step_count")}]
        return [s for v in list(obj.values())[:64] for s in _scheduler_states(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [s for v in list(obj)[:64] for s in _scheduler_states(v, depth + 1)]
    return []


def _scheduled_optimizer(obj: Any, depth: int = 0) -> bool:
    """Whether a saved object holds an optimizer state dict whose param groups carry ``initial_lr``:
    an LR scheduler was attached to that optimizer (its constructor sets it), whether or not the
    scheduler's own state was saved beside it."""
    if depth > 4:
        return False
    if isinstance(obj, dict):
        groups = obj.get("param_groups")
        if isinstance(groups, list) and "state" in obj:
            return any(isinstance(g, dict) and "initial_lr" in g for g in groups)
        return any(_scheduled_optimizer(v, depth + 1) for v in list(obj.values())[:64])
    if isinstance(obj, (list, tuple)):
        return any(_scheduled_optimizer(v, depth + 1) for v in list(obj)[:64])
    return False


def _scaler_scales(obj: Any, depth: int = 0) -> list[float]:
    """The GradScaler scales inside a saved object (``scaler.state_dict()``: ``scale`` beside
    ``_growth_tracker``, or a GradScaler saved whole; nested dicts/lists, a few levels)."""
    if depth > 4:
        return []
    if callable(getattr(obj, "get_scale", None)) and callable(getattr(obj, "state_dict", None)):
        try:
            return [float(obj.get_scale())]
        except Exception:
            return []
    if isinstance(obj, dict):
        if "scale" in obj and "_growth_tracker" in obj:
            try:
                return [float(obj["scale"])]
            except (TypeError, ValueError):
                return []
        return [s for v in list(obj.values())[:64] for s in _scaler_scales(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [s for v in list(obj)[:64] for s in _scaler_scales(v, depth + 1)]
    return []


def _watch_saves(rec: Any, saves: list[dict[str, Any]]) -> None:
    """Note each ``torch.save`` and ``scheduler.step()`` of the end-of-step code (``saves``)."""
    from torch.optim import lr_scheduler

    save = torch.save

    def noted_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        out = save(obj, f, *args, **kwargs)
        name = os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None
        saves.append({"file": name, "optimizer_steps": int(getattr(rec, "_opt_posts", 0) or 0),
                      "schedulers": _scheduler_states(obj), "scheduler_steps_after": 0,
                      "scheduled_optimizer": _scheduled_optimizer(obj), "scaler_scales": _scaler_scales(obj)})
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
