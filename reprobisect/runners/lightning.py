"""Lightning: a callback that tells the torch recorder what the Trainer knows.

Lightning calls ``training_step`` on the LightningModule directly, never through
``__call__``, so the global module hooks alone would see the first submodule the step calls
as the model and name parameters from there (``0.weight`` instead of ``body.0.weight``).
The callback makes the LightningModule the model (names match its ``state_dict`` keys)
and records the Trainer's settings that change numerics (precision, gradient
accumulation, clipping, strategy, devices) in the trace's environment.

It also names what the global hooks cannot tell apart: the sanity check, validation, test
and predict loops set the recorder's ``phase`` (their batches and forward passes are
evaluation, summarised in ``scalars["eval"]``, never a training step's records), and
``on_train_batch_start`` says which drawn batch trains now: Lightning's fetcher draws one
batch ahead, so the batch drawn last belongs to the next step (``recorder.prefetch``).

What a step is: one optimizer step, as everywhere in the torch recorder, and as
Lightning's own ``global_step`` counts them: with ``accumulate_grad_batches=k`` one step
holds its k micro-batches (``ids``, ``ids#1``, ... ``input``, ``input#1``, ... ``loss``,
``loss#1``, ...: the ``#i`` suffix is the micro-batch index); under manual optimization
each ``opt.step()`` is a step (a GAN's discriminator and generator updates are two steps,
as they are two of Lightning's global steps). Each step's ``scalars["lightning"]`` holds
the Trainer's own state at its optimizer step (``on_before_optimizer_step``), cheap
enough for every step: ``global_step`` (optimizer steps completed before this one),
``epoch``, ``batch_idx`` (of the batch the optimizer steps in), ``loops`` (a fingerprint of
the fit loop's progress, ``fit_loop.state_dict()`` with the dataloader's position) and
``callbacks`` (``{state_key: fingerprint of its state_dict()}``, the states a checkpoint
saves): what ``bisect resume`` reads to name what a Lightning checkpoint forgot.

Bounded work (the launcher's ``--steps N``): after the N-th optimizer step the callback
asks the Trainer to stop (``trainer.should_stop``, as early stopping does), so loggers,
``ModelCheckpoint`` and the end-of-fit hooks (the validation Lightning runs on an early
stop) run as they always do, unrecorded, then the script goes on (a ``trainer.test``
after fit runs too; the recorder is quiet after its last step). No ``fast_dev_run``, no
exception through Lightning. When the Trainer does not stop when asked (``min_steps``
or ``min_epochs`` not reached, a second ``fit``), the next training batch raises the
recorder's ``StopRun`` as any other loop would. Under ``bisect resume``'s preemption-like
stop (``RecordPolicy.defer_stop``) the callback leaves the stop to the recorder: the run
ends as the next step begins, after step K's ``on_train_batch_end`` (its checkpoint save),
with none of the end-of-fit code a preemption never runs.

It reaches an unmodified script through Lightning's external-callback entry points
(``lightning.pytorch.callbacks_factory``, ``pytorch_lightning.callbacks_factory``), which
Lightning reads for EVERY Trainer in every environment where reprobisect is installed.
So ``callbacks()`` returns nothing unless a recorder is active in this process (a run
under the launcher), and never raises: a failing factory would break every Lightning user.

The launcher activates ``activate`` when the script imports Lightning
(``reprobisect.runners.registry``): Lightning records through the torch recorder (active
already: Lightning imports torch first), so there is nothing to install; when the entry
point is not installed (reprobisect used from a source folder, not pip-installed), the
trace's notes say that the Trainer's settings and loop phases went unrecorded.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib.metadata import entry_points
from typing import Any, Mapping

__all__ = ["callbacks", "make_callback", "activate", "lightning_state", "fingerprint_state", "FACTORY_GROUPS"]

FACTORY_GROUPS = {"lightning.pytorch": "lightning.pytorch.callbacks_factory",
                  "pytorch_lightning": "pytorch_lightning.callbacks_factory"}
"""Lightning's package -> the entry-point group its Trainer reads external callbacks from."""
_ENTRY = "reprobisect.runners.lightning:callbacks"


