"""``bisect doctor``'s switches on the PyTorch recorder, installed by ``TorchRecorder.install``
when its policy asks for them: ``overfit`` (``runners.overfit_torch``: the fixed-batch test)
and ``memory`` (``runners.memory_torch``: per-step memory figures). Each adds what it
measures to the step's scalars through the recorder's ``step_observers``.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["install"]


def install(rec: Any) -> Callable[[], None]:
    """Install what ``rec.policy`` asks for on ``rec``; returns the undo."""
    undo: list[Callable[[], None]] = []
    observers = rec.__dict__.setdefault("step_observers", [])
    if rec.policy.overfit:
        from reprobisect.runners.overfit_torch import OverfitIntervention

        o = OverfitIntervention(rec)
        undo.append(o.install())
        observers.append(o.step_scalars)
    if rec.policy.memory:
        from reprobisect.runners.memory_torch import MemoryObserver

        m = MemoryObserver(rec)
        undo.append(m.install())
        observers.append(m.step_scalars)

    def remove() -> None:
        while undo:
            undo.pop()()
        observers.clear()

    return remove
