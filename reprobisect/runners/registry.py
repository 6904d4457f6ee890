"""Recorders by the module that triggers them: the launcher activates one when the script imports its trigger.

Each framework's recorder registers the top-level module(s) whose import means the script
uses it (``torch``; Lightning's ``lightning.pytorch`` / ``pytorch_lightning``) and an
``activate`` function. The launcher (``reprobisect.runners.launch``) watches the imports of
every registered trigger and, right after the script's import of one finishes (or at once
when it was imported before the script started), calls its ``activate`` with the run —
once, and only then: a recorder whose framework the script never imports costs nothing
and imports nothing. A new framework (TensorFlow/Keras) plugs in with one ``register``
call here; the launcher's logic does not change.

``activate(run)`` gets the launcher's run (``run.writer``: the ``TraceWriter``; ``run.ns``:
the launcher's options) and returns the recorder it installed, which the launcher then
drives (stop, seal, notes), or None when it only hooks into another recorder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from reprobisect import native
from reprobisect.runners import lightning
from reprobisect.runners.policy import policy_from

__all__ = ["RecorderEntry", "register", "unregister", "recorders"]


@dataclass(frozen=True, kw_only=True)
class RecorderEntry:
    """One registered recorder."""

    name: str
    """Its name (``torch``, ``lightning``), unique in the registry."""
    triggers: tuple[str, ...]
    """Modules whose import by the script activates it (any one of them)."""
    activate: Callable[[Any], Any]
    """Called once with the launcher's run; returns the recorder it installed, or None."""


_RECORDERS: dict[str, RecorderEntry] = {}


def register(name: str, triggers: tuple[str, ...] | str, activate: Callable[[Any], Any]) -> RecorderEntry:
    """Register a recorder activated by the import of ``triggers``; a name registered twice is a ``ValueError``."""
    if name in _RECORDERS:
        raise ValueError(f"recorder '{name}' is already registered")
    trig = (triggers,) if isinstance(triggers, str) else tuple(triggers)
    if not trig or not all(isinstance(t, str) and t for t in trig):
        raise ValueError(f"recorder '{name}' needs at least one trigger module name, got {triggers!r}")
    entry = RecorderEntry(name=name, triggers=trig, activate=activate)
    _RECORDERS[name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove the recorder ``name`` (a ``ValueError`` when it is not registered)."""
    if _RECORDERS.pop(name, None) is None:
        raise ValueError(f"recorder '{name}' is not registered")


def recorders() -> tuple[RecorderEntry, ...]:
    """The registered recorders, in registration order."""
    return tuple(_RECORDERS.values())


# --------------------------------------------------------------------------- the built-in recorders


def _activate_torch(run: Any) -> Any:
    """The PyTorch recorder (``reprobisect.runners.torch``) with the launcher's policy."""
    from reprobisect.runners.torch import TorchRecorder  # the framework: imported when the script did

    policy = policy_from(run.ns)
    recorder = TorchRecorder(run.writer, policy, stop_at_limit=True).install()
    native.kernel()  # built (once per machine) or loaded now, not inside the first step
    return recorder


register("torch", "torch", _activate_torch)
register("lightning", tuple(lightning.FACTORY_GROUPS), lightning.activate)


def _activate_tensorflow(run: Any) -> Any:
    """The TensorFlow/Keras recorder (``reprobisect.runners.tensorflow``); never imports torch."""
    from reprobisect.runners.tensorflow import TFRecorder

    return TFRecorder(run.writer, policy_from(run.ns), stop_at_limit=True).install()


def _activate_keras(run: Any) -> Any:
    """Keras finished importing: wrap its layers, optimizers and ``fit`` for the TF recorder
    (Keras imports TensorFlow first, so that recorder exists unless the backend is not TF)."""
    import sys

    rtf = sys.modules.get("reprobisect.runners.tensorflow")  # never imports TensorFlow on Keras' behalf
    rec = rtf.current() if rtf is not None else None
    if rec is None:  # Keras on another backend (JAX, torch): TensorFlow may never be imported
        return None
    rtf.install_keras(rec)
    return None


register("tensorflow", ("tensorflow", "keras"), _activate_tensorflow)
register("keras", "keras", _activate_keras)


def _activate_hold_torch(run: Any) -> Any:
    """What a confirming re-run holds fixed in torch (``reprobisect.runners.hold``); no recorder."""
    from reprobisect.runners import hold

    return hold.activate_torch(run)


def _activate_hold_tensorflow(run: Any) -> Any:
    """What a confirming re-run holds fixed in TensorFlow (``reprobisect.runners.hold``); no recorder."""
    from reprobisect.runners import hold

    return hold.activate_tensorflow(run)


register("hold-torch", "torch", _activate_hold_torch)
register("hold-tensorflow", "tensorflow", _activate_hold_tensorflow)
