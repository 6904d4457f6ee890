"""What a distributed PyTorch run sends between ranks, recorded as ``collective`` records.

Installed by the torch recorder (``TorchRecorder.install``) in every process; it does
nothing until ``torch.distributed`` is used. Then it records:

- **the rank** (``extra.distributed`` of the shard's manifest and ``environment.
  distributed``: rank, local rank, world size, backend, device; see
  ``runners.environment.distributed_info``);
- **DDP gradient buckets**: a DDP communication hook, registered at the wrapped model's
  first forward without any change to the user's code (``DistributedDataParallel.
  __init__`` is wrapped to remember the model). The hook does what DDP's built-in
  all-reduce does, bit for bit: the bucket is scaled by ``1 / world size`` (a multiply by
  the double reciprocal, as DDP's reducer does without a hook) and summed with one
  all-reduce. A hook the user registers is kept and observed (wrapped), not replaced; a
  built-in hook the user registers (``register_builtin_comm_hook``) is left alone (its
  buckets are then not recorded);
- **c10d collectives**: ``all_reduce``, ``broadcast``, ``all_gather``,
  ``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``, ``reduce``
  and FSDP2's ``all_gather_single``/``reduce_scatter_single``, called through
  ``torch.distributed`` (FSDP2, hand-written synchronisation);
- **DistributedSampler epochs**: each epoch a ``DistributedSampler`` hands this rank
  (settings and index set, ``sampler_epoch``) goes to the shard's ``extra.samplers``, so
  that ``core.distributed`` can count samples no rank draws or several ranks draw.

Each collective gives two records, ``NAME/in`` (what this rank put in, fingerprinted
before the call) and ``NAME/out`` (what it got back, fingerprinted when the call
completed): ``ddp.bucket3/in``, ``all_reduce.0/out`` (the k-th call of that op in the
step; ``#1`` marks a bucket's second reduction in a step). ``meta`` says ``op``, ``io``
and, for DDP, ``bucket``. They are recorded at the end of the step they happened in, each
where it happened in chain order: a call made before the step's loss (FSDP2's parameter
all-gathers in the forward) just before the first record made after it (the activation it
feeds); everything of the backward (DDP's buckets, reduce-scatters) after the loss and
before the gradients (``trace.format.KINDS``). So compare tells a difference that
*originates* on a rank (its input differs) from one that *arrives* through a collective
(its input agrees, its output does not).

Besides: the model's buffers (BatchNorm running statistics) are recorded after each step
as ``param`` records (``meta.buffer``) in a distributed run only, since ranks whose
buffers drift apart break DDP's invariant without touching any parameter.

Observers observe: fingerprints read tensors and never write them; the comm hook only
replaces DDP's built-in one with the same arithmetic (tests/test_distributed.py checks a
recorded DDP run's parameters equal an unrecorded one's).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

import torch

from reprobisect.runners import fingerprint_torch as fpt

__all__ = ["DistributedObserver", "install"]

_C10D_OPS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
             "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "reduce")
_MARK = "_reprobisect_observed"


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:  # a torch built without distributed support
        return None
    return dist if dist.is_available() else None


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out: list[torch.Tensor] = []
        for y in x:
            out.extend(_tensors(y))
        return out
    return []


def _io(op: str, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors a c10d call reads and the ones it writes (first positional arguments)."""
    def arg(i: int, name: str) -> Any:
        return args[i] if len(args) > i else kwargs.get(name)

    if op in ("all_reduce", "broadcast", "reduce"):
        t = _tensors(arg(0, "tensor"))
        return t, t
    if op == "all_gather":
        return _tensors(arg(1, "tensor")), _tensors(arg(0, "tensor_list"))
    if op in ("all_gather_into_tensor", "all_gather_single"):
        return _tensors(arg(1, "input_tensor")), _tensors(arg(0, "output_tensor"))
    if op == "reduce_scatter":
        return _tensors(arg(1, "input_list")), _tensors(arg(0, "output"))
    if op in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return _tensors(arg(1, "input")), _tensors(arg(0, "output"))
    return [], []


