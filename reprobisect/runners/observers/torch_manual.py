"""The PyTorch recorder's updates by hand: steps of a loop without ``torch.optim``.

Until an optimizer step is seen, each backward notes the parameters that have gradients
(version counter and sum); the next training forward (or the program's end,
``finish_manual``) that finds one of them changed ends a step: ``grad`` as backward left it,
``param`` after the update, ``scalars.manual_update``. 200 backward passes with no update
and no optimizer end the run as ``no_steps``.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch

from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.torch_common import _Entry, _psum, _version
from reprobisect.runners.policy import StopRun

__all__ = ["ManualObserver", "_no_update_detail"]

_IDLE_BACKWARDS = 200
"""backward() calls with no optimizer and no parameter update after which a run is no_steps."""


def _no_update_detail(backwards: int, graphless: int = 0) -> str:
    if backwards == 0:
        what = "never called optimizer.step() and never ran backward()"
    elif graphless == backwards:
        what = (f"never called optimizer.step(), and each of its {backwards} backward() call(s) started from a "
                "tensor with no graph (a leaf: a loss rebuilt with torch.tensor() from .item(), or detached), so no "
                "parameter got a gradient")
    else:
        what = (f"never called optimizer.step(), and no parameter changed after its {backwards} backward() "
                "call(s)")
    return (f"it {what}: nothing trained, nothing to compare. Record a loop that updates parameters (torch.optim, "
            "or by hand after backward()), or wrap your own update in reprobisect.torch.record(model, ...)")


class ManualObserver(Observer):
    """Sees parameters change after backward with no optimizer, and ends that step."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.snap: dict[int, tuple[Any, int | None, torch.Tensor]] = {}  # params at backward
        self.idle = 0  # backward() calls with no optimizer and no parameter update
        self.mark = 0  # evaluation runs before the last backward

    def after_backward(self) -> None:
        rec = self.rec
        if rec._opt_seen:
            return
        # no optimizer so far: note the parameters that have gradients, to see an update by hand
        with torch.no_grad():
            for _, p in self._root_params():
                if p.grad is not None and id(p) not in self.snap and p.is_floating_point():
                    self.snap[id(p)] = (weakref.ref(p), _version(p), _psum(p))
        self.idle += 1
        ev = rec.observers["evaluation"].runs
        self.mark, ev.cur = len(ev.runs), None
        if rec.step == 0 and self.idle >= _IDLE_BACKWARDS:
            rec._finish(StopRun("no_steps", 0, _no_update_detail(rec.backwards, rec.graphless_backwards)))

    def _root_params(self) -> list[tuple[str, torch.Tensor]]:
        """Every root's parameters (each once), by their names."""
        rec = self.rec
        out, seen = [], set()
        for ref, prefix in list(rec._roots.values()):
            m = ref()
            if m is None:
                continue
            for path, p in m.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((rec._param_names.get(id(p)) or prefix + ("." if prefix else "") + path, p))
        return out

    def before_root(self, module: torch.nn.Module) -> None:
        """A training forward: a step of a loop without an optimizer ends if its parameters changed."""
        if not self.rec._opt_seen and self.snap and self.updated():
            self.end_step()

    def updated(self) -> bool:
        """Whether a parameter that had a gradient at the last backward changed since: its
        version counter, or (``p.data`` updates do not count versions) its sum."""
        sums = []
        for ref, v, s in self.snap.values():
            p = ref()
            if p is None:
                continue
            if v is not None and _version(p) != v:
                return True
            sums.append((s, _psum(p)))
        if not sums:
            return False
        with torch.no_grad():
            return any(bool((a != b) & ~(a.isnan() & b.isnan())) for a, b in sums)

    def finish(self) -> None:
        """At the end of the program: a pending step of a loop without an optimizer ends here."""
        rec = self.rec
        if not rec.done and not rec._opt_seen and self.snap and rec.failed is None:
            rec.guarded("finish_manual", self._end_if_updated)

    def _end_if_updated(self) -> None:
        if self.updated():
            self.end_step()

    def end_step(self) -> None:
        """End a step of a loop that updates parameters by hand: its gradients (as backward
        left them, before any clipping the loop did), its parameters now (after the update)."""
        rec = self.rec
        rec.observers["gradients"].flush()  # (times itself)
        t0 = time.perf_counter()
        with torch.no_grad():
            params = [(n, p) for n, p in self._root_params() if id(p) in self.snap]
            have = self._grads(params)
            for name, p in params:
                rec._add("param", name, p, fresh=True)
        rec._scalars["manual_update"] = True
        rec._scalars["grad_params"] = have
        rec._scalars["no_grad_params"] = []
        rec._scalars["no_gradients"] = have == 0
        self.snap.clear()
        self.idle = 0
        rec._record_s += time.perf_counter() - t0
        # evaluation after the last backward ran after this update (as far as can be told):
        # it belongs to the next step's window, like evaluation after an optimizer step
        ev = rec.observers["evaluation"].runs
        late, ev.runs = ev.runs[self.mark:], ev.runs[: self.mark]
        step = rec.step
        try:
            rec._end_step(None)
        finally:
            for r in late:
                r["after_step"] = step
            ev.runs, ev.cur, self.mark = late + ev.runs, None, 0

    def _grads(self, params: list[tuple[str, torch.Tensor]]) -> int:
        """The step's gradients as backward left them (sentinel: their norms only); how many."""
        rec = self.rec
        grads = rec.observers["gradients"]
        have = 0
        for name, p in params:
            seen = grads.seen.get(id(p))
            if seen is None or (seen[3] is None and not rec._sentinel):
                continue
            have += 1
            if rec._sentinel:  # the norm only
                grads.pre_clip.append(seen[2])
                continue
            g = seen[0]()
            e = _Entry(kind="grad", name=rec._unique("grad", name), pending=seen[3])
            if rec._full and g is not None and _version(g) == seen[1]:
                rec._keep_array(e, g)
            e.seq = len(rec._entries)
            rec._entries.append(e)
            grads.pre_clip.append(seen[2])
        return have

    def manifest_extra(self) -> dict[str, Any]:
        """``before_first_step`` when the run wrote no step (see ``TorchRecorder.manifest_extra``)."""
        rec = self.rec
        if rec.step != 0 or rec._opt_posts:
            return {}
        return {"before_first_step": {"backwards": rec.backwards, "backwards_without_graph": rec.graphless_backwards,
                                      "parameters_seen": len(rec.observers["init"].params),
                                      "frozen_params": list(rec._scalars.get("frozen_params") or [])}}


register_observer("torch", "manual", ManualObserver, rank=20)
