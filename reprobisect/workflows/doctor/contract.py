"""``contract``: what enters the loss against the loss's contract.

From one recorded run:

- ``[N, 1]`` predictions against ``[N]`` targets broadcasting to ``[N, N]`` on the way to
  the loss (a hand-written ``(pred - y) ** 2``, or ``F.mse_loss``/``l1_loss`` given those
  shapes): the PyTorch recorder walks the first step's loss graph and notes the op
  (``scalars.loss_broadcast``). Pairwise expressions (``[N, 1]`` against ``[1, N]``) are
  not reported;
- probabilities fed to a loss that expects logits: the recorder sees ``log_softmax`` (inside
  ``cross_entropy``) or ``nll_loss`` right after a ``softmax``, or
  ``binary_cross_entropy_with_logits`` right after a ``sigmoid``, in the first step's loss graph
  (``scalars.loss_probabilities``); else the input of a ``CrossEntropyLoss``
  module whose values lie in [0, 1] with a mean of exactly ``1/C`` (rows that sum to 1: a
  softmax), or an ``NLLLoss`` given non-negative values (it expects log-probabilities);
  read from the recorded stats of the tensor whose fingerprint the loss module received;
- class indices out of range and targets of the wrong dtype crash inside the loss: the
  crash's last line is matched against the loss's own messages, old and new PyTorch's
  (``run.py``, ``CRASH_CONTRACT``); a generic "index out of bounds" elsewhere is not one.
"""

from __future__ import annotations

from typing import Any

from reprobisect.trace.format import Record, Step, stat_value
from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.model import Finding

__all__ = ["CRASH_CONTRACT", "check_contract"]

CRASH_CONTRACT = (
    (r"Target -?\d+ is out of bounds|t >= 0 && t < n_classes", "",
     "a class index in the targets is out of range for the number of classes the model outputs",
     "check the label mapping (0..C-1, not 1..C) and the size of the model's last layer"),
    (r"expected scalar type Long|expected target dtype to be Long", "",
     "the loss expects class indices (int64) but gets floating targets (or another integer type)",
     "give CrossEntropyLoss/NLLLoss int64 class indices (labels.long()), or probabilities of the input's shape"),
    (r"multi-target not supported", "",
     "the targets have one dimension too many for class indices ([N, 1] instead of [N])",
     "pass targets of shape [N] (class indices) to CrossEntropyLoss/NLLLoss"),
    (r"can't be cast to the desired output type (Long|Int|Short|Byte|Bool)", r"loss",
     "the targets are integers but the loss computes in floating point (BCE/BCEWithLogits/MSE expect float targets)",
     "cast the targets with .float() (and give them the prediction's shape)"),
)
"""(pattern of the crash's last line, pattern the traceback must also hold or "", cause, next)
for contract violations the loss raises; a pattern that other code can raise too (a cast) needs
a loss in the traceback."""

_TOL = 1e-4


def _stat(r: Record, k: str) -> float | None:
    try:
        return stat_value(r.stats[k]) if r.stats and k in r.stats else None
    except (KeyError, TypeError, ValueError):
        return None


def _broadcast(steps: list[Step]) -> list[Finding]:
    hit = next(((s, s.scalars["loss_broadcast"]) for s in steps if isinstance(s.scalars.get("loss_broadcast"), dict)),
               None)
    if hit is None:
        return []
    s, b = hit
    ev = {"step": s.step, "op": b.get("op"), "from": b.get("from"), "to": b.get("to"), "loss": s.scalars.get("loss")}
    n = (b.get("from") or [None])[0]
    return [Finding("contract", "error",
                    f"the loss broadcasts predictions of shape [{n}, 1] against targets of shape [{n}] into "
                    f"[{n}, {n}] ({b.get('op')}): every prediction is compared with every label, so the loss is "
                    "wrong even for perfect predictions", ev,
                    "align the shapes where the loss is computed (targets.unsqueeze(1) or predictions.squeeze(1), "
                    "whichever matches the label semantics), not a blanket squeeze elsewhere")]


def _loss_input(step: Step, loss: Record) -> Record | None:
    if not loss.inputs:
        return None
    fp = loss.inputs[0]
    return next((r for r in step.records if r.fingerprint == fp and r is not loss and r.kind != "loss"), None)


def _graph_probabilities(steps: list[Step]) -> list[Finding]:
    """The recorder saw a loss on logits fed a softmax's (or sigmoid's) output in the loss graph."""
    hit = next(((s, s.scalars["loss_probabilities"]) for s in steps
                if isinstance(s.scalars.get("loss_probabilities"), dict)), None)
    if hit is None:
        return []
    s, p = hit
    sig = "Sigmoid" in str(p.get("after"))
    ev = {"step": s.step, "op": p.get("op"), "after": p.get("after"), "what": p.get("what")}
    return [Finding("contract", "error",
                    f"the loss is computed on probabilities but expects logits: {p.get('what')}; the loss applies "
                    f"{'the sigmoid' if sig else 'log_softmax'} itself, so the gradients are squashed and training stalls",
                    ev, f"remove the {'sigmoid' if sig else 'softmax'} before the loss (keep it for inference only), or "
                    f"use {'binary_cross_entropy' if sig else 'nll_loss(torch.log(p))'} if the model must output probabilities")]


def _probabilities(steps: list[Step]) -> list[Finding]:
    graph = _graph_probabilities(steps)
    if graph:
        return graph
    for s in steps[:3]:
        for r in s.records:
            base = r.name.split("@")[0].split("#")[0]
            if r.kind != "activation" or base not in ("CrossEntropyLoss", "NLLLoss"):
                continue
            x = _loss_input(s, r)
            if x is None or len(x.shape) < 2 or x.shape[-1] < 2:
                continue
            lo, hi, mean = _stat(x, "min"), _stat(x, "max"), _stat(x, "mean")
            if lo is None or hi is None or mean is None or lo < 0 or hi > 1:
                continue
            c = x.shape[1] if len(x.shape) > 1 else x.shape[-1]
            ev: dict[str, Any] = {"step": s.step, "loss": base, "input": f"{x.kind} '{x.name}'",
                                  "shape": list(x.shape), "min": lo, "max": hi, "mean": mean, "classes": c}
            if base == "CrossEntropyLoss" and abs(mean - 1 / c) <= _TOL / c:
                return [Finding("contract", "error",
                                f"CrossEntropyLoss gets probabilities (every value in [0, 1], mean exactly 1/{c}: rows "
                                "that sum to 1, a softmax) but expects logits: it applies log_softmax itself, so the "
                                "gradients are squashed and training stalls", ev,
                                "remove the softmax before CrossEntropyLoss (keep it for inference only)")]
            if base == "NLLLoss" and hi > 0:
                return [Finding("contract", "error",
                                "NLLLoss gets values in [0, 1] (probabilities) but expects log-probabilities (<= 0)",
                                ev, "use log_softmax instead of softmax before NLLLoss (or CrossEntropyLoss on logits)")]
    return []


def check_contract(trace: Trace) -> list[Finding]:
    """The ``contract`` findings of one recorded run, or one ``info``."""
    steps = list(trace.steps)
    found = _broadcast(steps) + _probabilities(steps)
    if found:
        return found
    return [Finding("contract", "info", "no shape broadcast into the loss and no probabilities fed to a loss that "
                    "expects logits were seen", {"steps": len(steps)}, "")]
