"""The PyTorch recorder's step chain: the step buffer, its records in chain order, the end of a step.

``TorchChain`` is the core ``runners.torch.TorchRecorder`` builds on (the hooks and names
are there): it owns the step (its records buffered as they happen, fingerprinted on the
tensor's device, brought to the host once at the step's end and written in chain order),
the policy (detail, full steps, the disk budget) and the record budget
(``max_records_per_step``), the failure of the recorder itself, and its observers
(``runners.observers.torch_*``), built once in rank order, with one tuple per hook of the
observers that implement it (``runners.chain.flatten``).
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
import weakref
from typing import Any, Callable

import torch

from reprobisect.runners import batched_torch
from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners import staged_torch
from reprobisect.runners.chain import first_nonfinite, flatten, loss_scalars, observer_classes, unique
from reprobisect.runners.compile_torch import first_cause
from reprobisect.runners.observers.torch_common import (_KIND_RANK, _Entry, _fingerprintable, _json_float, _local,
                                                        _version, to_numpy)
from reprobisect.runners.policy import RecordPolicy, StopRun
from reprobisect.trace.format import SENTINEL_KINDS, Record, new_record

__all__ = ["TorchChain"]

_HOOKS = ("reset_step", "before_root", "training_root", "losses", "after_backward", "step_scalars", "after_step")


def _observers() -> None:
    """Import the torch observers (each registers itself, with its rank)."""
    from reprobisect.runners.observers import (torch_batches, torch_capture, torch_doctor,  # noqa: F401
                                               torch_evaluation, torch_forward, torch_gradients, torch_init,
                                               torch_loss, torch_lossgraph, torch_manual, torch_memory, torch_params)
    from reprobisect.runners.observers import rng_sources  # noqa: F401  (framework-free: unseeded generators)


class TorchChain:
    """The step chain of the PyTorch recorder (see the module docstring)."""

    def __init__(self, writer: Any, policy: RecordPolicy, *, stop_at_limit: bool = False) -> None:
        self.writer = writer
        self.policy = policy
        self._sentinel = policy.sentinel  # only the step's sentinels are recorded (RecordPolicy.detail)
        self.stop_at_limit = stop_at_limit
        self.step = 0
        self.done = False
        self.stop: StopRun | None = None
        self.notes: list[str] = []
        self.first_nonfinite: tuple[int, str] | None = None
        self.failed: str | None = None  # the recorder's own failure, if any (see runners.torch._hook)
        self._disk_used = 0
        self._capped_noted = False
        self._quiet = 0  # inside an LBFGS closure's re-evaluation: counted, not recorded
        self._scaler: "weakref.ref | None" = None
        self._opt_posts = 0  # optimizer steps taken (a GradScaler's skip takes none)
        self._opt_seen = False  # an optimizer step (or a GradScaler's skip) has happened
        self._dist: Any = None  # runners.distributed_torch.DistributedObserver, once installed
        self._zoom: Any = None
        # activations on an accelerator: one copy each, fingerprinted in batches at the step's end
        self._stage = staged_torch.Stage(with_stats=policy.stats)
        _observers()
        self.observers = {e.name: e.cls(self) for e in observer_classes("torch")}
        chain = list(self.observers.values())
        self._on = {hook: flatten(chain, hook) for hook in _HOOKS}
        self._reset_step()

    # -- step buffer --------------------------------------------------------------

    def _reset_step(self) -> None:
        self._entries: list[_Entry] = []
        self._occ: dict[tuple[str, str], int] = {}
        self._cache: dict[int, tuple[torch.Tensor, int, fpt.Pending]] = {}
        self._batch_ids: list[int] | None = None
        self._data_wait = 0.0
        self._record_s = 0.0
        self._t0: float | None = None
        self._outputs_seen = 0
        self._trained = False  # a training forward of a root ran in this step
        self._fwd_records = 0
        self._dropped = 0
        self._closure_evals = 0
        self._full = self.step in self.policy.full_steps
        self._full_bytes = 0
        self._scalars: dict[str, Any] = {}
        for reset in self._on["reset_step"]:
            reset()

    def _unique(self, kind: str, base: str) -> str:
        return unique(self._occ, kind, base)

    def _say(self, msg: str) -> None:
        """A note in the trace, said on stderr too."""
        self.notes.append(msg)
        print(f"reprobisect: {msg}", file=sys.stderr)

    def _begin(self, t: torch.Tensor) -> fpt.Pending:
        # keyed by the tensor object the hooks see (weakly: no graph is kept alive), and
        # its version counter, so an in-place change is fingerprinted again
        # (an inference tensor has no version counter: never cached)
        v = _version(t)
        hit = self._cache.get(id(t))
        if v is not None and hit is not None and hit[0]() is t and hit[1] == v:
            return hit[2]
        p = self._begin_now(t)
        if v is not None:
            self._cache[id(t)] = (weakref.ref(t), v, p)
        return p

    def _begin_now(self, t: torch.Tensor) -> fpt.Pending:
        """``t``'s fingerprint, begun now: staged (one copy, finished by ``_finish_records``)
        where the device fingerprints in batches, else at once."""
        t = _local(t)
        if staged_torch.takes(t):
            return self._stage.begin(t)
        return batched_torch.begin(t, with_stats=self.policy.stats)

    def _begin_many(self, ts: list[torch.Tensor]) -> list[fpt.Pending]:
        """``_begin`` for tensors ready at one moment: the cache misses are fingerprinted
        together (``batched_torch``: a constant number of device ops per device and dtype)."""
        out: list[Any] = [None] * len(ts)
        miss: list[tuple[int, int | None]] = []
        cache = self._cache
        for k, t in enumerate(ts):
            hit = cache.get(id(t))
            v = _version(t)
            if v is not None and hit is not None and hit[1] == v and hit[0]() is t:
                out[k] = hit[2]
            else:
                miss.append((k, v))
        begun = batched_torch.begin_many([_local(ts[k]) for k, _ in miss], with_stats=self.policy.stats)
        for (k, v), p in zip(miss, begun):
            out[k] = p
            if v is not None:
                cache[id(ts[k])] = (weakref.ref(ts[k]), v, p)
        return out

    def _add_many(self, items: list[tuple[str, str, torch.Tensor]]) -> list[fpt.Pending | None]:
        """``_add`` for parameter, gradient and optimizer-state records ready at one moment."""
        ok = [k for k, (_, _, t) in enumerate(items) if _fingerprintable(t)]
        if ok and self._t0 is None:
            self._t0 = time.perf_counter()
        pendings = self._begin_many([items[k][2] for k in ok])
        out: list[fpt.Pending | None] = [None] * len(items)
        for k, p in zip(ok, pendings):
            kind, base, t = items[k]
            out[k] = self._push(kind, self._unique(kind, base), t, pending=p)
        return out

    def _add(self, kind: str, base: str, t: torch.Tensor, *, module: str | None = None, inputs: list | None = None,
             fresh: bool = False) -> fpt.Pending | None:
        if self._sentinel and kind not in SENTINEL_KINDS:
            return None
        if not _fingerprintable(t):
            return None
        if kind in ("input", "output") and not self._room():
            return None
        return self._push(kind, self._unique(kind, base), t, module=module, inputs=inputs, fresh=fresh)

    def _push(self, kind: str, name: str, t: torch.Tensor, *, module: str | None = None, inputs: list | None = None,
              fresh: bool = False, pending: fpt.Pending | None = None) -> fpt.Pending:
        """Begin ``t``'s fingerprint (unless ``pending`` is it) and buffer it as the step's
        next record ``kind name``."""
        if self._t0 is None:
            self._t0 = time.perf_counter()
        # fresh: not from the cache (a ``p.data`` update changes values, not the version)
        if pending is None:
            pending = self._begin_now(t) if fresh else self._begin(t)
        # the pending holds everything the record needs: not the tensor, which held to the
        # step's end would outlive its backward (an activation; on CPU the allocator then took
        # fresh pages from the OS every step: 11,000 page faults a step on the example
        # transformer, 12% of its step time)
        e = _Entry(kind=kind, name=name, pending=pending, module=module, inputs=inputs, seq=len(self._entries))
        if self._full:
            self._keep_array(e, _local(t.detach()))
        self._entries.append(e)
        return pending

    def _keep_array(self, e: _Entry, t: torch.Tensor) -> None:
        # its bytes and its share of the shard's header (name, dtype, shape, offsets)
        nbytes = t.numel() * t.element_size() + len(e.kind) + len(e.name) + 96
        budget = self.policy.max_disk
        if budget is not None and self._disk_used + self._full_bytes + nbytes > budget:
            if self._full:
                self._full = False
                self._say(f"full tensors of step {self.step} not kept: they would exceed --max-disk {budget} bytes "
                          f"(trace holds {self._disk_used} bytes); raise --max-disk or keep fewer --full-steps")
                for other in self._entries:
                    other.array = None
            return
        e.array = to_numpy(t)
        if e.array is not None:
            self._full_bytes += nbytes

    def _room(self) -> bool:
        """Whether one more forward record fits in this step (``max_records_per_step``)."""
        if self._fwd_records < self.policy.max_records_per_step:
            self._fwd_records += 1
            return True
        self._dropped += 1
        if self._dropped == 1 and not self._capped_noted:
            self._capped_noted = True
            self._say(f"step {self.step} has more than {self.policy.max_records_per_step} forward records: the rest "
                      "of its activations are counted (scalars.records_dropped), not recorded; gradients and "
                      "parameters still are. Raise --max-records-per-step (RecordPolicy.max_records_per_step) to "
                      "record them")
        return False

    # -- the recorder's own failure ---------------------------------------------------

    def _internal_error(self, where: str, e: Exception) -> StopRun:
        """Record the recorder's own failure once, go quiet, and return the StopRun that
        ends the probe as ``infra``."""
        if self.failed is None:
            self.failed = f"{where.lstrip('_')}: {first_cause(e)}"  # the original error, not a later one it caused
            detail = (f"reprobisect's recorder failed at step {self.step} ({self.failed}); a reprobisect bug, "
                      "not your program's: this probe is no evidence either way")
            self._say(detail)
            self.done = True
            self._cache.clear()
            self.stop = StopRun("recorder_error", self.step, detail, traceback.format_exc())
        assert self.stop is not None
        return self.stop

    def guarded(self, where: str, fn: Callable, *args: Any, stop_now: bool = True, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, its failure being the recorder's own (see ``_hook``):
        noted, and the run stopped as ``infra`` (``stop_now``: at once; else at the next
        forward or optimizer hook). Runners' callbacks (Lightning's) call through this."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # StopRun and KeyboardInterrupt are BaseExceptions: they pass
            stop = self._internal_error(where, e)
            if self.stop_at_limit and stop_now:
                raise stop from None
            return None

    def _raise_if_failed(self) -> None:
        if self.failed is not None and self.stop_at_limit and self.stop is not None:
            raise self.stop

    # -- end of step --------------------------------------------------------------

    def _end_step(self, opt: torch.optim.Optimizer | None) -> None:
        if torch.cuda.is_initialized():  # CUDA runs asynchronously: the step's time includes its device work
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        if self._dist is not None:
            self._dist.end_step()  # the step's collectives (and a distributed run's buffers)
        self.observers["batches"].settle()
        t_fin = time.perf_counter()
        records, done_pending = self._finish_records()
        self.observers["gradients"].records_finished(done_pending)
        scalars = self._step_scalars(records)
        self._record_s += time.perf_counter() - t_fin
        if self._t0 is not None:
            wall = t_end - self._t0
            scalars["data_wait_s"] = round(self._data_wait, 6)
            scalars["record_s"] = round(self._record_s, 6)
            scalars["compute_s"] = round(max(0.0, wall - self._data_wait - self._record_s), 6)
        self._write(records, scalars)
        step = self.step
        for after in self._on["after_step"]:
            after(step, opt)
        self.step += 1
        self._reset_step()
        first_bad = scalars.get("first_nonfinite")
        if first_bad and self.policy.stop_on_nonfinite:
            self._finish(StopRun("nonfinite", step, f"first non-finite value at step {step}: {first_bad}"))
        elif self.step >= self.policy.steps:
            self._finish(StopRun("ok", step, f"recorded {self.step} step(s)"))

    def _write(self, records: list[tuple[_Entry, Record]], scalars: dict[str, Any]) -> None:
        """The step's records (then op-level zoom's) and scalars into the trace."""
        self.writer.begin_step(self.step)
        zoom_records = self._zoom_records()
        for e, rec in records:
            self.writer.record(rec, e.array)
        for rec in zoom_records:
            self.writer.record(rec)
        self.writer.end_step(scalars, batch_ids=self._batch_ids)
        if self.policy.max_disk is not None:  # a walk of the whole trace: only a budget needs it
            self._disk_used = self._trace_bytes()

    def _finish_records(self) -> tuple[list[tuple[_Entry, Record]], dict[int, tuple[str, dict | None]]]:
        """The step's records in trace order, and every finished pending by id (fingerprint, stats)."""
        records: list[tuple[_Entry, Record]] = []
        self._stage.flush()  # the staged activations' fingerprints, in a few batches
        # every distinct pending of the step, finished together: one host transfer per device
        todo: dict[int, fpt.Pending] = {}
        for e in self._entries:
            if e.pending is not None:
                todo.setdefault(id(e.pending), e.pending)
            for q in e.inputs or ():
                todo.setdefault(id(q), q)
        for q in self.observers["gradients"].pendings():
            todo.setdefault(id(q), q)
        done_pending: dict[int, tuple[str, dict | None]] = dict(zip(todo, fpt.finish_many(list(todo.values()))))
        # in trace order, each record made with its place (the writer then keeps it as it is)
        entries = sorted(self._entries, key=lambda e: e.chain or (_KIND_RANK[e.kind], e.seq))
        for order, e in enumerate(entries):
            if e.record is not None:
                records.append((e, e.record))
                continue
            p = e.pending
            assert p is not None
            f, st = done_pending[id(p)]
            ins = None
            if e.inputs is not None:
                ins = tuple(done_pending[id(q)][0] for q in e.inputs)
            rec = new_record(e.name, e.kind, p.dtype, p.shape, f, order, st, e.module, ins, e.meta)
            records.append((e, rec))
        return records, done_pending

    def _step_scalars(self, records: list[tuple[_Entry, Record]]) -> dict[str, Any]:
        """The step's scalars: its loss, the norm the optimizer saw, what the step noted, each
        observer's (in chain order), then the recorder's own counts and the first non-finite record."""
        s = loss_scalars([r for _, r in records if r.kind == "loss"], each=True)
        if self.policy.stats:
            norms = [r.stat("norm") for _, r in records if r.kind == "grad"]
            if norms and all(n is not None for n in norms):
                s["grad_norm_at_step"] = _json_float(math.sqrt(sum(n * n for n in norms)))  # type: ignore[operator]
        s.update(self._scalars)
        for add in self._on["step_scalars"]:
            add(s)
        if self._closure_evals:
            s["closure_evaluations"] = self._closure_evals
        if self._dropped:
            s["records_dropped"] = self._dropped
            s["max_records_per_step"] = self.policy.max_records_per_step
        # a GradScaler's skipped step: scaled gradients overflowing is what it skips the step for
        first_bad = first_nonfinite((r for _, r in records), skip_grads=bool(self._scalars.get("scaler_skipped")))
        if first_bad:
            s["first_nonfinite"] = first_bad
            if self.first_nonfinite is None:
                self.first_nonfinite = (self.step, first_bad)
        return s

    def _finish(self, stop: StopRun) -> None:
        self.done = True
        self._cache.clear()
        if self.stop_at_limit and self.policy.defer_stop and stop.reason == "ok":
            from reprobisect.runners.preempt_torch import defer  # bisect resume: after the step's own code

            return defer(self, stop)
        self.stop = stop
        if self.stop_at_limit:
            raise stop

    def _zoom_records(self) -> list[Record]:
        if self._zoom is None:
            return []
        try:
            return list(self._zoom.take()) + list(getattr(self._zoom, "take_calls", list)())
        except NotImplementedError:
            return []

    def _trace_bytes(self) -> int:
        total = 0
        for root, _, files in os.walk(self.writer.path):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass
        return total


