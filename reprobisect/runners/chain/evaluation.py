"""The evaluation summary both recorders write (``scalars["eval"]``), framework-free.

Evaluation (forwards under ``no_grad``, Keras' ``evaluate``...) is never a record: it is
summarised per run of consecutive evaluation of one phase, into the step it ran before.
``EvalRuns`` keeps the runs since the last step; ``summarize`` turns them into JSON. The
framework's observer fills the runs (forwards, batches, sample IDs, output fingerprints).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from reprobisect.runners.chain.steps import combine
from reprobisect.trace import record_array

__all__ = ["EvalRuns", "summarize"]


class EvalRuns:
    """The evaluation runs since the last step ended; ``cur`` is the one under way."""

    __slots__ = ("runs", "cur", "extra")

    def __init__(self, **extra: Any) -> None:
        self.runs: list[dict[str, Any]] = []
        self.cur: dict[str, Any] | None = None
        self.extra = extra  # keys every new run starts with (TF's "ids_known")

    def run(self, phase: str, step: int) -> dict[str, Any]:
        """The run under way for ``phase`` (a new one when the phase changed), at ``step``."""
        cur = self.cur
        if cur is None or cur["phase"] != phase:
            cur = {"phase": phase, "after_step": step - 1 if step else None, "forwards": 0, "batches": 0,
                   "ids": [], **self.extra, "outputs": []}
            self.runs.append(cur)
            self.cur = cur
        return cur

    def take(self, finish: Callable[[list[Any]], list[str]]) -> list[dict[str, Any]]:
        """The runs as JSON, forgotten here; ``finish`` makes the outputs' fingerprints."""
        runs, self.runs, self.cur = self.runs, [], None
        return summarize(runs, finish)


def summarize(runs: list[dict[str, Any]], finish: Callable[[list[Any]], list[str]]) -> list[dict[str, Any]]:
    """``scalars["eval"]``: one entry per run (its IDs fingerprinted, its outputs combined)."""
    out = []
    for r in runs:
        ids = np.concatenate(r["ids"]) if r["ids"] and r.get("ids_known", True) else None
        outs = finish(r["outputs"]) if r["outputs"] else []
        out.append({
            "phase": r["phase"],
            "after_step": r["after_step"],
            "forwards": r["forwards"],
            "batches": r["batches"],
            "samples": int(ids.size) if ids is not None else None,
            "ids_fingerprint": record_array("ids", "batch", ids).fingerprint if ids is not None else None,
            "outputs_fingerprint": combine(outs) if outs else None,
            "outputs_fingerprinted": len(outs),
            **({"train_mode_layers": r["train_mode_layers"]} if r.get("train_mode_layers") else {}),
        })
    return out
