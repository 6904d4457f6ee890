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

import sys
from importlib.metadata import entry_points
from typing import Any, Mapping

__all__ = ["callbacks", "make_callback", "activate", "FACTORY_GROUPS"]

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
    out["strategy"] = type(strategy).__name__ if strategy is not None else None
    accel = getattr(trainer, "accelerator", None)
    out["accelerator"] = type(accel).__name__ if accel is not None else None
    try:
        import lightning

        out["version"] = lightning.__version__
    except ImportError:
        out["version"] = getattr(sys.modules.get("pytorch_lightning"), "__version__", None)
    return out


def make_callback(recorder: Any) -> Any:
    """A Lightning ``Callback`` bound to ``recorder`` (a ``TorchRecorder``)."""

    def set_settings(trainer: Any) -> None:
        recorder.environment_extra["lightning"] = _trainer_settings(trainer)

    def set_phase(phase: str | None, *, only_from: tuple[str | None, ...] | None = None) -> None:
        if only_from is None or recorder.phase in only_from:
            recorder.phase = phase

    def prefetching() -> None:
        recorder.prefetch = True

    class ReprobisectCallback(_callback_base()):  # type: ignore[misc]
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage == "fit":
                recorder.guarded("lightning_setup", recorder.set_model, pl_module)
            recorder.guarded("lightning_setup", prefetching)

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            recorder.guarded("lightning_fit_start", set_settings, trainer)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if not recorder.done:
                recorder.guarded("lightning_train_batch_start", recorder.claim_next)

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

    return ReprobisectCallback()
