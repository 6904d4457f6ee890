"""Replay: run an unmodified training command from a recorded complete state.

``python -m reprobisect.runners.launch --replay-from X --replay-step S ...`` runs the
user's command from its beginning, with the recorder quiet, and at the moment the
original run's step ``S`` began it loads the complete state trace ``X`` captured after
step ``S - 1`` (``state/step-<S-1>``: model(s), optimizer(s), LR scheduler(s),
GradScaler, every RNG, the DataLoader's position) into the objects the command built,
then records steps ``S, S+1, ...`` numbered as in the original run.

When is "the moment step S began"? The state was captured at the iteration boundary
after step ``S - 1`` (``torch_state.capture_state``: before the next DataLoader batch is
fetched, or else at the next module forward). The replay picks the matching point in the
fresh run:

- ``loader`` (the state holds a DataLoader position): right before the command's first
  ``iter(DataLoader)`` of a loader like the captured one, before anything trained. The
  loader is armed to continue the captured epoch where it stopped (``_arm_loader``), so
  data order, worker seeds, RNG streams, parameters, optimizer, scheduler and scaler all
  continue from there.
- ``step_end`` (no DataLoader: batches drawn from the global RNG, nanoGPT's
  ``get_batch``): the fresh run trains its first step unrecorded; as that optimizer step
  ends the RNGs are set to those the original had as step ``S - 1`` ended
  (``rng.json``'s ``at_step_end``), so whatever the loop draws before its next forward
  (the next batch) is drawn as in the original. At that next forward (the boundary) the
  RNGs must equal the captured ones exactly, else the replay is refused; then every object
  is loaded and recording starts.

Refused, with a one-line reason (the launcher's outcome ``skip``, "cannot replay ..."),
never replayed wrongly as far as can be seen from inside the run: no state at ``S - 1``;
an object the command built that the state does not hold (an optimizer, scheduler or
enabled GradScaler), or one that cannot be told apart from another; a DataLoader over an
``IterableDataset``; training that starts before a loader like the captured one is
iterated; a training DataLoader when the state holds no loader position (a loader only its
iterator held is gone when the state is captured); a state captured without a DataLoader
and without the step-end RNG; RNG draws between a step's end and the next forward that differ from the
original's; a loop without ``torch.optim``; Lightning. What cannot be seen from inside
(the loop's own variables: an iteration counter that sets the learning rate, a batch
drawn ahead of the step, an iterator the script built itself) is caught afterwards by
``workflows.replay.verify_replay``, which compares the replayed steps with the original's.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from pathlib import Path
from typing import Any

import torch

from reprobisect.errors import ReproError
from reprobisect.runners import torch_state

__all__ = ["ReplayRefused", "Replayer"]


class ReplayRefused(BaseException):
    """Ends a replay run that cannot continue the original faithfully (a ``BaseException``
    so that the script's ``except Exception`` does not swallow it)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _refuse(detail: str) -> ReplayRefused:
    return ReplayRefused(f"cannot replay: {detail}")


def _state_dict_shape(sd: Any) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items() if isinstance(v, torch.Tensor)}


