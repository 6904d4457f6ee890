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
from typing import Any, Iterator, Sequence

from reprobisect.runners.explicit import crashed, finished, open_writer, seal
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


API = "reprobisect.torch.record"
"""The name the trace's manifest and messages give this API."""


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
    writer = open_writer(trace, policy, command=command, seed=seed, api=API)
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
        seal(writer, rec, crashed(e, writer, trace))
        raise
    rec.finish_manual()  # a loop without an optimizer: its last update ends its step here
    rec.remove()
    from reprobisect.runners.torch import _no_update_detail

    seal(writer, rec, finished(writer, rec, trace, api=API, no_steps=lambda: _no_update_detail(rec.backwards)))