def _one(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensors of one side of a call as one tensor to fingerprint (a flat concatenation of several)."""
    ts = [t for t in ts if t.layout == torch.strided]
    if not ts:
        return None
    if len(ts) == 1:
        return ts[0].detach()
    with torch.no_grad():
        return torch.cat([t.detach().reshape(-1) for t in ts])


class DistributedObserver:
    """Records the collectives of one process into its ``TorchRecorder`` (see the module docstring)."""

    def __init__(self, recorder: Any) -> None:
        self.rec = recorder
        self.lock = threading.Lock()
        self.pending: list[tuple[str, str, str, fpt.Pending, dict[str, Any]]] = []
        self.counts: dict[str, int] = {}
        self.undo: list[Callable[[], None]] = []
        self.models: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.info: dict[str, Any] | None = None
        self.user_builtin = False
        self.samplers: list[dict[str, Any]] = []  # DistributedSampler epochs (sampler_epoch)
        self.sampler_ids: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self.samplers_changed = False
        self.local = threading.local()  # .in_hook: inside a DDP comm hook (its own c10d calls are the bucket's)

    # -- install ----------------------------------------------------------------

    def install(self) -> "DistributedObserver":
        dist = _dist()
        if dist is None:
            return self
        for op in _C10D_OPS:
            orig = getattr(dist, op, None)
            if orig is None or getattr(orig, _MARK, False):
                continue
            self._patch(dist, op, self._c10d(op, orig))
        self._wrap_sampler()
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except ImportError:
            return self
        self._wrap_ddp(DDP)
        return self

    def _wrap_sampler(self) -> None:
        """Note what each ``DistributedSampler`` epoch hands this rank (see ``sampler_epoch``)."""
        try:
            from torch.utils.data.distributed import DistributedSampler
        except ImportError:
            return
        obs, orig = self, DistributedSampler.__dict__.get("__iter__")
        if orig is None or getattr(orig, _MARK, False):
            return

        def __iter__(sampler: Any) -> Any:
            it = orig(sampler)
            if type(sampler).__iter__ is __iter__ and not obs.rec.done:  # not a subclass's own order
                try:
                    obs._note_sampler(sampler, orig)
                except Exception:  # a courtesy: never break the user's data loading
                    pass
            return it

        setattr(__iter__, _MARK, True)
        __iter__.__wrapped__ = orig  # type: ignore[attr-defined]
        __iter__.__doc__ = orig.__doc__
        self._patch(DistributedSampler, "__iter__", __iter__)

    def _note_sampler(self, sampler: Any, orig: Callable) -> None:
        with self.lock:
            k = self.sampler_ids.setdefault(sampler, len(self.sampler_ids))
            if k >= _MAX_SAMPLERS or len(self.samplers) >= _MAX_SAMPLER_NOTES:
                return
        note = sampler_epoch(sampler, orig, k, self.rec.step)
        with self.lock:
            self.samplers.append(note)
            self.samplers_changed = True

    def remove(self) -> None:
        while self.undo:
            self.undo.pop()()

    def _patch(self, owner: Any, attr: str, new: Callable) -> None:
        old = owner.__dict__[attr]
        setattr(owner, attr, new)
        self.undo.append(lambda: setattr(owner, attr, old))

    def _wrap_ddp(self, DDP: Any) -> None:
        obs = self
        init, register = DDP.__init__, DDP.register_comm_hook
        builtin_name = next((n for n in ("_register_builtin_comm_hook", "register_builtin_comm_hook")
                             if n in DDP.__dict__), None)
        builtin = DDP.__dict__[builtin_name] if builtin_name else None

        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            init(ddp, *args, **kwargs)
            obs.models.add(ddp)
            ddp.__dict__["_reprobisect_hook"] = None  # none yet: ours goes in at the first forward
            ddp.__dict__["_reprobisect_pre"] = ddp.register_forward_pre_hook(obs._first_forward)

        def register_comm_hook(ddp: Any, state: object, hook: Callable) -> None:
            ddp.__dict__["_reprobisect_hook"] = "user"
            return register(ddp, state, obs.observed(hook, ddp))

        def register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
            ddp.__dict__["_reprobisect_hook"] = "builtin"
            obs.user_builtin = True
            return builtin(ddp, comm_hook_type)

        todo = [("__init__", __init__, init), ("register_comm_hook", register_comm_hook, register)]
        if builtin_name:
            todo.append((builtin_name, register_builtin_comm_hook, builtin))
        for name, fn, old in todo:
            fn.__wrapped__ = old  # type: ignore[attr-defined]
            fn.__doc__ = old.__doc__
            self._patch(DDP, name, fn)

    def _first_forward(self, ddp: Any, args: Any) -> None:
        handle = ddp.__dict__.pop("_reprobisect_pre", None)
        if handle is not None:
            handle.remove()  # once: the hook is in (or the user's is)
        if ddp.__dict__.get("_reprobisect_hook") is not None or self.rec.done:
            return
        ddp.__dict__["_reprobisect_hook"] = "ours"
        try:
            DDP = type(ddp)
            register = getattr(DDP.register_comm_hook, "__wrapped__", DDP.register_comm_hook)
            register(ddp, ddp.process_group, self.observed(_allreduce_like_ddp, ddp))
        except Exception as e:  # never break the user's training for an observation
            self.rec.notes.append(f"DDP gradient buckets not recorded: {type(e).__name__}: {e}")

    # -- recording --------------------------------------------------------------

    def _name(self, base: str) -> str:
        k = self.counts.get(base, 0)
        self.counts[base] = k + 1
        return base if k == 0 else f"{base}#{k}"

    def _at(self) -> tuple[list, int]:
        """Where the step's records stand now (the step's entry list, how many it holds)."""
        entries = self.rec._entries
        return entries, len(entries)

    def _add(self, name: str, io: str, t: torch.Tensor | None, meta: dict[str, Any],
             at: tuple[list, int] | None = None) -> None:
        if t is None or self.rec.done or getattr(self.rec, "_quiet", 0) or getattr(self.rec, "_sentinel", False):
            return
        at = at if at is not None else self._at()
        with torch.no_grad():
            p = fpt.begin(t, with_stats=self.rec.policy.stats)
        with self.lock:
            self.pending.append((name, io, f"{name}/{io}", p, {**meta, "io": io}, at))

    def observed(self, hook: Callable, ddp: Any) -> Callable:
        """``hook`` with what enters and leaves each bucket recorded (its result unchanged)."""
        obs = self

        def observed_hook(state, bucket):  # no annotations: DDP checks them against its own types
            idx = bucket.index()
            with obs.lock:
                name = obs._name(f"ddp.bucket{idx}")
            meta = {"op": "ddp_allreduce", "bucket": idx}
            obs._add(name, "in", bucket.buffer(), meta)
            obs.local.in_hook = True
            try:
                fut = hook(state, bucket)
            finally:
                obs.local.in_hook = False

            def done(f: Any) -> Any:
                out = f.value()
                obs._add(name, "out", _one(_tensors(out)), meta)
                return out

            return fut.then(done)

        observed_hook.__qualname__ = getattr(hook, "__qualname__", "hook")
        return observed_hook

    def _c10d(self, op: str, orig: Callable) -> Callable:
        obs = self

        def call(*args: Any, **kwargs: Any) -> Any:
            if obs.rec.done or getattr(obs.local, "in_hook", False):
                return orig(*args, **kwargs)
            ins, outs = _io(op, args, kwargs)
            with obs.lock:
                k = obs.counts.get(op, 0)
                obs.counts[op] = k + 1
            name, meta = f"{op}.{k}", {"op": op}
            at = obs._at()  # its place in the step: where the call was made (the output goes with it)
            obs._add(name, "in", _one(ins), meta, at)
            work = orig(*args, **kwargs)
            if work is not None and hasattr(work, "get_future"):  # async_op=True: recorded when it completes
                try:
                    work.get_future().then(lambda f: obs._add(name, "out", _one(outs), meta, at))
                except Exception:  # a backend without futures: the output is not recorded
                    pass
            else:
                obs._add(name, "out", _one(outs), meta, at)
            return work

        setattr(call, _MARK, True)
        call.__wrapped__ = orig  # type: ignore[attr-defined]
        call.__doc__ = orig.__doc__
        call.__name__ = op
        return call

    # -- end of a step ----------------------------------------------------------

    def end_step(self) -> None:
        """Called by the recorder when a step ends: buffer the step's collective records
        (and, in a distributed run, the model's buffers after the step)."""
        with self.lock:
            items, self.pending, self.counts = self.pending, [], {}
        dist = _dist()
        active = dist is not None and dist.is_initialized()
        if active and self.info is None:
            self._note_info()
        if self.samplers_changed and active and dist.get_world_size() > 1:  # a flat trace stays as it was
            self.samplers_changed = False
            self._note_samplers()
        for _name, _io_, full, p, meta, at in items:
            self.rec.add_pending("collective", full, p, meta, chain=self._chain(at))
        if active and dist.get_world_size() > 1 and not getattr(self.rec, "_sentinel", False):
            self._buffers()

    def _chain(self, at: tuple[list, int]) -> tuple[int, float] | None:
        """The chain place of a collective called before the step's loss (FSDP's parameter
        all-gathers in the forward): just before the first record made after the call (the
        activation it feeds). None: its kind's place (after the loss, before the gradients),
        where DDP's gradient buckets and everything of the backward go."""
        entries, n = at
        if entries is not self.rec._entries:  # made in another step's records
            return None
        if any(e.kind == "loss" for e in entries[:n]):
            return None
        nxt = next((e for e in entries[n:] if e.kind != "collective"), None)
        if nxt is None:
            return None
        from reprobisect.trace.format import KINDS

        return (KINDS.index(nxt.kind), nxt.seq - 0.5)

    def _buffers(self) -> None:
        root = self.rec.primary_module()
        if root is None:
            return
        items = [("param", name, b) for name, b in root.named_buffers() if isinstance(b, torch.Tensor)]
        n = len(self.rec._entries)
        self.rec._add_many(items)
        for e in self.rec._entries[n:]:
            e.meta = {"buffer": True}

    def _writer(self) -> Any:
        """The writer whose manifest ``extra`` can be updated (the bootstrap's lazy writer is
        opened: the step being ended is written to it now anyway), or None."""
        writer = self.rec.writer
        if not hasattr(writer, "update_extra") and callable(getattr(writer, "open", None)):
            try:
                writer = writer.open()
            except Exception:
                return None
        return writer if hasattr(writer, "update_extra") else None

    def _note_samplers(self) -> None:
        writer = self._writer()
        if writer is not None:
            with self.lock:
                notes = list(self.samplers)
            writer.update_extra({"samplers": notes})  # beside extra.distributed, which keeps its five keys

    def _note_info(self) -> None:
        from reprobisect.runners.environment import distributed_info

        info = distributed_info()
        if info is None:
            return
        self.info = info
        short = {k: info.get(k) for k in ("rank", "local_rank", "world_size", "backend", "device")}
        self.rec.environment_extra["distributed"] = info
        writer = self._writer()
        if writer is not None:
            old = writer.extra.get("distributed") if hasattr(writer, "extra") else None
            writer.update_extra({"distributed": {**(old if isinstance(old, dict) else {}), **short}})


_MAX_SAMPLERS = 4  # samplers noted per process (a training and an evaluation loader, ...)
_MAX_SAMPLER_NOTES = 8  # epochs noted, all samplers together
_MAX_BITMAP = 1 << 18  # datasets up to 262144 samples: the epoch's index set as a bitmap (64 KiB of hex)


def sampler_epoch(sampler: Any, orig_iter: Callable, k: int, step: int) -> dict[str, Any]:
    """What one ``DistributedSampler`` epoch hands this rank: the sampler's settings and,
    for a dataset of up to ``_MAX_BITMAP`` samples, the set of indices as a bitmap (hex,
    bit i = sample i), so that the ranks' sets can be checked to cover the dataset.

    ``orig_iter(sampler)`` is run once more for the indices: ``DistributedSampler`` draws
    them from its own generator seeded with ``seed + epoch``, so no random state of the
    program moves (only a sampler class of torch's own, not a subclass, is asked).
    """
    n = len(sampler.dataset)
    note: dict[str, Any] = {
        "sampler": k, "step": int(step), "epoch": int(getattr(sampler, "epoch", 0)), "dataset_len": n,
        "num_replicas": int(sampler.num_replicas), "rank": int(sampler.rank), "seed": int(sampler.seed),
        "shuffle": bool(sampler.shuffle), "drop_last": bool(sampler.drop_last),
        "num_samples": int(sampler.num_samples), "total_size": int(sampler.total_size),
    }
    if n <= _MAX_BITMAP:
        idx = [int(i) for i in orig_iter(sampler)]
        bits = bytearray((n + 7) // 8)
        for i in idx:
            if 0 <= i < n:
                bits[i >> 3] |= 1 << (i & 7)
        note["drawn"] = len(idx)
        note["indices"] = bytes(bits).hex()
    return note


def _allreduce_like_ddp(process_group: Any, bucket: Any) -> Any:
    """DDP's own gradient all-reduce, as a comm hook: scale by the double reciprocal of the
    world size (what the reducer does when no hook is registered), then sum."""
    import torch.distributed as dist

    buf = bucket.buffer()
    group = process_group if process_group is not None else dist.group.WORLD
    buf.mul_(1.0 / group.size())
    work = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)(buf, group=group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0])


def install(recorder: Any) -> DistributedObserver | None:
    """Install the observer for ``recorder`` (None when torch has no distributed support)."""
    if _dist() is None:
        return None
    if os.environ.get("REPROBISECT_NO_DISTRIBUTED") == "1":
        return None
    obs = DistributedObserver(recorder)
    try:
        return obs.install()
    except Exception as e:  # never break the user's run for an observation
        obs.remove()
        recorder.notes.append(f"collectives not recorded: {type(e).__name__}: {e}")
        return None
