"""The TensorFlow / Keras API of reprobisect, for code that wants to record explicitly.

::

    import reprobisect.tensorflow as rtf

    with rtf.record(model=model, optimizer=opt, trace="run.trace", steps=3) as rec:
        for xb, yb in ds:
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))   # recorded by itself
            # or, for an update the recorder cannot see (no Keras optimizer):
            # for v, g in zip(vs, grads): v.assign_sub(0.1 * g)
            # rec.step(loss=loss, grads=grads, variables=vs)

``record`` installs the recorder the launcher uses (``reprobisect.runners.tensorflow``) for
the duration of the block: every Keras optimizer ``apply`` (``apply_gradients``, ``fit``)
ends a step, as under ``bisect capture``. ``rec.step(loss=, grads=, variables=)`` ends a
step by hand where no Keras optimizer updates the variables; it is a no-op (returns False)
when an optimizer already ended a step since the previous call. The first ``steps`` steps
are recorded, then the recorder goes quiet (it never stops your loop); the trace is sealed
when the block ends: ``complete`` (outcome ok or ``nonfinite``), ``failed`` with outcome
``crashed`` when the block raises, ``no_steps`` when no step happened. ``model`` names
nothing (Keras variables carry their own paths) but is what complete state is taken from;
``optimizer`` likewise.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from typing import Any, Iterator, Sequence

from reprobisect.runners.explicit import crashed, finished, open_writer, seal

__all__ = ["record", "Recording"]


class Recording:
    """The handle ``record`` yields: ``step(...)`` for updates made by hand, ``recorder`` itself."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def step(self, *, loss: Any = None, grads: Any = None, variables: Any = None, lr: Any = None) -> bool:
        """End a step after an update the recorder cannot observe (see the module docstring)."""
        return bool(self.recorder.manual_step(loss=loss, grads=grads, variables=variables, lr=lr))

    @property
    def steps(self) -> int:
        return int(self.recorder.writer.steps_written)


API = "reprobisect.tensorflow.record"
"""The name the trace's manifest and messages give this API."""


@contextlib.contextmanager
def record(
    model: Any = None,
    optimizer: Any = None,
    *,
    trace: str | os.PathLike,
    steps: int = 3,
    full_steps: Sequence[int] = (),
    state_steps: Sequence[int] = (),
    stop_on_nonfinite: bool = False,
    max_disk: int | None = None,
    detail: str = "full",
    state_every: int | None = None,
    seed: Any = None,
    command: Sequence[str] | None = None,
) -> Iterator[Recording]:
    """Record the first ``steps`` steps run inside the block into ``trace``."""
    from reprobisect.runners.tensorflow import RecordPolicy, TFRecorder, install_keras

    policy = RecordPolicy(steps=steps, full_steps=tuple(full_steps), state_steps=tuple(state_steps),
                          stop_on_nonfinite=stop_on_nonfinite, max_disk=max_disk, detail=detail,
                          state_every=state_every)
    writer = open_writer(trace, policy, command=command, seed=seed, api=API)
    rec = TFRecorder(writer, policy, stop_at_limit=False).install()
    if "keras" in sys.modules:
        install_keras(rec)
    if model is not None:
        rec.model_ref = weakref.ref(model)
    if optimizer is not None:
        rec.optimizer_ref = weakref.ref(optimizer)
    try:
        yield Recording(rec)
    except BaseException as e:
        rec.remove()
        seal(writer, rec, crashed(e, writer, trace))
        raise
    rec.remove()
    seal(writer, rec, finished(writer, rec, trace, api=API, no_steps=rec.no_steps_detail, failed=rec.failed))