def activate(run: Any, groups: Mapping[str, str] = FACTORY_GROUPS) -> None:
    """The launcher's activation on the script's import of Lightning (``groups``: package -> group).

    Installs nothing; notes on the active recorder each imported Lightning package whose
    factory group lacks this module's ``callbacks`` entry point (never raises)."""
    recorder = getattr(run, "recorder", None)
    try:
        missing = [pkg for pkg, group in groups.items()
                   if pkg in sys.modules and not any(ep.value == _ENTRY for ep in entry_points(group=group))]
    except Exception:  # noqa: BLE001 - a broken metadata install must not stop the run
        return
    for pkg in missing:
        if recorder is not None:
            recorder.notes.append(
                f"{pkg}: reprobisect's Lightning callback is not installed as an entry point (reprobisect used "
                "from a source folder?): the Trainer's settings and loop phases are not recorded; "
                "pip install reprobisect to record them")


def callbacks() -> list[Any]:
    """The entry point: ``[callback]`` under an active recorder, else ``[]``."""
    try:
        rec = getattr(sys.modules.get("reprobisect.runners.torch"), "ACTIVE", None)
        if rec is None:
            return []
        return [make_callback(rec)]
    except Exception as e:  # never break the user's Trainer
        print(f"reprobisect: Lightning callback not added ({type(e).__name__}: {e})", file=sys.stderr)
        return []


def _callback_base() -> type:
    # the package the script uses: the unified one, else the older standalone one
    for name in ("lightning.pytorch", "pytorch_lightning"):
        mod = sys.modules.get(name)
        if mod is not None:
            return mod.Callback
    import lightning.pytorch as pl

    return pl.Callback


def _trainer_settings(trainer: Any) -> dict[str, Any]:
    def get(name: str) -> Any:
        try:
            v = getattr(trainer, name)
        except Exception:
            return None
        return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)

    out = {name: get(name) for name in (
        "precision", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm",
        "num_devices", "num_nodes", "max_steps", "max_epochs", "deterministic",
    )}
    strategy = getattr(trainer, "strategy", None)
    module = getattr(trainer, "lightning_module", None)
    out["automatic_optimization"] = getattr(module, "automatic_optimization", None)
    out["strategy"] = type(strategy).__name__ if strategy is not None else None
    accel = getattr(trainer, "accelerator", None)
    out["accelerator"] = type(accel).__name__ if accel is not None else None
    try:
        import lightning

        out["version"] = lightning.__version__
    except ImportError:
        out["version"] = getattr(sys.modules.get("pytorch_lightning"), "__version__", None)
    return out


def _plain(obj: Any) -> Any:
    """``obj`` as JSON-able data that is the same for the same state in another process: tensors
    and arrays by dtype, shape and a hash of their bytes; other objects by their type's name
    (never a ``repr`` that holds a memory address)."""
    if isinstance(obj, (str, int, bool, type(None))):
        return obj
    if isinstance(obj, float):
        return repr(obj)  # nan and inf too
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "detach") and hasattr(obj, "numpy"):  # a torch tensor (imported already: Lightning runs)
        import torch

        t = obj.detach().cpu().contiguous().reshape(-1)
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""  # any dtype, bfloat16 too
        return {"tensor": str(obj.dtype), "shape": list(obj.shape), "sha": _digest(raw)}
    if hasattr(obj, "tobytes") and hasattr(obj, "dtype"):  # a NumPy array or scalar
        return {"array": str(obj.dtype), "shape": list(getattr(obj, "shape", ())), "sha": _digest(obj.tobytes())}
    if hasattr(obj, "item") and not hasattr(obj, "__len__"):
        return _plain(obj.item())
    return {"object": type(obj).__qualname__}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def fingerprint_state(state: Any) -> str:
    """A short hex fingerprint of a ``state_dict()``-like structure (key order does not count)."""
    return _digest(json.dumps(_plain(state), sort_keys=True, separators=(",", ":")).encode())


def lightning_state(trainer: Any, batch_idx: int | None) -> dict[str, Any]:
    """The Trainer's own state for a step's ``scalars["lightning"]`` (see the module docstring)."""
    callbacks: dict[str, str] = {}
    for cb in getattr(trainer, "callbacks", ()):
        try:
            state = cb.state_dict()
        except Exception as e:  # noqa: BLE001 - a callback's own failure is not the run's
            callbacks[str(getattr(cb, "state_key", type(cb).__name__))] = f"error: {type(e).__name__}"
            continue
        if state:  # as Lightning's checkpoint keeps them (_call_callbacks_state_dict)
            callbacks[str(cb.state_key)] = fingerprint_state(state)
    progress: dict[str, int] = {}
    try:
        loop_state = trainer.fit_loop.state_dict()
        loops = fingerprint_state(loop_state)
        _counters(loop_state, "", progress)
    except Exception as e:  # noqa: BLE001 - another Lightning's loops: named, not a stopped run
        loops = f"error: {type(e).__name__}"
    return {
        "global_step": int(trainer.global_step),
        "epoch": int(trainer.current_epoch),
        "batch_idx": int(batch_idx) if batch_idx is not None else -1,
        "loops": loops,
        "progress": progress,
        "callbacks": callbacks,
    }


