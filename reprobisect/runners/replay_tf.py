"""Replay for TensorFlow / Keras: steps ``S..`` recorded by re-running the command, quiet before ``S``.

``--replay-from X --replay-step S`` on a TensorFlow/Keras command (the launcher picks this
module when the TF recorder is the one active). The torch replayer loads the complete state
``X`` holds after step ``S - 1`` into the fresh run where step ``S`` begins; for TensorFlow
that restore point is not known faithfully yet (a ``fit`` epoch's iterator is built inside
Keras; a custom loop's iterator, its counters and a tape's graph caches are the script's).
This replayer therefore does not load the state: the command runs from its start with the
recorder quiet (no fingerprints, nothing written) for steps ``0 .. S-1``, and records steps
``S .. S + steps - 1`` with full detail, numbered as in the original run. The state trace
``X`` is read only to check that it exists (``state/step-<S-1>``), so that the request is
the one a state replay would serve.

Faithful by construction as far as the program is deterministic up to ``S``; where it is
not (an unseeded shuffle, a nondeterministic op), the replayed steps before the divergence
differ from the original's and ``workflows.replay.verify_replay`` says the replay is not
evidence. The cost is the plain run of steps ``0 .. S-1`` (no recording), not a restore;
the manifest's ``extra.replay.mode`` is ``rerun`` and ``restored`` is False: nothing was
loaded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

__all__ = ["Replayer"]


class Replayer:
    """Quiets a ``TFRecorder`` until step ``first_step``; then it records ``steps`` steps."""

    mode = "rerun"

    def __init__(self, recorder: Any, trace: str, first_step: int, steps: int) -> None:
        self.recorder = recorder
        self.trace = Path(trace)
        self.first_step = int(first_step)
        self.steps = int(steps)
        self.refused: str | None = None

    @property
    def restored(self) -> bool:
        """The run reached step ``first_step`` (nothing is loaded: the launcher's 'reached' test)."""
        return self.recorder.step >= self.first_step or self.recorder.writer.steps_written > 0

    def install(self) -> "Replayer":
        rec = self.recorder
        state = self.trace / "state" / f"step-{self.first_step - 1}"
        if self.first_step < 1 or not (state / "rng.json").is_file():
            self.refused = (f"cannot replay: the trace '{self.trace}' holds no complete state after step "
                            f"{self.first_step - 1}")
            rec.done = True  # records nothing; stopped at the first safe point, the launcher says why
            rec.stop = type(rec).stop_class("ok", 0, self.refused)
            return self
        rec.record_from = self.first_step
        rec.policy = dataclasses.replace(rec.policy, steps=self.first_step + self.steps)
        rec.notes.append(f"replayed from step {self.first_step} by re-running the command from its start, unrecorded "
                         f"before step {self.first_step} (TensorFlow: the state of '{self.trace}' is not loaded)")
        return self

    @property
    def detail(self) -> str:
        n = self.recorder.writer.steps_written
        return (f"replayed {n} step(s) from step {self.first_step} by re-running the command from its start "
                f"(unrecorded before step {self.first_step}; TensorFlow replays do not load a state)")

    def manifest_extra(self) -> dict[str, Any]:
        """What the trace's manifest says about this replay."""
        return {"from": str(self.trace.resolve()), "step": self.first_step, "state_step": self.first_step - 1,
                "mode": self.mode, "restored": False, "reached": self.restored,
                **({"refused": self.refused} if self.refused else {})}
