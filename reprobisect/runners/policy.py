"""What a recorder records and how it ends the run: ``RecordPolicy`` and ``StopRun``, one
for every framework's recorder (torch, TensorFlow), free of any framework import so that
the launcher can recognise a recorder's stop without importing the framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reprobisect.errors import UsageError
from reprobisect.trace.format import DEFAULT_STATE_EVERY, DETAILS

__all__ = ["RecordPolicy", "StopRun", "policy_from"]


@dataclass(frozen=True, kw_only=True)
class RecordPolicy:
    """What to record, and for how long."""

    steps: int = 3
    """Optimizer steps to record; after that the recorder stops (the launcher ends the run)."""
    full_steps: tuple[int, ...] = ()
    """Steps whose full tensors are stored next to the fingerprints."""
    state_steps: tuple[int, ...] = ()
    """Steps after which complete state (model, optimizer, RNG, data order) is captured."""
    stop_on_nonfinite: bool = False
    """End at the first step holding a NaN or Inf (outcome ``nonfinite``)."""
    max_disk: int | None = None
    """Bound in bytes for the trace; full tensors and state beyond it are not kept (noted)."""
    stats: bool = True
    """Compute norm/min/max/mean/NaN/Inf next to each fingerprint."""
    zoom_module: str | None = None
    """Module whose aten ops are recorded at ``zoom_step`` (op-level zoom)."""
    zoom_step: int | None = None
    """Step of the op-level zoom."""
    max_records_per_step: int = 20000
    """Bound on the forward records (input/activation/output) of one step; past it the
    step's remaining activations are counted, not recorded (noted in the trace)."""
    detail: str = "full"
    """``full``: every record of the chain, every step. ``sentinel``: per step only the
    records of ``SENTINEL_KINDS`` (initial parameters, batch IDs and tensors, loss,
    parameters after the step) and the scalars (total gradient norm, learning rates,
    GradScaler scale): no activations, no per-tensor gradients, no optimizer state."""
    defer_stop: bool = False
    """End the run after the last step's own end-of-step code (its checkpoint save), when the
    next step begins, like a preemption (``bisect resume``; ``runners.preempt_torch``)."""
    state_every: int | None = None
    """Capture complete state after every ``state_every``-th step (steps K-1, 2K-1, ...:
    the state a replay of step K starts from), besides ``state_steps``. None: only
    ``state_steps``; with ``detail='sentinel'`` None means ``DEFAULT_STATE_EVERY``."""
    overfit: bool = False
    """``bisect doctor``'s fixed-batch test: repeat the first training batch, dropout and
    weight decay off (``runners.overfit_torch``)."""
    memory: bool = False
    """Record per-step memory figures (``scalars["memory"]``; ``runners.memory_torch``)."""

    def __post_init__(self) -> None:
        if self.detail not in DETAILS:
            raise UsageError(f"detail takes {' or '.join(DETAILS)} (got {self.detail!r})")
        if self.state_every is None and self.detail == "sentinel":
            object.__setattr__(self, "state_every", DEFAULT_STATE_EVERY)
        if self.state_every is not None and (isinstance(self.state_every, bool) or not isinstance(self.state_every, int)
                                             or self.state_every < 1):
            raise UsageError(f"state_every takes a whole number of steps >= 1 (got {self.state_every!r})")

    @property
    def sentinel(self) -> bool:
        """Only the sentinels of each step are recorded (``detail='sentinel'``)."""
        return self.detail == "sentinel"

    def wants_state(self, step: int) -> bool:
        """Whether complete state is captured after ``step``."""
        k = self.state_every
        return step in self.state_steps or (k is not None and step % k == k - 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "full_steps": list(self.full_steps),
            "state_steps": list(self.state_steps),
            "stop_on_nonfinite": self.stop_on_nonfinite,
            "max_disk": self.max_disk,
            "stats": self.stats,
            "zoom_module": self.zoom_module,
            "zoom_step": self.zoom_step,
            "max_records_per_step": self.max_records_per_step,
            "detail": self.detail,
            "state_every": self.state_every,
            **({"overfit": True} if self.overfit else {}),
            **({"memory": True} if self.memory else {}),
            **({"defer_stop": True} if self.defer_stop else {}),
        }


class StopRun(BaseException):
    """Raised from the optimizer step hook to end the user's run after the last recorded step.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that a training loop's
    ``except Exception`` does not swallow it.
    """

    def __init__(self, reason: str, step: int, detail: str = "", traceback: str | None = None) -> None:
        super().__init__(f"reprobisect: {reason} at step {step}")
        self.reason = reason  # ok | nonfinite | recorder_error | no_steps
        self.step = step
        self.detail = detail
        self.traceback = traceback


def policy_from(ns: Any) -> RecordPolicy:
    """The policy the launcher's options (``runners.launch`` namespace) ask for."""
    return RecordPolicy(
        steps=ns.steps,
        full_steps=tuple(ns.full_steps),
        state_steps=tuple(ns.state_steps),
        stop_on_nonfinite=ns.stop_on_nonfinite,
        max_disk=ns.max_disk,
        zoom_module=getattr(ns, "zoom_module", None),
        zoom_step=getattr(ns, "zoom_step", None),
        max_records_per_step=ns.max_records_per_step,
        detail=getattr(ns, "detail", "full"),
        state_every=getattr(ns, "state_every", None),
        overfit=bool(getattr(ns, "overfit", False)),
        memory=bool(getattr(ns, "memory", False)),
        defer_stop=bool(getattr(ns, "defer_stop", False)),
    )
