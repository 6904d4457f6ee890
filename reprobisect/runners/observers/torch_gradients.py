"""The PyTorch recorder's gradients: ``grad`` records and the norm before clipping.

Each parameter's gradient is fingerprinted once accumulated (a post-accumulate-grad hook:
the gradient before clipping, ``scalars.grad_norm``); the optimizer's step pre-hook records
``.grad`` as it enters the optimizer (a cache hit when nothing changed it since), with
``grad_params``, ``no_grad_params`` and ``no_gradients``. Small CPU gradients and those on a
batched device are fingerprinted together when backward returns (``flush``).
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Any

import torch

from reprobisect.runners import batched_torch
from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners.chain import Observer, json_float, register_observer
from reprobisect.runners.observers.torch_common import _NoGrad, _gc_paused, _norm, _small_on_cpu, _version
from reprobisect.trace.format import stat_value

__all__ = ["GradientsObserver"]


class GradientsObserver(Observer):
    """Gradients at their accumulation and as the optimizer takes them."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.reset_step()

    def reset_step(self) -> None:
        self.seen: dict[int, tuple[Any, int | None, fpt.Pending | torch.Tensor, fpt.Pending | None]] = {}
        self.pre_clip: list[fpt.Pending | torch.Tensor | float] = []
        self.todo: list[tuple[torch.Tensor, torch.Tensor]] = []  # (param, grad) to fingerprint in a batch

    def hook(self, p: torch.Tensor) -> None:
        """``p``'s gradient is accumulated: the gradient before clipping, fingerprinted here;
        the optimizer pre-hook reuses this unless clipping (or anything else) changed it in
        place since. The last item: its fingerprint, the grad record of a loop without an optimizer."""
        rec = self.rec
        g = p.grad
        if rec.done or rec._quiet or g is None or g.is_sparse:
            return
        sentinel = rec._sentinel
        if rec.policy.stats and (batched_torch.on_batched_device(g) or (not sentinel and _small_on_cpu(g))):
            # in one batch with the others, when backward returns (``flush``); a sentinel's
            # norm on an accelerator too (from the batch's statistics: a constant number of
            # launches, where a norm each cost two per gradient)
            self.todo.append((p, g))
            self.seen[id(p)] = (weakref.ref(g), _version(g), None, None)
            return
        with _NoGrad():
            if sentinel:  # the norm only: no per-tensor gradient records
                self.seen[id(p)] = (weakref.ref(g), _version(g), _norm(g), None)
            elif rec.policy.stats:
                pending = rec._begin(g)
                self.seen[id(p)] = (weakref.ref(g), _version(g), pending, pending)
            else:
                self.seen[id(p)] = (weakref.ref(g), _version(g), _norm(g), None if rec._opt_seen else rec._begin(g))

    def flush(self) -> None:
        """Fingerprint the gradients the hook deferred, together (before any clipping)."""
        todo, self.todo = self.todo, []
        seen = self.seen
        live = [(p, g, s[0]) for p, g in todo if (s := seen.get(id(p))) is not None and s[0]() is g]
        if not live:
            return
        rec = self.rec
        t0 = time.perf_counter()
        with torch.no_grad(), _gc_paused():
            pendings = rec._begin_many([g for _, g, _ in live])
        for (p, g, ref), q in zip(live, pendings):  # (a sentinel keeps the norm only: no grad record)
            seen[id(p)] = (ref, _version(g), q, None if rec._sentinel else q)
        rec._record_s += time.perf_counter() - t0

    def after_backward(self) -> None:
        self.flush()

    def record(self, opt: torch.optim.Optimizer) -> None:
        """``opt``'s gradients as it takes them (``grad`` records; sentinel: their norms)."""
        rec = self.rec
        missing: list[str] = []
        items: list[tuple[str, str, torch.Tensor]] = []
        params: list[tuple[torch.Tensor, torch.Tensor]] = []
        have = 0
        with torch.no_grad():
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    name = rec._param_name(p, g, i)
                    grad = p.grad
                    if grad is None:
                        missing.append(name)
                        continue
                    if rec._sentinel:  # the total norm before clipping, no grad record
                        seen = self.seen.get(id(p))
                        self.pre_clip.append(seen[2] if seen is not None and seen[0]() is grad else _norm(grad))
                        have += 1
                        continue
                    items.append(("grad", name, grad))
                    params.append((p, grad))
            # a cache hit when the hook saw it unchanged
            for (p, grad), now in zip(params, rec._add_many(items)):
                seen = self.seen.get(id(p))
                if seen is not None and seen[0]() is grad and seen[2] is not None:
                    self.pre_clip.append(seen[2])
                elif now is not None:
                    self.pre_clip.append(now if rec.policy.stats else _norm(grad))
        have += len(params)
        rec._scalars["no_grad_params"] = missing
        rec._scalars["grad_params"] = have
        rec._scalars["no_gradients"] = have == 0

    def pendings(self) -> list[fpt.Pending]:
        """The fingerprints the norm before clipping still waits for (finished with the step's)."""
        return [q for q in self.pre_clip if isinstance(q, fpt.Pending)]

    def records_finished(self, done_pending: dict[int, tuple[str, dict | None]]) -> None:
        """``scalars.grad_norm``: the total norm before clipping, once the step's fingerprints are done."""
        if self.pre_clip:
            self.rec._scalars["grad_norm"] = json_float(self._pre_clip_norm(done_pending))

    def _pre_clip_norm(self, done_pending: dict[int, tuple[str, dict | None]]) -> float:
        """The total gradient norm before clipping, from the norms or the stats the step kept."""
        sq = 0.0
        norms = [q for q in self.pre_clip if isinstance(q, torch.Tensor)]  # no stats: norm tensors
        if norms and len({q.device for q in norms}) == 1:  # one host transfer, the same floats
            norm_values = iter(torch.stack(norms).to(torch.float64).tolist())  # (float32 norms widen exactly)
        else:
            norm_values = iter([float(q) for q in norms])
        for q in self.pre_clip:
            if isinstance(q, float):  # no stats, on the host already (the native kernel's)
                sq += q ** 2
                continue
            if isinstance(q, torch.Tensor):
                sq += next(norm_values) ** 2
                continue
            st = done_pending[id(q)][1]
            sq += stat_value(st["norm"]) ** 2 if st else 0.0
        return math.sqrt(sq)


register_observer("torch", "gradients", GradientsObserver, rank=10)
