"""The PyTorch recorder: one training step's chain, recorded from global hooks.

Runs inside the user's process (the launcher installs it when the script imports torch;
``reprobisect.torch.record`` installs it around explicit code). Nothing in the user's
code changes: every observation comes from hooks PyTorch offers globally.

What a step is: one optimizer update (or, in a loop without ``torch.optim``, one
parameter update after a backward pass), with what trains into it: the batches, forward
passes and losses that lead to it, its gradients, the parameters after it. A forward pass
*trains* when gradients are enabled and inference mode is off (and no runner has named an
evaluation phase); one under ``no_grad``/``inference_mode`` (validation, test, sanity
checks, metrics, nanoGPT's ``estimate_loss``) is *evaluation*: never a record, so never a
training divergence by itself, but summarised (below). A forward with gradients on in
``model.eval()`` mode trains (fine-tuning with frozen batch norm does that) unless the
root has trained in ``train()`` mode before: then it is evaluation (an evaluation loop
that forgot ``no_grad``; phase ``eval_mode``). A ``no_grad``
forward inside a training iteration (a distillation teacher, a DQN target network) is
summarised as evaluation too; what it feeds into the loss shows at ``loss``.

What is observed, and how:

- ``init``: the parameters before the first update (step 0 only), at the first training
  forward of each root, named like ``param``. First in chain order: an unseeded or
  changed initialization is the first divergence, named as such.
- ``batch``: ``_BaseDataLoaderIter._next_index`` is wrapped to queue the indices each
  batch was built from (FIFO per iterator, so prefetching workers with ``num_workers>0``,
  custom samplers and batch samplers all work); ``__next__`` pops them when the batch is
  handed to the loop. Records ``ids`` (int64 indices) and ``data[i]`` (each tensor of the
  batch). Indices that are not integers are left out; the content fingerprint remains.
  Assumes the loader returns batches in order (``in_order=True``, the default).
  A batch is drawn before anyone knows whether it trains, so it is attributed lazily: drawn
  under ``no_grad``/``inference_mode`` or in a runner's evaluation phase, it is evaluation;
  else it waits, and the next training forward of a root claims every waiting batch that
  root did not evaluate (a teacher's or target network's ``no_grad`` forward does not make
  the batch evaluation). A waiting batch an evaluation forward used becomes evaluation when
  its loader draws again, or at the step's end. With ``prefetch`` (Lightning, whose fetcher
  draws one batch ahead) the runner claims the oldest waiting batch per loader at each
  training batch, and the one drawn ahead waits for its step. Limits: a training batch
  drawn inside ``no_grad`` is evaluation; an evaluation of another root (an EMA copy) on a
  batch drawn with gradients on, right before a training forward, is claimed by it; a
  loader wrapper that draws ahead without telling (Accelerate's ``DataLoaderShard``) puts
  the batch drawn ahead into the step it was drawn in.
- ``input`` / ``activation`` / ``output``: global module forward pre-hooks and hooks.
  A module called with no module on the call stack is a *root*; the first root seen is
  the model, named ``""`` (its submodules by their path, ``layers.0.attn``); later roots
  (a loss module, a second model) are prefixed with their class name. Every training
  call of the model (each micro-batch: ``input``, ``input#1``) and a step's first root call
  record their tensor arguments as ``input``; the model's own result is
  ``output``; every other module's result is an ``activation`` named by its path, with
  ``#k`` for its k-th repeat call in the step and ``[i]`` for the i-th tensor of a
  structured result. Each activation carries the fingerprints of its tensor inputs.
  At most ``policy.max_records_per_step`` input/activation/output records a step; past it
  the rest are counted (``scalars.records_dropped``) and noted, gradients and parameters
  still recorded.
- ``loss``: ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped;
  the tensors backward starts from are the loss, one record per backward as the script
  computed it (``loss``, ``loss#1``, ... with accumulation, each micro-loss as passed to
  backward, e.g. already divided by the number of micro-batches). With a GradScaler that
  is the scaled loss; ``scalars.scaler_scale`` says by how much.
- ``grad``: each parameter's ``.grad`` at the optimizer's step pre-hook (as it enters
  the optimizer, after any clipping). ``scalars.grad_norm`` is the total norm *before
  clipping*, from per-parameter post-accumulate-grad hooks; ``grad_norm_at_step`` the
  norm the optimizer saw. ``scalars.no_grad_params`` lists the optimizer's parameters
  that had no gradient, and ``scalars.no_gradients`` is true when none had one (a loss
  computed from detached tensors): this is the flag compare and doctor read.
- ``param`` / ``optim_state``: at the step post-hook, every parameter of the optimizer
  and every tensor in its state (``fc.weight/exp_avg``); ``scalars.lr`` per group.

Evaluation, summarised where compare does not look for its verdict: ``scalars["eval"]``
of the step it ran before (after the previous step), one entry per run of consecutive
evaluation: ``phase`` (``no_grad``, ``inference_mode``, or a runner's name: Lightning's
``sanity_check``, ``validation``, ``test``, ``predict``), ``after_step`` (None before the
first step), ``forwards`` (root forward passes), ``batches`` and ``samples`` (DataLoader
batches and their indices), ``ids_fingerprint`` (of the indices, in order),
``outputs_fingerprint`` (of the first ``outputs_fingerprinted`` root outputs, at most 16).
Evaluation after the last written step (a test after fit) goes into the manifest's
``extra["eval_after_last_step"]``.

Loops without ``torch.optim`` (an update by hand: ``p.data.add_(p.grad, alpha=-lr)``,
``p -= lr * p.grad`` under ``no_grad``): until an optimizer step is seen, each backward
notes the parameters that have gradients (version counter and sum); the next training
forward (or the program's end, ``finish_manual``) that finds one of them changed ends a
step: ``grad`` as backward left it (before any clipping the loop does), ``param`` after
the update, ``scalars.manual_update``. Backward passes with no update accumulate into the
step. 200 backward passes with no update and no optimizer (more than accumulation usually takes) end
the run as ``no_steps``.

Scalars per step: ``loss`` (the loss record when the step has one; with accumulation the
sum of its micro-losses, which is the mean loss when each was divided by their number, and
``losses``, each), ``lr`` (per group), ``grad_norm`` (before clipping), ``grad_norm_at_step``, ``grad_params``,
``no_grad_params``, ``no_gradients``, ``frozen_params`` (step 0, only when some are: the
``init`` parameters with ``requires_grad=False``), ``scaler_scale`` (GradScaler, when enabled),
``scaler_skipped`` (true on a step whose inf/NaN gradients made the GradScaler skip
``optimizer.step()``: the step has no ``param``/``optim_state`` records, and its
gradients do not count as ``first_nonfinite``),
``data_wait_s`` (time inside the DataLoader's ``__next__``), ``record_s`` (time in the
recorder's hooks), ``compute_s`` (the step's wall time minus both),
``cuda_memory_allocated``/``_reserved`` (only when CUDA is initialised: no CUDA call is
made otherwise), ``eval_mode_layers`` (only when some are: the model's dropout/batch-norm
layers in eval mode during its training forward; ``eval_mode_dropout``, the dropout ones among them; an evaluation run's ``train_mode_layers``
are those in training mode under ``no_grad``/``inference_mode``), ``loss_broadcast``
and ``loss_probabilities`` (step 0, only when found: an op of the loss expression
that broadcast ``[N,1]`` against ``[N]`` to ``[N,N]``; a loss on logits fed a softmax or sigmoid), and ``first_nonfinite`` (``kind 'name'`` of the first record holding a
NaN/Inf, in chain order).

Detail (``RecordPolicy.detail``): ``full`` records all of the above. ``sentinel`` records
per step only what is cheap and still tells two runs apart: ``init`` (step 0), ``batch``
(IDs and tensors), ``loss``, ``param`` after the step, and the scalars ``grad_norm`` (from a
norm per gradient at its accumulation hook, no fingerprint), ``lr`` and ``scaler_scale``;
no inputs, activations, outputs, per-tensor gradients or optimizer state. Complete state is
captured after every ``state_every``-th step (default 50), so that a replay can start near
the first differing step and record it at full detail.

A step ends at each ``optimizer.step()`` (of any optimizer; a GAN's two optimizers
give two steps). ``step(closure)``: the closure's first evaluation is recorded (its
gradients right after it); further evaluations inside the same step (LBFGS) are counted in
``scalars.closure_evaluations``, not recorded. Records are buffered during the step, fingerprinted on the tensor's
device as they happen (``fingerprint_torch.begin``) and brought to the host once, at the
end of the step, then written in chain order (``KINDS``). Observers observe: everything
is read through ``detach()`` under ``no_grad``; nothing is written back, no graph is kept.
The first ``torch.manual_seed`` the program calls (``seed_everything`` calls it) is kept
as ``seed``; the launcher writes it as the manifest's seed when it was given none.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
import sys
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from reprobisect.runners import batched_torch
from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners import staged_torch
from reprobisect.runners.compile_torch import first_cause, unwrap, user_path
from reprobisect.trace import record_array
from reprobisect.runners.policy import RecordPolicy, StopRun
from reprobisect.trace.format import KINDS, SENTINEL_KINDS, Record, new_record, stat_value

__all__ = ["RecordPolicy", "StopRun", "TorchRecorder", "to_numpy"]

_KIND_RANK = {k: i for i, k in enumerate(KINDS)}


def to_numpy(t: torch.Tensor) -> np.ndarray | None:
    """A host copy of ``t`` as NumPy (bfloat16/float8 through ml_dtypes); None if unsupported."""
    import ml_dtypes

    t = t.detach()
    views = {
        torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
        torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
        torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
    }
    c = t.to("cpu", copy=True).contiguous()
    if t.dtype in views:
        raw, np_dtype = views[t.dtype]
        return c.view(raw).numpy().view(np_dtype)
    if t.dtype in (torch.complex32, torch.uint16, torch.uint32, torch.uint64) or t.is_sparse:
        return None
    try:
        return c.numpy()
    except (TypeError, RuntimeError):
        return None


@dataclass(slots=True)
class _Entry:
    kind: str
    name: str
    pending: fpt.Pending | None = None
    module: str | None = None
    inputs: list[fpt.Pending] | None = None
    array: np.ndarray | None = None
    record: Record | None = None  # already finished (batch ids)
    seq: int = 0
    meta: dict[str, Any] | None = None  # the record's meta (collectives, buffers: runners.distributed_torch)
    chain: tuple[int, float] | None = None  # its place in chain order when not its kind's (a forward collective)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if type(obj) is tuple and all(isinstance(x, torch.Tensor) for x in obj):  # a module's usual args
        return list(obj)
    try:
        from torch.utils._pytree import tree_flatten

        leaves, _ = tree_flatten(obj)
    except Exception:
        return []
    return [x for x in leaves if isinstance(x, torch.Tensor)]


_SMALL_GRAD_BYTES = 64 << 10


def _small_on_cpu(g: torch.Tensor) -> bool:
    """A CPU gradient small enough to fingerprint with the others when backward returns: a
    call of its own costs more Python (~10 us) than reading its bytes again (<= 64 KiB);
    a larger one is read at its hook, while backward has it in cache. Not in a distributed
    run: there backward returns after DDP averaged the gradients, and the norm before
    clipping would mix small gradients averaged with large ones as this rank computed them."""
    if not g.is_cpu or g.numel() * g.element_size() > _SMALL_GRAD_BYTES:
        return False
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized())


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, or None for a tensor without one (an inference tensor)."""
    if t.is_inference():
        return None
    try:
        return t._version
    except RuntimeError:
        return None


