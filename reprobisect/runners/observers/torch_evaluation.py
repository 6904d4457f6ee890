"""The PyTorch recorder's evaluation summaries (``scalars["eval"]``).

A forward under ``no_grad``/``inference_mode``, in a runner's evaluation phase, or in
``eval()`` mode of a root that trained in ``train()`` mode is evaluation: never a record,
summarised per run of one phase (``runners.chain.evaluation``): root forwards, batches and
their IDs, the first 16 root outputs' fingerprints, layers left in training mode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners.chain import EvalRuns, Observer, register_observer
from reprobisect.runners.observers.torch_common import _MODE_NAMES, _fingerprintable, _mode_layers, _tensors

__all__ = ["EvaluationObserver"]

_EVAL_OUTPUTS = 16
"""Root outputs of one evaluation run whose fingerprints go into its summary."""


def _finish(outputs: list[fpt.Pending]) -> list[str]:
    return [f for f, _ in fpt.finish_many(outputs)]


class EvaluationObserver(Observer):
    """Evaluation runs since the last step, summarised into the next step's scalars."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.runs = EvalRuns()

    def run(self, phase: str | None = None) -> dict[str, Any]:
        """The evaluation run under way (consecutive evaluation of one phase)."""
        if phase is None:
            phase = self.rec.phase or ("inference_mode" if torch.is_inference_mode_enabled()
                                       else "no_grad" if not torch.is_grad_enabled() else "eval_mode")
        return self.runs.run(phase, self.rec.step)

    def forward(self, module: torch.nn.Module) -> None:
        """A root's evaluation forward."""
        run = self.run()
        run["forwards"] += 1
        if run["forwards"] == 1 and run["phase"] in ("no_grad", "inference_mode") and module.training:
            names = [n for n, m in _mode_layers(module) if m.training]
            if names:  # evaluation with dropout/batch norm in training mode (doctor's ``modes``)
                run["train_mode_layers"] = names[:_MODE_NAMES]
        if self.rec.phase is None:
            self.rec.observers["batches"].seen_by(id(module), run)

    def output(self, output: Any) -> None:
        """A root's evaluation output (the first ``_EVAL_OUTPUTS`` of a run are fingerprinted)."""
        outs = self.run()["outputs"]
        if len(outs) >= _EVAL_OUTPUTS:
            return
        with torch.no_grad():
            for t in _tensors(output):
                if _fingerprintable(t) and len(outs) < _EVAL_OUTPUTS:
                    outs.append(fpt.begin(t, with_stats=False))

    def batch(self, ids: np.ndarray | None, phase: str | None = None, run: dict[str, Any] | None = None) -> None:
        """A batch drawn for evaluation (into ``run`` when it is still under way)."""
        if run is None or not any(r is run for r in self.runs.runs):
            run = self.run(phase)
        run["batches"] += 1
        if ids is not None:
            run["ids"].append(ids)

    def training_root(self, module: torch.nn.Module, args: tuple) -> None:
        self.runs.cur = None

    def take(self) -> list[dict[str, Any]]:
        """The evaluation since the last step, as JSON (``scalars["eval"]``), and forget it."""
        return self.runs.take(_finish)

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        evaluation = self.take()
        if evaluation:
            scalars["eval"] = evaluation


register_observer("torch", "evaluation", EvaluationObserver, rank=70)