class Replayer:
    """Waits, quiet, for the point where step ``first_step`` began; restores; records from there."""

    def __init__(self, recorder: Any, trace: str | Path, first_step: int, steps: int) -> None:
        self.rec = recorder
        self.trace = Path(trace)
        self.first_step = first_step
        self.steps = steps
        self.restored = False
        self.mode = "?"
        self.refused: str | None = None
        self._handles: list[Any] = []
        self._undo: list[Any] = []
        self._burned = False
        self.state: dict[str, Any] = {}
        self.at_step_end: dict[str, Any] | None = None
        self.classes: dict[str, str] = {}

    # -- set up ----------------------------------------------------------------------

    def _load(self) -> None:
        s = self.first_step
        if s < 1:
            raise self._fail(f"--replay-step {s}: step 0 has no earlier state; record from the start instead")
        try:
            self.state = torch_state.load_state(self.trace, s - 1)
            self.at_step_end, self.classes = torch_state.load_rng_at_step_end(self.trace, s - 1)
        except ReproError as e:
            raise self._fail(str(e)) from None
        names = [n for n in self.state if n not in ("rng", "data")]
        if not any(n.startswith("optimizer") for n in names):
            raise self._fail(f"the state at step {s - 1} holds no optimizer (a loop without torch.optim "
                             "cannot be replayed yet)")
        pos = (self.state.get("data") or {}).get("position") or {}
        if pos.get("epoch") is not None and pos.get("exact") and self.state["data"]["start"] is not None:
            self.mode = "loader"
        elif "data" in self.state:
            raise self._fail(f"the DataLoader's position at step {s - 1} is unknown ({pos.get('note', 'not tracked')})")
        elif self.at_step_end is None:
            raise self._fail(f"the state at step {s - 1} was captured outside a step, without the step-end RNG")
        else:
            self.mode = "step_end"

    def install(self) -> "Replayer":
        """Read the state, quiet the recorder and hook the restore point (``ReplayRefused`` when
        the state cannot be replayed at all)."""
        self._load()
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module
        from torch.utils.data import DataLoader

        self.rec.done = True
        torch_state.track_data_order()
        orig = DataLoader.__dict__["__iter__"]
        rp = self

        def __iter__(loader):  # noqa: N807 - the restore point of a loader loop
            if not rp.restored and rp.refused is None and torch.is_grad_enabled():
                rp._at_loader(loader)
            return orig(loader)

        DataLoader.__iter__ = __iter__
        self._undo.append(lambda: setattr(DataLoader, "__iter__", orig))
        if self.mode == "loader":
            self._handles.append(optim_module.register_optimizer_step_pre_hook(self._early_step))
        else:
            self._handles.append(optim_module.register_optimizer_step_post_hook(self._step_end))
            h = nn_module.register_module_forward_pre_hook(self._boundary)
            nn_module._global_forward_pre_hooks.move_to_end(h.id, last=False)  # before the recorder's
            self._handles.append(h)
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        while self._undo:
            self._undo.pop()()

    # -- the restore points ------------------------------------------------------------

    def _early_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self.restored:
            raise self._fail("the command took an optimizer step before it iterated a DataLoader like the "
                             f"captured one ({self._loader_desc(self.state['data']['position'])})")

    def _at_loader(self, loader: Any) -> None:
        from torch.utils.data import IterableDataset

        if self.mode != "loader":
            raise self._fail(f"the command iterates a DataLoader, but the state at step {self.first_step - 1} holds "
                             "no DataLoader position (the loader was not kept alive, or not tracked)")
        pos = self.state["data"]["position"]
        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            raise self._fail("the DataLoader reads an IterableDataset, whose position cannot be set")
        if not self._same_loader(loader, pos):
            return  # another loader (evaluation, a probe of the data): wait for the training one
        objects = self._match_objects()
        self._load_objects(objects)
        torch_state.restore_rng(self.state.get("rng", {}), loader)
        torch_state._arm_loader(loader, pos, self.state["data"]["start"])
        self._start()

    def _step_end(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.restored or self._burned:
            return
        if type(opt).__qualname__ != self.classes.get("optimizer") or not self._fits("optimizer", "optimizer", opt):
            return  # another optimizer's step (a GAN's other half): the original's step S-1 ended with this one
        self._burned = True
        torch_state.restore_rng(self.at_step_end or {})

    def _boundary(self, module: Any, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if not self._burned or self.restored or self.refused is not None:
            return
        want = self.state.get("rng", {})
        now = torch_state.capture_rng()
        for src in ("python", "numpy", "torch", "torch.cuda"):
            if (src in want) != (src in now) or (src in want and not _rng_equal(want[src], now[src])):
                raise self._fail(f"the '{src}' random numbers drawn between step {self.first_step - 1}'s end and "
                                 "the next forward differ from the original run's (the loop draws differently "
                                 "at its start)")
        self._load_objects(self._match_objects())
        self._start()

    def _start(self) -> None:
        rec = self.rec
        self.restored = True
        rec.policy = dataclasses.replace(rec.policy, steps=self.first_step + self.steps)
        rec.step = self.first_step
        rec._reset_step()
        rec.done = False
        self.remove()
        rec.notes.append(f"replayed from the state trace '{self.trace}' captured after step {self.first_step - 1} "
                         f"(restored at the {'first DataLoader iteration' if self.mode == 'loader' else 'first step end'})")

    def _fail(self, detail: str) -> ReplayRefused:
        e = _refuse(detail)
        self.refused = self.refused or e.detail  # the hooks stay (one may be running now) and do nothing from here
        return e

    # -- objects ---------------------------------------------------------------------------

    def _match_objects(self) -> dict[str, Any]:
        """The live object for each captured name; refuses on a missing, extra or ambiguous one."""
        from torch.optim.lr_scheduler import LRScheduler

        try:
            from torch.amp import GradScaler
        except ImportError:  # pragma: no cover - torch < 2.3
            from torch.cuda.amp import GradScaler  # type: ignore[no-redef]
        if "lightning" in sys.modules or "pytorch_lightning" in sys.modules:
            raise self._fail("Lightning runs cannot be replayed yet (the trainer's loop state is not in the state)")
        gc.collect()
        live = gc.get_objects()
        kinds = {
            "optimizer": [o for o in live if isinstance(o, torch.optim.Optimizer)],
            "scheduler": [o for o in live if isinstance(o, LRScheduler)],
            "scaler": [o for o in live if isinstance(o, GradScaler)],
        }
        modules = [o for o in live if isinstance(o, torch.nn.Module)]
        out: dict[str, Any] = {}
        for kind, objs in kinds.items():
            out.update(self._match_kind(kind, objs))
        opt_params = {id(p) for o in kinds["optimizer"] for g in o.param_groups for p in g["params"]}
        for name in [n for n in self.state if n == "model" or n.startswith("model.")]:
            out[name] = self._match_model(name, modules, opt_params)
        return out

    def _match_kind(self, kind: str, objs: list[Any]) -> dict[str, Any]:
        names = [n for n in self.state if n.rstrip("0123456789") == kind]
        out: dict[str, Any] = {}
        free = list(objs)
        for name in names:
            cls = self.classes.get(name, "")
            cands = [o for o in free if type(o).__qualname__ == cls and self._fits(kind, name, o)]
            if len(cands) != 1:
                what = "none" if not cands else f"{len(cands)}, which cannot be told apart"
                raise self._fail(f"the state's '{name}' ({cls}) matches {what} of the objects the command built")
            out[name] = cands[0]
            free.remove(cands[0])
        extra = [o for o in free if not (kind == "scaler" and not o.is_enabled())]
        if extra:
            raise self._fail(f"the command built a {type(extra[0]).__qualname__} that the state at step "
                             f"{self.first_step - 1} does not hold (capture it, or replay a run that recorded it)")
        return out

    def _fits(self, kind: str, name: str, obj: Any) -> bool:
        if kind != "optimizer":
            return True
        groups = self.state[name].get("param_groups", [])
        return [len(g["params"]) for g in groups] == [len(g["params"]) for g in obj.param_groups]

    def _match_model(self, name: str, modules: list[Any], opt_params: set[int]) -> Any:
        want = _state_dict_shape(self.state[name])
        cands = []
        for m in modules:
            params = list(m.parameters())
            if params and not any(id(p) in opt_params for p in params):
                continue
            if _state_dict_shape(m.state_dict()) == want and set(m.state_dict()) == set(self.state[name]):
                cands.append(m)
        if len(cands) != 1:
            what = "no module" if not cands else f"{len(cands)} modules, which cannot be told apart,"
            raise self._fail(f"the state's '{name}' matches {what} of the command's (same parameters and buffers)")
        return cands[0]

    def _load_objects(self, objects: dict[str, Any]) -> None:
        order = sorted(objects, key=lambda n: ("model", "optimizer", "scheduler", "scaler").index(
            n.split(".")[0].rstrip("0123456789")))
        for name in order:
            sd = self.state[name]
            obj = objects[name]
            if isinstance(sd, dict) and not sd and not obj.state_dict():
                continue  # a disabled GradScaler
            obj.load_state_dict(sd)

    @staticmethod
    def _same_loader(loader: Any, pos: dict[str, Any]) -> bool:
        try:
            length = len(loader)
        except TypeError:
            length = None
        return (getattr(loader, "batch_size", None) == pos.get("batch_size")
                and type(getattr(loader, "sampler", None)).__name__ == pos.get("sampler")
                and length == pos.get("epoch_length")
                and getattr(loader, "drop_last", None) == pos.get("drop_last"))

    @staticmethod
    def _loader_desc(pos: dict[str, Any]) -> str:
        return (f"batch_size {pos.get('batch_size')}, {pos.get('epoch_length')} batches an epoch, "
                f"{pos.get('sampler')}")

    def manifest_extra(self) -> dict[str, Any]:
        """What the trace's manifest says about this replay."""
        return {"from": str(self.trace.resolve()), "step": self.first_step, "state_step": self.first_step - 1,
                "mode": self.mode, "restored": self.restored, **({"refused": self.refused} if self.refused else {})}


def _rng_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_rng_equal(x, y) for x, y in zip(a, b))
    try:
        import numpy as np

        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except ImportError:  # pragma: no cover
        pass
    return a == b
