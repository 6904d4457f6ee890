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

How it is built: a step chain plus observers. ``runners.torch_chain.TorchChain`` owns the
step (buffer, chain order, end, seal, policy, record budget); this module installs the
global hooks and names modules and parameters; each observation is an observer of its own
(``runners.observers.torch_*``: batches, evaluation, init, manual updates, forward records,
gradients, parameters and optimizer state, losses and the GradScaler, state capture, CUDA
memory, the doctor's extras), built once and called per hook in rank order.
"""

from __future__ import annotations

import functools
import time
import weakref
from typing import Any, Callable

import torch

from reprobisect.runners.compile_torch import unwrap, user_path
from reprobisect.runners.observers.torch_common import (_Entry, _fingerprintable, _gc_paused, _local,  # noqa: F401
                                                        _NoGrad, _small_on_cpu, _tensors, _training, _version,
                                                        to_numpy)
from reprobisect.runners.observers.torch_manual import _no_update_detail  # noqa: F401
from reprobisect.runners.policy import RecordPolicy, StopRun
from reprobisect.runners.torch_chain import TorchChain

__all__ = ["RecordPolicy", "StopRun", "TorchRecorder", "to_numpy"]


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


class TorchRecorder(TorchChain):
    """Records steps of a PyTorch training loop into a ``TraceWriter``.

    ``install()`` registers the global hooks and wraps; ``remove()`` undoes them.
    With ``stop_at_limit`` the recorder raises ``StopRun`` from the optimizer hook once
    ``policy.steps`` steps are written (the launcher's mode); otherwise it goes quiet.
    """

    def __init__(self, writer: Any, policy: RecordPolicy, *, stop_at_limit: bool = False) -> None:
        self._installed = False
        self._handles: list[Any] = []
        self._undo: list[Callable[[], None]] = []
        self._roots: dict[int, tuple[weakref.ref, str]] = {}
        self._primary: int | None = None
        self._primary_mods: set[int] = set()
        self._names: dict[int, str] = {}
        self._param_names: dict[int, str] = {}
        self._hooked: set[int] = set()
        self._stack: list[torch.nn.Module] = []
        self._in_stack: list[list[Any] | None] = []
        self._param_hooks: list[Any] = []
        self._optimizers: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._loader: "weakref.ref | None" = None
        self.environment_extra: dict[str, Any] = {}  # merged into the trace's environment (Lightning's settings)
        self.phase: str | None = None  # an evaluation phase a runner names (Lightning's "validation")
        self.prefetch = False  # the loop draws one batch ahead (Lightning's fetcher): carry it over
        self.seed: Any = None  # the first torch.manual_seed() the script called
        self.backwards = 0
        self.graphless_backwards = 0  # backward() calls whose every tensor had no graph (grad_fn None)
        self._train_mode_roots: set[int] = set()  # roots that trained in train() mode
        self._eval_root: torch.nn.Module | None = None  # a root evaluating in eval() mode with gradients on
        self._fwd_hooks: Any = None
        super().__init__(writer, policy, stop_at_limit=stop_at_limit)
        # the observers the hot hooks call, resolved once (no lookup per module call or gradient)
        obs = self.observers
        self._forward, self._evaluation, self._gradients = obs["forward"], obs["evaluation"], obs["gradients"]

    # -- install / remove ---------------------------------------------------------

    def install(self) -> "TorchRecorder":
        if self._installed:
            return self
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        from reprobisect.runners import compile_torch, distributed_torch

        self._fwd_hooks = compile_torch.ForwardHooks(self)  # compile-aware entry points
        self._undo.append(compile_torch.install_compile_watch(eager_hooks))
        self._handles += [
            nn_module.register_module_forward_pre_hook(self._fwd_hooks.pre),
            nn_module.register_module_forward_hook(self._fwd_hooks.post, with_kwargs=True, always_call=True),
            optim_module.register_optimizer_step_pre_hook(self._opt_pre),
            optim_module.register_optimizer_step_post_hook(self._opt_post),
        ]
        if self.policy.zoom_module is not None and self.policy.zoom_step is not None:
            self._install_zoom()
        self._dist = distributed_torch.install(self)  # collectives and ranks (idle unless used)
        if self._dist is not None:
            self._undo.append(self._dist.remove)
        for observer in self.observers.values():  # in rank order: each wraps what its concern watches
            undo = observer.install()
            if undo is not None:
                self._undo.append(undo)
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

    def primary_module(self) -> torch.nn.Module | None:
        """The model (the first root module), if it is still alive."""
        hit = self._roots.get(self._primary) if self._primary is not None else None
        return hit[0]() if hit is not None else None

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

    # -- what runners and the launcher call ---------------------------------------------

    def add_pending(self, kind: str, name: str, pending: Any, meta: dict[str, Any] | None = None,
                    chain: tuple[int, float] | None = None) -> None:
        """Buffer an already begun fingerprint as the step's next record ``kind name``
        (``runners.distributed_torch``: what entered or left a collective); ``chain``: its
        place in chain order (``(kind rank, seq)``) when not its kind's."""
        e = _Entry(kind=kind, name=name, pending=pending, meta=meta, chain=chain)
        e.seq = len(self._entries)
        self._entries.append(e)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizers.add(optimizer)

    def track_loader(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)

    def add_step_scalar(self, key: str, value: Any) -> None:
        """A runner's scalar for the step in progress (Lightning's ``scalars["lightning"]``)."""
        if not self.done:
            self._scalars[key] = value

    def claim_next(self) -> None:
        """A runner says a training batch starts (``torch_batches.BatchesObserver.claim_next``)."""
        self.observers["batches"].claim_next()

    def evaluation_after_last_step(self) -> list[dict[str, Any]]:
        """Evaluation that ran after the last written step (a test after fit), as JSON."""
        return self._evaluation.take()

    @property
    def manifest_extra(self) -> dict[str, Any]:
        """``before_first_step`` when the run wrote no step (it crashed or ended first): the
        backward calls so far (and how many started from a tensor with no graph), the
        parameters whose initial value was seen and those of them frozen; the doctor reads it
        to name the cause of a run that never stepped."""
        return self.observers["manual"].manifest_extra()

    def finish_manual(self) -> None:
        """At the end of the program: a pending step of a loop without an optimizer ends here."""
        self.observers["manual"].finish()

    def state_objects(self, opt: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """The stateful objects seen so far: model(s), optimizer(s), schedulers, scaler."""
        return self.observers["state"].objects(opt)

    def shutdown_loaders(self) -> None:
        """Stop the worker processes of every DataLoader iterator seen (multi-process loading)."""
        self.observers["batches"].shutdown_loaders()

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
                self._evaluation.forward(module)
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
                self._in_stack[-1] = self._forward.module_inputs(args)
        self._record_s += time.perf_counter() - t0

    def _training_root(self, module: torch.nn.Module, args: tuple) -> None:
        """A root's forward with gradients on: it trains. Observers in chain order: a step of
        a loop without an optimizer may end first (``before_root``); then, once the root is
        named, the batches drawn for it, its initial parameters (step 0), its arguments."""
        for before in self._on["before_root"]:
            before(module)
            if self.done:
                return
        self.add_root(module)
        if module.training:
            self._train_mode_roots.add(id(module))
        self._trained = True
        for observe in self._on["training_root"]:
            observe(module, args)

    @_hook
    def _fwd(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        inputs = None
        stack = self._stack
        if stack and stack[-1] is module:
            stack.pop()
            inputs = self._in_stack.pop()
        else:  # an exception unwound inner calls without their hooks
            for k in range(len(stack) - 1, -1, -1):
                if stack[k] is module:
                    inputs = self._in_stack[k]
                    del stack[k:], self._in_stack[k:]
                    break
        if self.done or self._quiet or output is None:
            return
        if not _training() or self.phase is not None or self._eval_root is not None:
            if not stack:
                self._evaluation.output(output)
                self._eval_root = None
            return
        if self._sentinel:  # no activations, no output
            return
        t0 = time.perf_counter()
        with _NoGrad():
            self._forward.module_output(module, kwargs, output, inputs, not stack)
        self._record_s += time.perf_counter() - t0

    @_hook
    def _grad_hook(self, p: torch.Tensor) -> None:
        self._gradients.hook(p)

    @_hook
    def _add_losses(self, tensors: Any) -> None:
        if self._quiet:
            return
        t0 = time.perf_counter()
        ts = [t for t in ([tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ()))
              if isinstance(t, torch.Tensor)]
        for observe in self._on["losses"]:
            observe(ts)
        self._record_s += time.perf_counter() - t0

    @_hook
    def _after_backward(self) -> None:
        if self._quiet:
            return
        self.backwards += 1
        for observe in self._on["after_backward"]:
            observe()

    @_hook
    def _skipped_step(self, opt: torch.optim.Optimizer) -> None:
        self._opt_seen = True
        self._optimizers.add(opt)
        self._record_grads(opt)  # the non-finite gradients that made the scaler skip
        self._scalars["scaler_skipped"] = True
        self._end_step(opt)

    @_hook
    def _on_batch(self, it: Any, idx: Any, data: Any, t0: float, t1: float) -> None:
        if self._quiet:
            return
        self.observers["batches"].on_batch(it, idx, data, t0, t1)

    @_hook
    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> Any:
        self._raise_if_failed()
        if self.done:
            return None
        self._opt_seen = True
        self.observers["manual"].snap.clear()
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
        """The gradients ``opt`` takes (after the parameters' initial values it never showed)."""
        self._gradients.flush()  # (times itself)
        t0 = time.perf_counter()
        self.observers["init"].before_grads(opt)  # (before the update; after a closure's forward named the model)
        self._gradients.record(opt)
        self._record_s += time.perf_counter() - t0

    @_hook
    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self._opt_posts += 1
        if self.done:
            return
        with _gc_paused():
            self.observers["params"].after_update(opt)
            self._end_step(opt)
