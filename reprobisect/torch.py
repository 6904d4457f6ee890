"""The PyTorch API of reprobisect, for code that wants to record or restore explicitly.

::

    import reprobisect.torch as rt

    with rt.record(model, optimizer, loader=loader, trace="run.trace", steps=3) as rec:
        for x, y in loader:
            ...                      # the training loop, unchanged
            optimizer.step()

``record`` installs the same recorder the launcher uses (``reprobisect.runners.torch``:
global module, optimizer and DataLoader hooks) for the duration of the block, with
``model`` as the root whose submodule paths name the records. It records the first
``steps`` optimizer steps, then goes quiet (it never stops your loop), and seals the
trace when the block ends: ``complete`` with outcome ok (or ``nonfinite``), ``failed``
with outcome ``crashed`` when the block raises, ``no_steps`` when no step happened. A step
is what ``reprobisect.runners.torch`` says: an optimizer step, or, in a loop that updates
parameters by hand, that update (the last one ends its step when the block ends);
evaluation under ``no_grad`` is summarised in ``scalars["eval"]``, never a step's records.
While the block runs the hooks are process-wide: another model trained inside it is
recorded too.

The state functions (``capture_state``, ``restore_state``, ``load_state``,
``capture_rng``, ``restore_rng``, ``Stateful``) come from
``reprobisect.runners.torch_state`` and are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any, Iterator, Sequence

from reprobisect.core.outcome import Outcome
from reprobisect.runners.explicit import revision, seal
from reprobisect.runners.torch import RecordPolicy, StopRun, TorchRecorder
from reprobisect.runners.torch_state import (
    Stateful,
    capture_rng,
    capture_state,
    load_state,
    restore_rng,
    restore_state,
)

__all__ = [
    "record",
    "RecordPolicy",
    "TorchRecorder",
    "StopRun",
    "Stateful",
    "capture_state",
    "restore_state",
    "load_state",
    "capture_rng",
    "restore_rng",
]


@contextlib.contextmanager
def record(
    model: Any,
    optimizer: Any = None,
    loader: Any = None,
    *,
    trace: str | os.PathLike,
    steps: int = 3,
    full_steps: Sequence[int] = (),
    state_steps: Sequence[int] = (),
    stop_on_nonfinite: bool = False,
    max_disk: int | None = None,
    max_records_per_step: int = 20000,
    detail: str = "full",
    state_every: int | None = None,
    seed: Any = None,
    command: Sequence[str] | None = None,
) -> Iterator[TorchRecorder]:
    """Record the first ``steps`` optimizer steps run inside the block into ``trace``.

    With ``stop_on_nonfinite`` recording ends at the first step holding a NaN/Inf
    (outcome ``nonfinite``); the loop itself is never interrupted. ``detail='sentinel'``
    records only each step's sentinels and complete state every ``state_every`` steps
    (default 50): see ``RecordPolicy.detail``.
    """
    from reprobisect.trace.writer import TraceWriter

    policy = RecordPolicy(
        steps=steps,
        full_steps=tuple(full_steps),
        state_steps=tuple(state_steps),
        stop_on_nonfinite=stop_on_nonfinite,
        max_disk=max_disk,
        max_records_per_step=max_records_per_step,
        detail=detail,
        state_every=state_every,
    )
    writer = TraceWriter(
        trace,
        command=list(command if command is not None else sys.argv),
        policy=policy.to_json(),
        seed=seed,
        revision=revision(),
        recorder={"api": "reprobisect.torch.record"},
    )
    rec = TorchRecorder(writer, policy, stop_at_limit=False)
    rec.add_root(model)
    if optimizer is not None:
        rec.add_optimizer(optimizer)
    if loader is not None:
        rec.track_loader(loader)
    rec.install()
    try:
        yield rec
    except BaseException as e:
        rec.remove()
        outcome = Outcome(
            "crashed",
            detail=f"{type(e).__name__}: {e}",
            step=writer.steps_written,
            traceback="".join(traceback.format_exception(type(e), e, e.__traceback__))[-20000:],
            trace=os.path.abspath(trace),
        )
        seal(writer, rec, outcome)
        raise
    rec.finish_manual()  # a loop without an optimizer: its last update ends its step here
    rec.remove()
    if rec.stop is not None and rec.stop.reason == "nonfinite":
        outcome = Outcome("nonfinite", detail=rec.stop.detail, step=rec.stop.step)
    elif writer.steps_written == 0:
        from reprobisect.runners.torch import _no_update_detail

        outcome = Outcome("no_steps", detail="no step ran inside reprobisect.torch.record(): "
                                             + _no_update_detail(rec.backwards))
    else:
        outcome = Outcome("ok", detail=f"recorded {writer.steps_written} step(s)")
    seal(writer, rec, Outcome(**{**outcome.to_json(), "trace": os.path.abspath(trace)}))