def _counters(state: Any, prefix: str, out: dict[str, int], limit: int = 200) -> None:
    """The integer leaves of the loops' ``state_dict()`` (progress counters) by dotted path, so
    that a difference in ``loops`` can be named (``epoch_progress.total.started 2 vs 1``)."""
    if isinstance(state, Mapping):
        for k, v in state.items():
            if len(out) >= limit:
                return
            _counters(v, f"{prefix}{k}.", out, limit)
    elif isinstance(state, int) and not isinstance(state, bool):
        out[prefix[:-1]] = int(state)


def make_callback(recorder: Any) -> Any:
    """A Lightning ``Callback`` bound to ``recorder`` (a ``TorchRecorder``)."""

    def set_settings(trainer: Any) -> None:
        recorder.environment_extra["lightning"] = _trainer_settings(trainer)

    def set_phase(phase: str | None, *, only_from: tuple[str | None, ...] | None = None) -> None:
        if only_from is None or recorder.phase in only_from:
            recorder.phase = phase

    def prefetching() -> None:
        recorder.prefetch = True

    bound = {"stops": False, "batch_idx": None}  # this callback ends the fit at --steps (see the docstring)

    def take_over_the_stop() -> None:
        # the recorder reaches --steps inside optimizer.step(); the Trainer is asked to stop at
        # the batch's end instead of an exception going through Lightning's loops. Not under a
        # preemption-like stop (``bisect resume``'s ``defer_stop``): that one must not run the
        # end-of-fit code (validation on stop, epoch-end checkpoints) a preemption never runs
        if recorder.stop_at_limit and not getattr(recorder.policy, "defer_stop", False):
            bound["stops"] = True
            recorder.stop_at_limit = False

    def stop_if_done(trainer: Any, *, ask: bool) -> None:
        stop = recorder.stop
        if not bound["stops"] or stop is None:
            return
        if ask and stop.reason == "ok" and getattr(trainer.fit_loop, "_can_stop_early", True):
            trainer.should_stop = True
            return
        raise stop  # a failure or a non-finite stop, or a Trainer that did not stop when asked

    def step_state(trainer: Any) -> None:
        recorder.add_step_scalar("lightning", lightning_state(trainer, bound["batch_idx"]))

    class ReprobisectCallback(_phase_hooks(set_phase), _callback_base()):  # type: ignore[misc]
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage == "fit":
                recorder.guarded("lightning_setup", recorder.set_model, pl_module)
                take_over_the_stop()
            recorder.guarded("lightning_setup", prefetching)

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            recorder.guarded("lightning_fit_start", set_settings, trainer)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            stop_if_done(trainer, ask=False)
            bound["batch_idx"] = batch_idx
            if not recorder.done:
                recorder.guarded("lightning_train_batch_start", recorder.claim_next)

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            if not recorder.done:
                recorder.guarded("lightning_step_state", step_state, trainer)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            stop_if_done(trainer, ask=True)

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage == "fit" and bound["stops"]:
                bound["stops"] = False
                recorder.stop_at_limit = True

    return ReprobisectCallback()


def _phase_hooks(set_phase: Any) -> type:
    """The evaluation-loop hooks of the callback: they name the phase the recorder is in, so
    sanity-check, validation, test and predict batches are never taken for training steps."""

    class PhaseHooks:
        # evaluation loops: the sanity check runs the validation loop (its hooks keep its name)
        def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
            set_phase("sanity_check")

        def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
            set_phase(None)

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            set_phase("validation", only_from=(None,))

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            set_phase(None, only_from=("validation",))

        def on_test_start(self, trainer: Any, pl_module: Any) -> None:
            set_phase("test")

        def on_test_end(self, trainer: Any, pl_module: Any) -> None:
            set_phase(None)

        def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
            set_phase("predict")

        def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
            set_phase(None)

    return PhaseHooks