class _NoGrad:
    """``torch.no_grad()`` for the hooks run at every module call and gradient: the same
    switch without its decorator machinery (0.4 against 1.4 us a use)."""

    __slots__ = ("prev",)

    def __enter__(self) -> None:
        self.prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)

    def __exit__(self, *exc: Any) -> None:
        torch._C._set_grad_enabled(self.prev)


def _training() -> bool:
    """Whether a forward pass now can train: gradients on, not inference mode."""
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


@dataclass
class _Batch:
    """A batch drawn with gradients enabled, not yet known to train (see ``_claim``)."""

    it: int  # id of its DataLoader iterator
    ids: np.ndarray | None
    tensors: list[tuple[int, fpt.Pending, torch.Tensor]]  # (index in the batch, fingerprint, tensor)
    seen_by: set[int]  # roots that ran an evaluation forward while it was pending
    run: dict[str, Any] | None = None  # the evaluation run that first used it


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a distributed tensor (FSDP2's DTensor parameters: the local shard);
    any other tensor itself."""
    if type(t) is torch.Tensor:
        return t
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None and hasattr(t, "device_mesh") else t


def _fingerprintable(t: torch.Tensor) -> bool:
    return not (t.is_sparse or t.is_nested or t.is_meta or getattr(t, "is_mkldnn", False)) and t.layout == torch.strided


ACTIVE: "TorchRecorder | None" = None
"""The recorder installed in this process, if any (Lightning's callback factory asks)."""


_is_compiling = torch.compiler.is_compiling

EAGER: dict[str, Callable] = {}
"""Hook name -> its call wrapped in ``torch.compiler.disable``, filled on the first
``torch.compile`` call (``compile_torch.install_compile_watch``). From then on the step
hooks always run through it: one that dynamo traces (a training step compiled whole) runs
eagerly behind a graph break at a step boundary instead of being traced to nothing, and
one called eagerly from a compiled frame (after a graph break) does not have its own
frames compiled one by one (fingerprints must be computed as in eager)."""


def _hook(fn: Callable) -> Callable:
    """A recorder hook: its own failure must never read as the user's program crashing (a
    reprobisect bug is no evidence about their code, and a search would blame a commit for
    it). It ends the probe as ``infra`` instead: raised at once from Python-level hooks,
    from the autograd engine's gradient hook at the next forward or optimizer hook.

    Under torch.compile it stays out of the graph: the forward hooks trace to nothing
    (no graph break inside the user's model: ``runners.compile_torch``); the step hooks
    call their ``EAGER`` version."""
    name = fn.__name__

    @functools.wraps(fn)
    def hook(self: "TorchRecorder", *args: Any, **kwargs: Any) -> Any:
        eager = EAGER.get(name)
        if eager is not None:  # torch.compile in use: never let dynamo trace the recorder's body
            return eager(self, *args, **kwargs)
        if _is_compiling():
            return None
        return self.guarded(name, fn, self, *args, stop_now=name != "_grad_hook", **kwargs)

    hook._reprobisect_body = fn  # type: ignore[attr-defined]
    return hook


def eager_hooks() -> None:
    """Fill ``EAGER`` for the step hooks (imports torch._dynamo: only once torch.compile is used)."""
    if EAGER:
        return
    for name in ("_add_losses", "_after_backward", "_skipped_step", "_grad_hook", "_on_batch", "_opt_pre", "_opt_post"):
        fn = TorchRecorder.__dict__[name]._reprobisect_body

        def call(self: "TorchRecorder", *args: Any, _fn: Callable = fn, _name: str = name, **kwargs: Any) -> Any:
            return self.guarded(_name, _fn, self, *args, stop_now=_name != "_grad_hook", **kwargs)

        EAGER[name] = torch.compiler.disable(call, recursive=True)


class TorchRecorder:
    """Records steps of a PyTorch training loop into a ``TraceWriter``.

    ``install()`` registers the global hooks and wraps; ``remove()`` undoes them.
    With ``stop_at_limit`` the recorder raises ``StopRun`` from the optimizer hook once
    ``policy.steps`` steps are written (the launcher's mode); otherwise it goes quiet.
    """

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
        self._installed = False
        self._handles: list[Any] = []
        self._undo: list[Callable[[], None]] = []
        self._roots: dict[int, tuple[weakref.ref, str]] = {}
        self._primary: int | None = None
        self._names: dict[int, str] = {}
        self._param_names: dict[int, str] = {}
        self._hooked: set[int] = set()
        self._stack: list[torch.nn.Module] = []
        self._in_stack: list[list[fpt.Pending] | None] = []
        self._param_hooks: list[Any] = []
        self._optimizers: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._schedulers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._iters: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._loader: "weakref.ref | None" = None
        self._scaler: "weakref.ref | None" = None
        self._opt_posts = 0  # optimizer steps taken (a GradScaler's skip takes none)
        self._disk_used = 0
        self._zoom: Any = None
        self.environment_extra: dict[str, Any] = {}  # merged into the trace's environment (Lightning's settings)
        self.failed: str | None = None  # the recorder's own failure, if any (see _hook)
        self.phase: str | None = None  # an evaluation phase a runner names (Lightning's "validation")
        self.prefetch = False  # the loop draws one batch ahead (Lightning's fetcher): carry it over
        self.seed: Any = None  # the first torch.manual_seed() the script called
        self._opt_seen = False  # an optimizer step (or a GradScaler's skip) has happened
        self._batches: list[_Batch] = []  # drawn, not yet known to train
        self._eval_runs: list[dict[str, Any]] = []  # evaluation since the last step ended
        self._eval_cur: dict[str, Any] | None = None
        self._init_roots: set[int] = set()
        self._init_params: set[int] = set()  # parameters whose initial value is recorded (step 0)
        self._primary_mods: set[int] = set()
        self._bw_snap: dict[int, tuple[Any, int | None, torch.Tensor]] = {}  # no optimizer: params at backward
        self._backwards_idle = 0  # backward() calls with no optimizer and no parameter update
        self._bw_mark = 0  # evaluation runs before the last backward (a loop without an optimizer)
        self.backwards = 0
        self.graphless_backwards = 0  # backward() calls whose every tensor had no graph (grad_fn None)
        self._quiet = 0  # inside an LBFGS closure's re-evaluation: counted, not recorded
        self._train_mode_roots: set[int] = set()  # roots that trained in train() mode
        self._eval_root: torch.nn.Module | None = None  # a root evaluating in eval() mode with gradients on
        self._capped_noted = False
        self._fwd_hooks: Any = None
        self._dist: Any = None  # runners.distributed_torch.DistributedObserver, once installed
        # activations on an accelerator: one copy each, fingerprinted in batches at the step's end
        self._stage = staged_torch.Stage(with_stats=policy.stats)
        self._reset_step()

    # -- step buffer --------------------------------------------------------------

    def _reset_step(self) -> None:
        self._entries: list[_Entry] = []
        self._occ: dict[tuple[str, str], int] = {}
        self._cache: dict[int, tuple[torch.Tensor, int, fpt.Pending]] = {}
        self._batch_ids: list[int] | None = None
        self._grad_seen: dict[int, tuple[Any, int | None, fpt.Pending | torch.Tensor, fpt.Pending | None]] = {}
        self._pre_clip: list[fpt.Pending | torch.Tensor | float] = []
        self._grad_todo: list[tuple[torch.Tensor, torch.Tensor]] = []  # (param, grad) to fingerprint in a batch
        self._data_wait = 0.0
        self._record_s = 0.0
        self._t0: float | None = None
        self._inputs_done = False
        self._outputs_seen = 0
        self._trained = False  # a training forward of a root ran in this step
        self._fwd_records = 0
        self._dropped = 0
        self._closure_evals = 0
        self._full = self.step in self.policy.full_steps
        self._full_bytes = 0
        self._scalars: dict[str, Any] = {}

    def _unique(self, kind: str, base: str) -> str:
        k = self._occ.get((kind, base), 0)
        self._occ[(kind, base)] = k + 1
        return base if k == 0 else f"{base}#{k}"

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
                msg = (
                    f"full tensors of step {self.step} not kept: they would exceed --max-disk {budget} bytes "
                    f"(trace holds {self._disk_used} bytes); raise --max-disk or keep fewer --full-steps"
                )
                self.notes.append(msg)
                print(f"reprobisect: {msg}", file=sys.stderr)
                for other in self._entries:
                    other.array = None
            return
        e.array = to_numpy(t)
        if e.array is not None:
            self._full_bytes += nbytes

    # -- install / remove ---------------------------------------------------------

    def install(self) -> "TorchRecorder":
        if self._installed:
            return self
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        from reprobisect.runners import compile_torch

        self._fwd_hooks = compile_torch.ForwardHooks(self)  # compile-aware entry points
        self._undo.append(compile_torch.install_compile_watch(eager_hooks))
        self._handles += [
            nn_module.register_module_forward_pre_hook(self._fwd_hooks.pre),
            nn_module.register_module_forward_hook(self._fwd_hooks.post, with_kwargs=True, always_call=True),
            optim_module.register_optimizer_step_pre_hook(self._opt_pre),
            optim_module.register_optimizer_step_post_hook(self._opt_post),
        ]
        try:  # data order for state capture (reads RNG states only; wraps DataLoader.__iter__)
            from reprobisect.runners.torch_state import track_data_order

            track_data_order()
        except (ImportError, NotImplementedError):
            pass
        self._wrap_dataloader()
        self._wrap_backward()
        self._wrap_scaler()
        self._wrap_schedulers()
        self._wrap_seed()
        if self.policy.zoom_module is not None and self.policy.zoom_step is not None:
            self._install_zoom()
        from reprobisect.runners import distributed_torch  # collectives and ranks (idle unless used)

        self._dist = distributed_torch.install(self)
        if self._dist is not None:
            self._undo.append(self._dist.remove)
        if self.policy.overfit or self.policy.memory:  # bisect doctor's switches (their own modules)
            from reprobisect.runners import doctor_torch

            self._undo.append(doctor_torch.install(self))
        self._installed = True
        global ACTIVE
        ACTIVE = self
        return self

    def remove(self) -> None:
        global ACTIVE
        if ACTIVE is self:
            ACTIVE = None
        for h in self._handles:
            h.remove()
        self._handles = []
        while self._undo:
            self._undo.pop()()
        for h in self._param_hooks:
            h.remove()
        self._param_hooks = []
        self._hooked.clear()
        self._stage.release()
        if self._zoom is not None:
            try:
                self._zoom.remove()
            except Exception:
                pass
        self._installed = False

    def _patch(self, owner: Any, attr: str, new: Callable) -> None:
        old = owner.__dict__[attr]
        setattr(owner, attr, new)
        self._undo.append(lambda: setattr(owner, attr, old))

    def _wrap_dataloader(self) -> None:
        from torch.utils.data import dataloader as dl

        cls = dl._BaseDataLoaderIter
        orig_next_index = cls.__dict__["_next_index"]
        orig_next = cls.__dict__["__next__"]
        orig_iter = dl.DataLoader.__dict__["__iter__"]
        rec = self

        def _next_index(it):
            idx = orig_next_index(it)
            q = it.__dict__.get("_reprobisect_ids")
            if q is None:
                q = it.__dict__["_reprobisect_ids"] = deque()
            q.append(idx)
            return idx

        def __next__(it):
            t0 = time.perf_counter()
            data = orig_next(it)
            t1 = time.perf_counter()
            q = it.__dict__.get("_reprobisect_ids")
            idx = q.popleft() if q else None
            if not rec.done:
                rec._iters.add(it)
                rec._on_batch(it, idx, data, t0, t1)
            return data

        def __iter__(loader):
            it = orig_iter(loader)
            if isinstance(it, cls):
                it.__dict__["_reprobisect_loader"] = weakref.ref(loader)
            return it

        self._patch(cls, "_next_index", _next_index)
        self._patch(cls, "__next__", __next__)
        self._patch(dl.DataLoader, "__iter__", __iter__)

    def _wrap_backward(self) -> None:
        import torch.autograd as autograd

        orig = autograd.__dict__["backward"]
        rec = self

        def backward(tensors, *args, **kwargs):
            if not rec.done:
                rec._add_losses(tensors)
                ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
                if ts and all(isinstance(t, torch.Tensor) and t.grad_fn is None for t in ts):
                    rec.graphless_backwards += 1
            out = orig(tensors, *args, **kwargs)
            if not rec.done:
                rec._after_backward()
            return out

        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        self._patch(autograd, "backward", backward)

    def _wrap_scaler(self) -> None:
        try:
            from torch.amp import grad_scaler
        except ImportError:
            return
        cls = grad_scaler.GradScaler
        orig = cls.__dict__["scale"]
        rec = self

        def scale(scaler, outputs):
            rec._scaler = weakref.ref(scaler)
            return orig(scaler, outputs)

        orig_step = cls.__dict__["step"]

        def step(scaler, optimizer, *args, **kwargs):
            # a scaler that finds inf/NaN gradients skips optimizer.step(): no optimizer
            # hook fires, so the step is ended here, one trace step per training iteration
            rec._scaler = weakref.ref(scaler)
            before = rec._opt_posts
            out = orig_step(scaler, optimizer, *args, **kwargs)
            if not rec.done and rec._opt_posts == before and rec._entries:
                rec._skipped_step(optimizer)
            return out

        self._patch(cls, "scale", scale)
        self._patch(cls, "step", step)

    def _wrap_seed(self) -> None:
        """Note the first ``torch.manual_seed`` (Lightning's ``seed_everything`` calls it):
        the manifest's seed when the launcher was given none. Reads the argument only."""
        import torch.random as trandom

        orig = trandom.__dict__["manual_seed"]
        rec = self

        @functools.wraps(orig)
        def manual_seed(seed, *args, **kwargs):
            if rec.seed is None:
                try:
                    rec.seed = int(seed)
                except (TypeError, ValueError):
                    pass
            return orig(seed, *args, **kwargs)

        self._patch(trandom, "manual_seed", manual_seed)
        if torch.__dict__.get("manual_seed") is orig:
            self._patch(torch, "manual_seed", manual_seed)

    @_hook
    def _add_losses(self, tensors: Any) -> None:
        if self._quiet:
            return
        t0 = time.perf_counter()
        for t in [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ()):
            if isinstance(t, torch.Tensor):
                self._add("loss", "loss", t)
                if self.step == 0 and not self.__dict__.get("_loss_graph_read"):
                    # [N,1] against [N] made [N,N], probabilities into a loss on logits (doctor's ``contract``)
                    self._loss_graph_read = True
                    self._scalars.update(_loss_graph(t))
        self._record_s += time.perf_counter() - t0

    @_hook
    def _skipped_step(self, opt: torch.optim.Optimizer) -> None:
        self._opt_seen = True
        self._optimizers.add(opt)
        self._record_grads(opt)  # the non-finite gradients that made the scaler skip
        self._scalars["scaler_skipped"] = True
        self._end_step(opt)

    def _wrap_schedulers(self) -> None:
        try:
            from torch.optim import lr_scheduler
        except ImportError:
            return
        cls = lr_scheduler.LRScheduler
        orig = cls.__dict__["__init__"]
        rec = self

        def __init__(sched, *args, **kwargs):
            orig(sched, *args, **kwargs)
            rec._schedulers.add(sched)

        self._patch(cls, "__init__", __init__)

    def _install_zoom(self) -> None:
        try:
            from reprobisect.runners import zoom_torch

            self._zoom = zoom_torch.install_zoom(
                self.policy.zoom_module, self.policy.zoom_step, current_step=lambda: self.step
            )
        except NotImplementedError:
            self.notes.append("op-level zoom is not available in this build; recorded without it")
            self._zoom = None

    # -- roots and names ----------------------------------------------------------

    def add_root(self, module: torch.nn.Module) -> str:
        """Register ``module`` as a root (the first one is the model); returns its prefix."""
        module = unwrap(module)  # torch.compile's wrapper: names are the user's module's
        hit = self._roots.get(id(module))
        if hit is not None and hit[0]() is module:
            return hit[1]
        if id(module) in self._names:  # a submodule of the model, called from outside its forward
            return self._names[id(module)]
        if self._primary is None:
            prefix = ""
            self._primary = id(module)
            self._primary_mods = {id(m) for m in module.modules()}
        else:
            base = type(module).__name__
            taken = {p for _, p in self._roots.values()}
            prefix, k = base, 1
            while prefix in taken:
                prefix = f"{base}@{k}"
                k += 1
        self._roots[id(module)] = (weakref.ref(module), prefix)
        for path, m in module.named_modules():
            path = user_path(path)
            full = prefix + ("." if prefix and path else "") + path
            self._names.setdefault(id(m), full or prefix)
        for path, p in module.named_parameters():
            self._param_names.setdefault(id(p), prefix + ("." if prefix else "") + user_path(path))
            self._watch_grad(p)
        return prefix

    def _watch_grad(self, p: torch.Tensor) -> None:
        """Hook ``p``'s gradient once it is accumulated (the gradient before clipping)."""
        if p.requires_grad and id(p) not in self._hooked:
            self._hooked.add(id(p))
            self._param_hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook))

    def _internal_error(self, where: str, e: Exception) -> StopRun:
        """Record the recorder's own failure once, go quiet, and return the StopRun that
        ends the probe as ``infra``."""
        if self.failed is None:
            self.failed = f"{where.lstrip('_')}: {first_cause(e)}"  # the original error, not a later one it caused
            detail = (f"reprobisect's recorder failed at step {self.step} ({self.failed}); a reprobisect bug, "
                      "not your program's: this probe is no evidence either way")
            self.notes.append(detail)
            print(f"reprobisect: {detail}", file=sys.stderr)
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

    def set_model(self, module: torch.nn.Module) -> None:
        """Make ``module`` the model that names modules and parameters: a LightningModule,
        which training never calls through ``__call__``, so that names match its
        ``state_dict`` keys. Only before the first step is written (names must not change
        within a trace); later it is noted and ignored."""
        module = unwrap(module)
        hit = self._roots.get(id(module))
        if hit is not None and hit[0]() is module and self._primary == id(module):
            return
        if self.step:
            self.notes.append(f"model set to {type(module).__name__} after step {self.step}; names kept as they were")
            return
        inside = {id(m) for m in module.modules()}
        for key in [k for k in self._roots if k in inside]:
            del self._roots[key]
        self._primary = id(module)
        self._primary_mods = {id(m) for m in module.modules()}
        self._roots[id(module)] = (weakref.ref(module), "")
        for path, m in module.named_modules():
            self._names[id(m)] = user_path(path)
        for path, p in module.named_parameters():
            self._param_names[id(p)] = user_path(path)
            self._watch_grad(p)

    def add_pending(self, kind: str, name: str, pending: fpt.Pending, meta: dict[str, Any] | None = None,
                    chain: tuple[int, float] | None = None) -> None:
        """Buffer an already begun fingerprint as the step's next record ``kind name``
        (``runners.distributed_torch``: what entered or left a collective); ``chain``: its
        place in chain order (``(kind rank, seq)``) when not its kind's."""
        e = _Entry(kind=kind, name=name, pending=pending, meta=meta, chain=chain)
        e.seq = len(self._entries)
        self._entries.append(e)

    def primary_module(self) -> torch.nn.Module | None:
        """The model (the first root module), if it is still alive."""
        hit = self._roots.get(self._primary) if self._primary is not None else None
        return hit[0]() if hit is not None else None

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizers.add(optimizer)

    def track_loader(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)

    def add_step_scalar(self, key: str, value: Any) -> None:
        """A runner's scalar for the step in progress (Lightning's ``scalars["lightning"]``)."""
        if not self.done:
            self._scalars[key] = value

    def _module_name(self, m: torch.nn.Module) -> str:
        name = self._names.get(id(m))
        if name is None:
            parent = self._names.get(id(self._stack[-2])) if len(self._stack) > 1 else None
            name = f"{parent}.<{type(m).__name__}>" if parent else f"<{type(m).__name__}>"
            self._names[id(m)] = name
        return name

    def _param_name(self, p: torch.Tensor, g: int, i: int) -> str:
        name = self._param_names.get(id(p))
        if name is None and not self.step and self._fwd_hooks is not None and self._fwd_hooks.root_from_compiled(p):
            name = self._param_names.get(id(p))  # a model set up with model.compile(): its hooks never fire
        return name or f"param_groups.{g}.{i}"

    # -- hooks --------------------------------------------------------------------

    @_hook
    def _fwd_pre(self, module: torch.nn.Module, args: tuple) -> None:
        self._raise_if_failed()
        self._stack.append(module)
        self._in_stack.append(None)
        if self.done or self._quiet:
            return
        if len(self._stack) == 1:
            self._eval_root = None
            if not module.training and id(module) in self._train_mode_roots and _training():
                self._eval_root = module  # model.eval() without no_grad, of a model that trains in train()
        if not _training() or self.phase is not None or self._eval_root is not None:  # evaluation: summarised
            if len(self._stack) == 1:
                self._eval_forward(module)
            return
        if self._sentinel and len(self._stack) > 1:  # sentinel: only a root's forward matters (batches, init)
            return
        t0 = time.perf_counter()
        with _NoGrad():
            if len(self._stack) == 1:
                self._training_root(module, args)
                if self.done:
                    return
            if not self._sentinel:  # module inputs: only activations use them
                self._in_stack[-1] = [self._begin(t) for t in _tensors(args) if _fingerprintable(t)]
        self._record_s += time.perf_counter() - t0

    def _training_root(self, module: torch.nn.Module, args: tuple) -> None:
        """A root's forward with gradients on: it trains. Ends a step of a loop without an
        optimizer whose parameters changed since the last backward; claims the batches drawn
        for it; records the initial parameters (step 0) and the root's tensor arguments."""
        if not self._opt_seen and self._bw_snap and self._params_updated():
            self._end_manual_step()
            if self.done:
                return
        self.add_root(module)
        if module.training:
            self._train_mode_roots.add(id(module))
        if id(module) == self._primary and "eval_mode_layers" not in self._scalars:
            cache = self.__dict__.setdefault("_mode_cache", {})
            layers = cache.get(id(module))
            if layers is None:
                layers = cache[id(module)] = _mode_layers(module)  # once per model: modules rarely change
            names = [n for n, m in layers if not m.training]
            if names:  # the model trains with dropout/batch norm in eval mode (doctor's ``modes``)
                self._scalars["eval_mode_layers"] = names[:_MODE_NAMES]
                drop = [n for n, m in layers if not m.training and not _is_norm(m)]
                if drop:
                    self._scalars["eval_mode_dropout"] = drop[:_MODE_NAMES]
        self._trained = True
        self._eval_cur = None
        if not self.prefetch:
            self._claim(id(module))
        if self.step == 0:
            self._record_init()
        # the model's every call (each micro-batch of an accumulation), or a step's first root call
        if id(module) in self._primary_mods or not self._inputs_done:
            self._inputs_done = True
            ts = _tensors(args)
            for i, t in enumerate(ts):
                self._add("input", "input" if len(ts) == 1 else f"input[{i}]", t)

    def _record_init(self) -> None:
        for key, (ref, _) in list(self._roots.items()):
            m = ref()
            if key in self._init_roots or m is None:
                continue
            self._init_roots.add(key)
            for path, p in m.named_parameters():
                self._add_init(p, self._param_names.get(id(p)) or path)

    def _record_init_of(self, opt: torch.optim.Optimizer) -> None:
        """Initial values of ``opt``'s parameters no training forward showed (a model only
        ever called compiled runs no forward hook): still before the first update here."""
        if self.step != 0 or self._opt_posts:
            return
        with torch.no_grad():
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    self._add_init(p, self._param_name(p, g, i))

    def _add_init(self, p: torch.Tensor, name: str) -> None:
        """``p``'s value before any update, once (never from the fingerprint cache)."""
        if id(p) not in self._init_params:
            self._init_params.add(id(p))
            self._add("init", name, p, fresh=True)
            if not p.requires_grad:  # frozen on purpose or not: doctor's update check tells them apart
                self._scalars.setdefault("frozen_params", []).append(name)

    # -- evaluation -----------------------------------------------------------------

    def _eval_run(self, phase: str | None = None) -> dict[str, Any]:
        """The evaluation run under way (consecutive evaluation of one phase)."""
        if phase is None:
            phase = self.phase or ("inference_mode" if torch.is_inference_mode_enabled()
                                   else "no_grad" if not torch.is_grad_enabled() else "eval_mode")
        cur = self._eval_cur
        if cur is None or cur["phase"] != phase:
            cur = {"phase": phase, "after_step": self.step - 1 if self.step else None, "forwards": 0, "batches": 0,
                   "ids": [], "outputs": []}
            self._eval_runs.append(cur)
            self._eval_cur = cur
        return cur

    def _eval_forward(self, module: torch.nn.Module) -> None:
        run = self._eval_run()
        run["forwards"] += 1
        if run["forwards"] == 1 and run["phase"] in ("no_grad", "inference_mode") and module.training:
            names = [n for n, m in _mode_layers(module) if m.training]
            if names:  # evaluation with dropout/batch norm in training mode (doctor's ``modes``)
                run["train_mode_layers"] = names[:_MODE_NAMES]
        if self.phase is None:
            for b in self._batches:
                b.seen_by.add(id(module))
                b.run = b.run or run

    def _eval_output(self, output: Any) -> None:
        outs = self._eval_run()["outputs"]
        if len(outs) >= _EVAL_OUTPUTS:
            return
        with torch.no_grad():
            for t in _tensors(output):
                if _fingerprintable(t) and len(outs) < _EVAL_OUTPUTS:
                    outs.append(fpt.begin(t, with_stats=False))

    def _eval_batch(self, ids: np.ndarray | None, phase: str | None = None, run: dict[str, Any] | None = None) -> None:
        if run is None or not any(r is run for r in self._eval_runs):
            run = self._eval_run(phase)
        run["batches"] += 1
        if ids is not None:
            run["ids"].append(ids)

    def _take_eval(self) -> list[dict[str, Any]]:
        """The evaluation since the last step, as JSON (``scalars["eval"]``), and forget it."""
        runs, self._eval_runs, self._eval_cur = self._eval_runs, [], None
        out = []
        for r in runs:
            ids = np.concatenate(r["ids"]) if r["ids"] else None
            outs = [f for f, _ in fpt.finish_many(r["outputs"])] if r["outputs"] else []
            out.append({
                "phase": r["phase"],
                "after_step": r["after_step"],
                "forwards": r["forwards"],
                "batches": r["batches"],
                "samples": int(ids.size) if ids is not None else None,
                "ids_fingerprint": record_array("ids", "batch", ids).fingerprint if ids is not None else None,
                "outputs_fingerprint": _combine(outs) if outs else None,
                "outputs_fingerprinted": len(outs),
                **({"train_mode_layers": r["train_mode_layers"]} if r.get("train_mode_layers") else {}),
            })
        return out

    def evaluation_after_last_step(self) -> list[dict[str, Any]]:
        """Evaluation that ran after the last written step (a test after fit), as JSON."""
        return self._take_eval()

    # -- batches ----------------------------------------------------------------------

    def _claim(self, root: int) -> None:
        """A training forward of ``root``: every pending batch it did not evaluate trains."""
        keep = []
        for b in self._batches:
            if root in b.seen_by:
                keep.append(b)
            else:
                self._commit_batch(b)
        self._batches = keep

    def claim_next(self) -> None:
        """A runner says a training batch starts (Lightning's ``on_train_batch_start``): the
        oldest pending batch of each loader is it (a prefetched one waits for its step)."""
        keep, taken = [], set()
        for b in self._batches:
            if b.it in taken:
                keep.append(b)
            else:
                taken.add(b.it)
                self._commit_batch(b)
        self._batches = keep

    def _commit_batch(self, b: _Batch) -> None:
        if b.ids is not None:
            self._batch_ids = (self._batch_ids or []) + b.ids.tolist()
            name = self._unique("batch", "ids")
            e = _Entry(kind="batch", name=name, record=record_array(name, "batch", b.ids),
                       array=b.ids.copy() if self._full else None)
            e.seq = len(self._entries)
            self._entries.append(e)
        for i, pending, t in b.tensors:
            e = _Entry(kind="batch", name=self._unique("batch", f"data[{i}]"), pending=pending)
            if self._full:
                self._keep_array(e, t)
            e.seq = len(self._entries)
            self._entries.append(e)

    def _settle_batches(self) -> None:
        """At a step's end: batches an evaluation used are evaluation; a batch the loop drew
        ahead (``prefetch``) waits for its step; any other pending batch trained here."""
        newest = {b.it: b for b in self._batches} if self.prefetch and self._trained else {}
        keep = []
        for b in self._batches:
            if b.seen_by:
                self._eval_batch(b.ids, "no_grad", b.run)
            elif newest.get(b.it) is b:
                keep.append(b)
            else:
                self._commit_batch(b)
        self._batches = keep

    # -- records bound ------------------------------------------------------------------

    def _room(self) -> bool:
        """Whether one more forward record fits in this step (``max_records_per_step``)."""
        if self._fwd_records < self.policy.max_records_per_step:
            self._fwd_records += 1
            return True
        self._dropped += 1
        if self._dropped == 1 and not self._capped_noted:
            self._capped_noted = True
            msg = (f"step {self.step} has more than {self.policy.max_records_per_step} forward records: the rest of "
                   "its activations are counted (scalars.records_dropped), not recorded; gradients and parameters "
                   "still are. Raise --max-records-per-step (RecordPolicy.max_records_per_step) to record them")
            self.notes.append(msg)
            print(f"reprobisect: {msg}", file=sys.stderr)
        return False

    # -- loops without an optimizer -----------------------------------------------------

    def _root_params(self) -> list[tuple[str, torch.Tensor]]:
        out, seen = [], set()
        for ref, prefix in list(self._roots.values()):
            m = ref()
            if m is None:
                continue
            for path, p in m.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((self._param_names.get(id(p)) or prefix + ("." if prefix else "") + path, p))
        return out

    @_hook
    def _after_backward(self) -> None:
        if self._quiet:
            return
        self._flush_grads()
        self.backwards += 1
        if self._opt_seen:
            return
        # no optimizer so far: note the parameters that have gradients, to see an update by hand
        with torch.no_grad():
            for _, p in self._root_params():
                if p.grad is not None and id(p) not in self._bw_snap and p.is_floating_point():
                    self._bw_snap[id(p)] = (weakref.ref(p), _version(p), _psum(p))
        self._backwards_idle += 1
        self._bw_mark, self._eval_cur = len(self._eval_runs), None
        if self.step == 0 and self._backwards_idle >= _IDLE_BACKWARDS:
            self._finish(StopRun("no_steps", 0, _no_update_detail(self.backwards, self.graphless_backwards)))

    def _params_updated(self) -> bool:
        """Whether a parameter that had a gradient at the last backward changed since: its
        version counter, or (``p.data`` updates do not count versions) its sum."""
        sums = []
        for ref, v, s in self._bw_snap.values():
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

    @property
    def manifest_extra(self) -> dict[str, Any]:
        """``before_first_step`` when the run wrote no step (it crashed or ended first): the
        backward calls so far (and how many started from a tensor with no graph), the
        parameters whose initial value was seen and those of them frozen; the doctor reads it
        to name the cause of a run that never stepped."""
        if self.step != 0 or self._opt_posts:
            return {}
        return {"before_first_step": {"backwards": self.backwards, "backwards_without_graph": self.graphless_backwards,
                                      "parameters_seen": len(self._init_params),
                                      "frozen_params": list(self._scalars.get("frozen_params") or [])}}

    def finish_manual(self) -> None:
        """At the end of the program: a pending step of a loop without an optimizer ends here."""
        if not self.done and not self._opt_seen and self._bw_snap and self.failed is None:
            self.guarded("finish_manual", self._end_manual_if_updated)

    def _end_manual_if_updated(self) -> None:
        if self._params_updated():
            self._end_manual_step()

    def _end_manual_step(self) -> None:
        """End a step of a loop that updates parameters by hand: its gradients (as backward
        left them, before any clipping the loop did), its parameters now (after the update)."""
        self._flush_grads()  # (times itself)
        t0 = time.perf_counter()
        have = 0
        with torch.no_grad():
            params = [(n, p) for n, p in self._root_params() if id(p) in self._bw_snap]
            for name, p in params:
                seen = self._grad_seen.get(id(p))
                if seen is None or (seen[3] is None and not self._sentinel):
                    continue
                have += 1
                if self._sentinel:  # the norm only
                    self._pre_clip.append(seen[2])
                    continue
                g = seen[0]()
                e = _Entry(kind="grad", name=self._unique("grad", name), pending=seen[3])
                if self._full and g is not None and _version(g) == seen[1]:
                    self._keep_array(e, g)
                e.seq = len(self._entries)
                self._entries.append(e)
                self._pre_clip.append(seen[2])
            for name, p in params:
                self._add("param", name, p, fresh=True)
        self._scalars["manual_update"] = True
        self._scalars["grad_params"] = have
        self._scalars["no_grad_params"] = []
        self._scalars["no_gradients"] = have == 0
        self._bw_snap.clear()
        self._backwards_idle = 0
        self._record_s += time.perf_counter() - t0
        # evaluation after the last backward ran after this update (as far as can be told):
        # it belongs to the next step's window, like evaluation after an optimizer step
        late, self._eval_runs = self._eval_runs[self._bw_mark:], self._eval_runs[: self._bw_mark]
        step = self.step
        try:
            self._end_step(None)
        finally:
            for r in late:
                r["after_step"] = step
            self._eval_runs, self._eval_cur, self._bw_mark = late + self._eval_runs, None, 0

    @_hook
    def _fwd(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        inputs = None
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
            inputs = self._in_stack.pop()
        else:  # an exception unwound inner calls without their hooks
            for k in range(len(self._stack) - 1, -1, -1):
                if self._stack[k] is module:
                    inputs = self._in_stack[k]
                    del self._stack[k:], self._in_stack[k:]
                    break
        if self.done or self._quiet or output is None:
            return
        if not _training() or self.phase is not None or self._eval_root is not None:
            if not self._stack:
                self._eval_output(output)
                self._eval_root = None
            return
        if self._sentinel:  # no activations, no output
            return
        t0 = time.perf_counter()
        with _NoGrad():
            is_model = not self._stack and id(module) == self._primary
            name = self._module_name(module)
            if not self._stack and not inputs and kwargs:
                inputs = [self._begin(t) for t in _tensors(kwargs) if _fingerprintable(t)]
            ts = _tensors(output)
            cls = type(module).__name__
            for i, t in enumerate(ts):
                if is_model:
                    base = "output" if len(ts) == 1 else f"output[{i}]"
                    self._add("output", base, t, module=cls, inputs=inputs)
                else:
                    self._add_activation(name, i, len(ts), t, cls, inputs)
        self._record_s += time.perf_counter() - t0

    def _add_activation(self, name: str, i: int, n: int, t: torch.Tensor, cls: str, inputs: list | None) -> None:
        if i == 0:
            k = self._occ.get(("activation", name), 0)
            self._occ[("activation", name)] = k + 1
            self._cur_call = name if k == 0 else f"{name}#{k}"
        full = self._cur_call if n == 1 else f"{self._cur_call}[{i}]"
        if not _fingerprintable(t) or not self._room():
            return
        self._push("activation", full, t, module=cls, inputs=inputs)

    @_hook
    def _grad_hook(self, p: torch.Tensor) -> None:
        g = p.grad
        if self.done or self._quiet or g is None or g.is_sparse:
            return
        # the gradient before clipping: fingerprinted here; the optimizer pre-hook
        # reuses this unless clipping (or anything else) changed it in place since.
        # The last item: its fingerprint, the grad record of a loop without an optimizer
        if self.policy.stats and (batched_torch.on_batched_device(g) or (not self._sentinel and _small_on_cpu(g))):
            # in one batch with the others, when backward returns (``_flush_grads``); a
            # sentinel's norm on an accelerator too (from the batch's statistics: a constant
            # number of launches, where a norm each cost two per gradient)
            self._grad_todo.append((p, g))
            self._grad_seen[id(p)] = (weakref.ref(g), _version(g), None, None)
            return
        with _NoGrad():
            if self._sentinel:  # the norm only: no per-tensor gradient records
                self._grad_seen[id(p)] = (weakref.ref(g), _version(g), _norm(g), None)
            elif self.policy.stats:
                pending = self._begin(g)
                self._grad_seen[id(p)] = (weakref.ref(g), _version(g), pending, pending)
            else:
                self._grad_seen[id(p)] = (weakref.ref(g), _version(g), _norm(g),
                                          None if self._opt_seen else self._begin(g))

    def _flush_grads(self) -> None:
        """Fingerprint the gradients the hook deferred, together (before any clipping)."""
        todo, self._grad_todo = self._grad_todo, []
        seen = self._grad_seen
        live = [(p, g, s[0]) for p, g in todo if (s := seen.get(id(p))) is not None and s[0]() is g]
        if not live:
            return
        t0 = time.perf_counter()
        with torch.no_grad(), _gc_paused():
            pendings = self._begin_many([g for _, g, _ in live])
        for (p, g, ref), q in zip(live, pendings):  # (a sentinel keeps the norm only: no grad record)
            seen[id(p)] = (ref, _version(g), q, None if self._sentinel else q)
        self._record_s += time.perf_counter() - t0

    @_hook
    def _on_batch(self, it: Any, idx: Any, data: Any, t0: float, t1: float) -> None:
        if self._quiet:
            return
        ids = None
        if idx is not None:
            try:
                ids = np.asarray(idx, dtype=np.int64).reshape(-1)
            except (TypeError, ValueError):
                ids = None
        if not _training() or self.phase is not None:  # drawn for evaluation: never a training batch
            self._eval_batch(ids)
            return
        if self._t0 is None:
            self._t0 = t0
        self._data_wait += t1 - t0
        ref = it.__dict__.get("_reprobisect_loader")
        if ref is not None:
            self._loader = ref
        # a batch of this loader that only an evaluation used, before this one was drawn
        for b in [b for b in self._batches if b.it == id(it) and b.seen_by]:
            self._batches.remove(b)
            self._eval_batch(b.ids, "no_grad", b.run)
        with torch.no_grad():
            tensors = [(i, self._begin(t), t.detach()) for i, t in enumerate(_tensors(data)) if _fingerprintable(t)]
        # whether it trains is known at the next forward (see _claim, _settle_batches)
        self._batches.append(_Batch(it=id(it), ids=ids, tensors=tensors, seen_by=set()))
        self._record_s += time.perf_counter() - t1

    @_hook
    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> Any:
        self._raise_if_failed()
        if self.done:
            return None
        self._opt_seen = True
        self._bw_snap.clear()
        self._optimizers.add(opt)
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 else None)
        if closure is None:
            self._record_grads(opt)
            return None
        # step(closure) (Lightning, LBFGS): forward and backward run inside step(), so the
        # gradients are taken right after the closure's first call, before the update. Later
        # calls (LBFGS re-evaluates) are counted (scalars.closure_evaluations), not recorded.
        fired = False

        def recorded_closure(*a: Any, **k: Any) -> Any:
            nonlocal fired
            if fired:
                self._closure_evals += 1
                self._quiet += 1
                try:
                    return closure(*a, **k)
                finally:
                    self._quiet -= 1
            out = closure(*a, **k)
            fired = True
            self._closure_evals = 1
            self._record_grads(opt)
            return out

        if "closure" in kwargs:
            return args, {**kwargs, "closure": recorded_closure}
        return (args[0], recorded_closure, *args[2:]), kwargs

    def _record_grads(self, opt: torch.optim.Optimizer) -> None:
        self._flush_grads()  # (times itself)
        t0 = time.perf_counter()
        self._record_init_of(opt)  # (before the update; after a closure's forward has named the model)
        missing: list[str] = []
        items: list[tuple[str, str, torch.Tensor]] = []
        params: list[tuple[torch.Tensor, torch.Tensor]] = []
        have = 0
        with torch.no_grad():
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    name = self._param_name(p, g, i)
                    grad = p.grad
                    if grad is None:
                        missing.append(name)
                        continue
                    if self._sentinel:  # the total norm before clipping, no grad record
                        seen = self._grad_seen.get(id(p))
                        self._pre_clip.append(seen[2] if seen is not None and seen[0]() is grad else _norm(grad))
                        have += 1
                        continue
                    items.append(("grad", name, grad))
                    params.append((p, grad))
            # a cache hit when the hook saw it unchanged
            for (p, grad), now in zip(params, self._add_many(items)):
                seen = self._grad_seen.get(id(p))
                if seen is not None and seen[0]() is grad and seen[2] is not None:
                    self._pre_clip.append(seen[2])
                elif now is not None:
                    self._pre_clip.append(now if self.policy.stats else _norm(grad))
        have += len(params)
        self._scalars["no_grad_params"] = missing
        self._scalars["grad_params"] = have
        self._scalars["no_gradients"] = have == 0
        self._record_s += time.perf_counter() - t0

    @_hook
    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self._opt_posts += 1
        if self.done:
            return
        with _gc_paused():
            self._params_and_state(opt)

    def _params_and_state(self, opt: torch.optim.Optimizer) -> None:
        """The step's parameters and optimizer state, then the end of the step."""
        t0 = time.perf_counter()
        items: list[tuple[str, str, torch.Tensor]] = []
        with torch.no_grad():
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    items.append(("param", self._param_name(p, g, i), p))
            for g, group in enumerate(opt.param_groups if not self._sentinel else ()):  # sentinel: no optimizer state
                for i, p in enumerate(group["params"]):
                    state = opt.state.get(p)
                    if not state:
                        continue
                    name = self._param_name(p, g, i)
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor):
                            items.append(("optim_state", f"{name}/{key}", value))
            self._add_many(items)  # together: a constant number of device ops (batched_torch)
        self._scalars["lr"] = [_float(group.get("lr")) for group in opt.param_groups]
        self._record_s += time.perf_counter() - t0
        self._end_step(opt)

    # -- end of step --------------------------------------------------------------

    def _end_step(self, opt: torch.optim.Optimizer | None) -> None:
        if torch.cuda.is_initialized():  # CUDA runs asynchronously: the step's time includes its device work
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        if self._dist is not None:
            self._dist.end_step()  # the step's collectives (and a distributed run's buffers)
        self._settle_batches()
        t_fin = time.perf_counter()
        records, done_pending = self._finish_records()
        if self._pre_clip:
            self._scalars["grad_norm"] = _json_float(self._pre_clip_norm(done_pending))

        scalars = self._step_scalars(records)
        for observe in self.__dict__.get("step_observers", ()):  # bisect doctor's (runners.doctor_torch)
            scalars.update(observe())
        evaluation = self._take_eval()
        if evaluation:
            scalars["eval"] = evaluation
        if self._closure_evals:
            scalars["closure_evaluations"] = self._closure_evals
        if self._dropped:
            scalars["records_dropped"] = self._dropped
            scalars["max_records_per_step"] = self.policy.max_records_per_step
        first_bad = self._first_nonfinite_record(records)
        if first_bad:
            scalars["first_nonfinite"] = first_bad
            if self.first_nonfinite is None:
                self.first_nonfinite = (self.step, first_bad)
        self._record_s += time.perf_counter() - t_fin
        if self._t0 is not None:
            wall = t_end - self._t0
            scalars["data_wait_s"] = round(self._data_wait, 6)
            scalars["record_s"] = round(self._record_s, 6)
            scalars["compute_s"] = round(max(0.0, wall - self._data_wait - self._record_s), 6)

        self.writer.begin_step(self.step)
        zoom_records = self._zoom_records()
        for e, rec in records:
            self.writer.record(rec, e.array)
        for rec in zoom_records:
            self.writer.record(rec)
        self.writer.end_step(scalars, batch_ids=self._batch_ids)
        if self.policy.max_disk is not None:  # a walk of the whole trace: only a budget needs it
            self._disk_used = self._trace_bytes()

        step = self.step
        if self.policy.wants_state(step):
            self._capture_state(step, opt)
        self.step += 1
        self._reset_step()
        if first_bad and self.policy.stop_on_nonfinite:
            self._finish(StopRun("nonfinite", step, f"first non-finite value at step {step}: {first_bad}"))
        elif self.step >= self.policy.steps:
            self._finish(StopRun("ok", step, f"recorded {self.step} step(s)"))

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
        for q in self._pre_clip:
            if isinstance(q, fpt.Pending):
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

    def _pre_clip_norm(self, done_pending: dict[int, tuple[str, dict | None]]) -> float:
        """The total gradient norm before clipping, from the norms or the stats the step kept."""
        sq = 0.0
        norms = [q for q in self._pre_clip if isinstance(q, torch.Tensor)]  # no stats: norm tensors
        if norms and len({q.device for q in norms}) == 1:  # one host transfer, the same floats
            norm_values = iter(torch.stack(norms).to(torch.float64).tolist())  # (float32 norms widen exactly)
        else:
            norm_values = iter([float(q) for q in norms])
        for q in self._pre_clip:
            if isinstance(q, float):  # no stats, on the host already (the native kernel's)
                sq += q ** 2
                continue
            if isinstance(q, torch.Tensor):
                sq += next(norm_values) ** 2
                continue
            st = done_pending[id(q)][1]
            sq += stat_value(st["norm"]) ** 2 if st else 0.0
        return math.sqrt(sq)

    def _first_nonfinite_record(self, records: list[tuple[_Entry, Record]]) -> str | None:
        """``kind 'name'`` of the step's first record holding NaN/Inf (a GradScaler's skipped grads aside)."""
        skipped = self._scalars.get("scaler_skipped")
        for _e, rec in records:
            if skipped and rec.kind == "grad":
                continue  # scaled gradients overflowing is what a GradScaler skips a step for
            if rec.stats and (rec.stats.get("nan") or rec.stats.get("inf")):
                return f"{rec.kind} '{rec.name}'"
        return None

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

    def _step_scalars(self, records: list[tuple[_Entry, Record]]) -> dict[str, Any]:
        s: dict[str, Any] = {}
        losses = [r for _, r in records if r.kind == "loss"]
        if losses and all(r.stats is not None and len(r.shape) == 0 for r in losses):
            values = [r.stat("mean") for r in losses]
            # accumulation: the sum of the micro-losses (the mean of the undivided ones when
            # the loop divides each by the number of micro-batches); each one in "losses"
            s["loss"] = losses[0].stats["mean"] if len(losses) == 1 else _json_float(math.fsum(values))  # type: ignore
            if len(losses) > 1:
                s["losses"] = [r.stats["mean"] for r in losses]  # type: ignore[index]
        if self.policy.stats:
            norms = [r.stat("norm") for _, r in records if r.kind == "grad"]
            if norms and all(n is not None for n in norms):
                s["grad_norm_at_step"] = _json_float(math.sqrt(sum(n * n for n in norms)))  # type: ignore[operator]
        s.update(self._scalars)
        scaler = self._scaler() if self._scaler is not None else None
        if scaler is not None and scaler.is_enabled():
            try:
                s["scaler_scale"] = float(scaler.get_scale())
            except Exception:
                pass
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            s["cuda_memory_allocated"] = int(torch.cuda.memory_allocated())
            s["cuda_memory_reserved"] = int(torch.cuda.memory_reserved())
        return s

    def _trace_bytes(self) -> int:
        total = 0
        for root, _, files in os.walk(self.writer.path):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass
        return total

    def state_objects(self, opt: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """The stateful objects seen so far: model(s), optimizer(s), schedulers, scaler."""
        objs: dict[str, Any] = {}
        for ref, prefix in self._roots.values():
            m = ref()
            if m is not None:
                objs["model" if prefix == "" else f"model.{prefix}"] = m
        opts = list(self._optimizers)
        if opt is not None and opt in opts:
            opts.remove(opt)
            opts.insert(0, opt)
        for i, o in enumerate(opts):
            objs["optimizer" if i == 0 else f"optimizer{i}"] = o
        for i, s in enumerate(self._schedulers):
            objs["scheduler" if i == 0 else f"scheduler{i}"] = s
        scaler = self._scaler() if self._scaler is not None else None
        if scaler is not None:
            objs["scaler"] = scaler
        return objs

    def _capture_state(self, step: int, opt: torch.optim.Optimizer) -> None:
        budget = self.policy.max_disk
        if budget is not None and self._disk_used >= budget:
            msg = f"state at step {step} not captured: the trace already holds {self._disk_used} bytes (--max-disk {budget})"
            self.notes.append(msg)
            print(f"reprobisect: {msg}", file=sys.stderr)
            return
        try:
            from reprobisect.runners.torch_state import capture_state
        except ImportError:
            self.notes.append(f"state at step {step} not captured: state capture is not available in this build")
            return
        loader = self._loader() if self._loader is not None else None
        try:
            capture_state(self.writer, step, self.state_objects(opt), loader=loader)
        except NotImplementedError:
            self.notes.append(f"state at step {step} not captured: state capture is not available in this build")
            return
        if budget is not None:
            self.writer.drain()  # (the state is written in the background)
            self._disk_used = self._trace_bytes()
        if budget is not None and self._disk_used > budget:
            msg = f"the state at step {step} took the trace to {self._disk_used} bytes, over --max-disk {budget}"
            self.notes.append(msg)
            print(f"reprobisect: {msg}", file=sys.stderr)

    def shutdown_loaders(self) -> None:
        """Stop the worker processes of every DataLoader iterator seen (multi-process loading)."""
        for it in list(self._iters):
            shut = getattr(it, "_shutdown_workers", None)
            if shut is not None:
                try:
                    shut()
                except Exception:
                    pass


_EVAL_OUTPUTS = 16
_MODE_NAMES = 16
_GRAPH_NODES = 64
"""Autograd nodes ``_loss_broadcast`` looks at, from the loss back (the loss expression)."""


def _shape_of(fn: Any, i: int) -> tuple[int, ...] | None:
    """The shape of output ``i`` of autograd node ``fn`` (None when torch does not say)."""
    try:
        if type(fn).__name__ == "AccumulateGrad":
            return tuple(fn.variable.shape)
        return tuple(fn._input_metadata[i].shape)
    except Exception:
        return None


def _builtin_broadcast(node: Any) -> dict[str, Any] | None:
    """A regression loss (mse/l1/smooth_l1/huber) given ``[N, 1]`` predictions and ``[N]``
    targets: it broadcasts them to ``[N, N]`` (an expand of the ``[N, 1]`` side; torch only warns)."""
    name = type(node).__name__
    if name == "ExpandBackward0":  # F.mse_loss & co. broadcast their arguments with an expand first
        src, out = tuple(node._saved_self_sym_sizes), _shape_of(node, 0)
        if len(src) == 2 and src[1] == 1 and src[0] > 1 and out == (src[0], src[0]):
            return {"op": name, "from": [src[0], 1], "to": [src[0], src[0]]}
        return None
    if name not in ("MseLossBackward0", "L1LossBackward0", "SmoothL1LossBackward0", "HuberLossBackward0"):
        return None
    a, b = tuple(node._saved_self.shape), tuple(node._saved_target.shape)
    for p, t in ((a, b), (b, a)):
        if len(p) == 2 and p[1] == 1 and p[0] > 1 and t == (p[0],):
            return {"op": type(node).__name__, "from": [p[0], 1], "to": [p[0], p[0]]}
    return None


_PROBABILITIES = {  # loss op on logits -> the op producing probabilities that must not feed it
    "LogSoftmaxBackward0": ("SoftmaxBackward0", "cross_entropy/log_softmax of a softmax"),
    "NllLossBackward0": ("SoftmaxBackward0", "nll_loss of a softmax (it expects log-probabilities)"),
    "BinaryCrossEntropyWithLogitsBackward0": ("SigmoidBackward0", "binary_cross_entropy_with_logits of a sigmoid"),
}


def _broadcast_at(node: Any, parents: list[tuple[Any, tuple[int, ...] | None]]) -> dict[str, Any] | None:
    """``node`` broadcasting an ``[N, 1]`` input against an ``[N]`` one (or a constant) to ``[N, N]``."""
    hit = _builtin_broadcast(node)
    if hit:
        return hit
    out = _shape_of(node, 0)
    if out is not None and len(out) == 2 and out[0] == out[1] > 1 and len(parents) == 2:
        n = out[0]
        shapes = [sh for _, sh in parents]
        if (n, 1) in shapes and all(sh in (None, (n, 1), (n,)) for sh in shapes):
            return {"op": type(node).__name__, "from": [n, 1], "to": [n, n]}
    return None


def _loss_graph(loss: torch.Tensor) -> dict[str, Any]:
    """What the loss expression (the autograd graph from ``loss`` back, at most
    ``_GRAPH_NODES`` nodes) shows: ``loss_broadcast`` (``{"op", "from", "to"}``: an ``[N, 1]``
    tensor broadcast against an ``[N]`` one or a constant, the labels, into ``[N, N]``;
    pairwise ``[N, 1]`` against ``[1, N]`` is not reported) and ``loss_probabilities``
    (``{"op", "after", "what"}``: a loss on logits fed a softmax's or sigmoid's output).
    Never raises: an unreadable graph says nothing."""
    out: dict[str, Any] = {}
    try:
        todo, seen = [loss.grad_fn], 0
        while todo and seen < _GRAPH_NODES:
            node = todo.pop(0)
            seen += 1
            if node is None:
                continue
            parents = [(f, _shape_of(f, i)) if f is not None else (None, None) for f, i in node.next_functions]
            if "loss_broadcast" not in out:
                hit = _broadcast_at(node, parents)
                if hit:
                    out["loss_broadcast"] = hit
            rule = _PROBABILITIES.get(type(node).__name__)
            if rule and "loss_probabilities" not in out and parents and type(parents[0][0]).__name__ == rule[0]:
                out["loss_probabilities"] = {"op": type(node).__name__, "after": rule[0], "what": rule[1]}
            todo += [f for f, _ in parents if f is not None]
    except Exception:
        pass
    return out
"""Most layer names ``eval_mode_layers`` / ``train_mode_layers`` list."""


def _is_norm(m: torch.nn.Module) -> bool:
    from torch.nn.modules import batchnorm

    return isinstance(m, getattr(batchnorm, "_BatchNorm", torch.nn.BatchNorm1d))


def _mode_layers(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The layers of ``module`` whose behaviour ``train()``/``eval()`` changes: dropout with
    p > 0 and batch norm that tracks running statistics, by their path."""
    from torch.nn.modules import batchnorm, dropout

    drop = getattr(dropout, "_DropoutNd", torch.nn.Dropout)
    norm = getattr(batchnorm, "_BatchNorm", torch.nn.BatchNorm1d)
    out = []
    for path, m in module.named_modules():
        if (isinstance(m, drop) and m.p > 0) or (isinstance(m, norm) and m.track_running_stats):
            out.append((user_path(path) or type(m).__name__, m))
    return out
"""Root outputs of one evaluation run whose fingerprints go into its summary."""
@contextlib.contextmanager
def _gc_paused() -> Any:
    """Python's cyclic GC held off while the recorder handles a step's many tensors.

    Each record allocates a few small objects; with the collector on, those allocations set
    off collections that walk every live object (the user's model, torch's modules) several
    times a step: measured 2-3x the recorder's own Python time per tensor. Paused, the
    allocations are counted all the same and the next collection runs once, after the
    hook. Nothing is kept alive longer than that: the recorder's objects are not cyclic."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_IDLE_BACKWARDS = 200
"""backward() calls with no optimizer and no parameter update after which a run is no_steps."""


def _psum(p: torch.Tensor) -> torch.Tensor:
    """The sum of a parameter, on its device (to see an update that bypasses versions)."""
    p = p.detach()
    wide = torch.float32 if p.device.type == "mps" else torch.float64
    return torch.sum(p, dtype=wide)


def _combine(fingerprints: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(fingerprints).encode()).hexdigest()[:32]


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


def _norm(g: torch.Tensor) -> float | torch.Tensor:
    """L2 norm of a gradient (``fingerprint_torch.norm``), where no statistics are taken
    (sentinel detail, or stats off)."""
    return fpt.norm(g.detach())


def _float(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.item()
    try:
        return _json_float(float(x))
    except (TypeError, ValueError):
        return None


def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
