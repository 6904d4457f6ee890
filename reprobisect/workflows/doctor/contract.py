"""``contract``: what enters the loss against the loss's contract.

From one recorded run:

- predictions and targets whose shapes broadcast to more elements than either in an
  element-wise loss (``[B]`` against ``[B, 1]`` into ``F.mse_loss``/``l1_loss``/... or their
  ``nn`` modules): the PyTorch recorder compares the shapes at the call
  (``scalars.loss_shape_broadcast``, ``runners.observers.torch_lossshapes``); the BCE pair
  refuse such shapes and crash (``CRASH_CONTRACT``, with the shapes); a hand-written
  ``(pred - y) ** 2`` of ``[N, 1]`` against ``[N]``: the recorder walks the first step's loss
  graph and notes the op (``scalars.loss_broadcast``). Pairwise expressions (``[N, 1]``
  against ``[1, N]``, both from the model) are not reported;
- probabilities fed to a loss that expects logits: the recorder sees ``log_softmax`` (inside
  ``cross_entropy``) or ``nll_loss`` right after a ``softmax``, or
  ``binary_cross_entropy_with_logits`` right after a ``sigmoid``, in the first step's loss graph
  (``scalars.loss_probabilities``); else what the recorder measured on the tensor entering
  ``cross_entropy``/``binary_cross_entropy_with_logits`` (``scalars.loss_input``): made by a
  ``sigmoid`` or by ``exp`` of a ``log_softmax`` (probabilities in any spelling), or a
  cross-entropy input in [0, 1] whose rows sum to 1; else the input of a ``CrossEntropyLoss``
  module whose values lie in [0, 1] with a mean of exactly ``1/C`` (rows that sum to 1: a
  softmax), or an ``NLLLoss`` given non-negative values (it expects log-probabilities);
  read from the recorded stats of the tensor whose fingerprint the loss module received;
- class indices out of range and targets of the wrong dtype crash inside the loss: the
  crash's last line is matched against the loss's own messages, old and new PyTorch's
  (``run.py``, ``CRASH_CONTRACT``); a generic "index out of bounds" elsewhere is not one.

``loss_findings`` adds what the loss itself says to ``update``'s findings (``check`` ``update``):
a loss exactly 0 at every step with zero gradients (nothing can be learned: one output class,
every label masked), and, on TensorFlow, trainable variables the loop never passed to
``apply_gradients`` (``extra.tensorflow.unapplied_variables``). Each replaces the ``update``
verdict it explains ("no parameter changed although they have gradients", "every parameter
has a gradient and changes").
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from reprobisect.trace.format import Record, Step, stat_value
from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.model import Finding

__all__ = ["CRASH_CONTRACT", "check_contract", "crash_cause", "first_scalar", "loss_input", "loss_findings", "probabilities_bound", "probability_floor"]

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
    (r"Target size \(torch\.Size\(\[([\d, ]*)\]\)\) must be the same as input size \(torch\.Size\(\[([\d, ]*)\]\)\)"
     r"|Using a target size \(torch\.Size\(\[([\d, ]*)\]\)\) that is different to the input size "
     r"\(torch\.Size\(\[([\d, ]*)\]\)\)", "",
     "the targets' shape ({target}) differs from the predictions' ({input}) and this loss refuses to broadcast them",
     "give the predictions the targets' shape where the loss is computed (pred.view_as(target), or squeeze/unsqueeze "
     "the trailing dimension of 1, whichever matches the label semantics)"),
    (r"can't be cast to the desired output type (Long|Int|Short|Byte|Bool)", r"loss",
     "the targets are integers but the loss computes in floating point (BCE/BCEWithLogits/MSE expect float targets)",
     "cast the targets with .float() (and give them the prediction's shape)"),
)
"""(pattern of the crash's last line, pattern the traceback must also hold or "", cause, next)
for contract violations the loss raises; a pattern that other code can raise too (a cast) needs
a loss in the traceback. A pattern with groups gives the target's and the input's shape, in the
order the message names them (``{target}``, ``{input}`` in the cause: ``crash_cause``)."""

_TOL = 1e-4


def crash_cause(cause: str, m: re.Match[str]) -> str:
    """``cause`` of a ``CRASH_CONTRACT`` entry with the shapes its pattern matched filled in."""
    if "{target}" not in cause:
        return cause
    shapes = [f"[{g}]" for g in m.groups() if g is not None]
    return cause.format(target=shapes[0], input=shapes[1]) if len(shapes) >= 2 else cause


def _stat(r: Record, k: str) -> float | None:
    try:
        return stat_value(r.stats[k]) if r.stats and k in r.stats else None
    except (KeyError, TypeError, ValueError):
        return None


def _broadcast(steps: list[Step]) -> list[Finding]:
    """An element-wise loss given shapes that broadcast to more elements (measured at the call,
    ``scalars.loss_shape_broadcast``), else an ``[N, 1]`` against ``[N]`` broadcast in the first
    step's loss graph (``scalars.loss_broadcast``)."""
    called = first_scalar(steps, "loss_shape_broadcast")
    if called is not None:
        return [_called_broadcast(*called)]
    hit = first_scalar(steps, "loss_broadcast")
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


_WARNS = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
"""The losses that broadcast different shapes with a warning (the BCE pair raise instead)."""


def first_scalar(steps: list[Step], key: str) -> tuple[Step, dict[str, Any]] | None:
    """The first step whose scalar ``key`` is a dict, with it."""
    return next(((s, s.scalars[key]) for s in steps if isinstance(s.scalars.get(key), dict)), None)


def _shape(x: Any) -> str:
    return "[" + ", ".join(str(d) for d in x) + "]" if isinstance(x, list) else "?"


def _align(inp: list[int], tgt: list[int]) -> str:
    """How to give the prediction the target's shape (the usual trailing dimension of 1)."""
    if tgt[:-1] == inp and tgt[-1:] == [1]:
        return "pred.unsqueeze(-1) (or target.squeeze(-1))"
    if inp[:-1] == tgt and inp[-1:] == [1]:
        return "pred.squeeze(-1) (or target.unsqueeze(-1))"
    return "pred.view_as(target), if they hold the same elements"


def _called_broadcast(s: Step, b: dict[str, Any]) -> Finding:
    inp, tgt, to = b.get("input") or [], b.get("target") or [], b.get("to") or []
    ev = {"step": s.step, "loss_fn": b.get("loss"), "input_shape": inp, "target_shape": tgt, "broadcast_to": to,
          "loss": s.scalars.get("loss")}
    return Finding("contract", "error",
                   f"the loss {b.get('loss')} gets predictions of shape {_shape(inp)} and targets of shape "
                   f"{_shape(tgt)}, which broadcast to {_shape(to)}: every prediction is compared with every "
                   "target, so the loss is wrong even for perfect predictions"
                   + (" (torch only warns: \"Using a target size that is different to the input size\")"
                      if b.get("loss") in _WARNS else ""), ev,
                   f"give the predictions the targets' shape where the loss is computed: {_align(inp, tgt)}, "
                   "whichever matches the label semantics")


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


def loss_input(steps: list[Step]) -> dict[str, Any]:
    """What the recorder measured on the tensor entering a loss on logits (``scalars.loss_input``), or {}."""
    return next((s.scalars["loss_input"] for s in steps if isinstance(s.scalars.get("loss_input"), dict)), {})


def _in_unit(m: dict[str, Any]) -> bool:
    lo, hi = m.get("min"), m.get("max")
    return isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo >= 0 and hi <= 1


def _sums_to_one(m: dict[str, Any]) -> bool:
    dev = m.get("row_sum_dev")
    return _in_unit(m) and isinstance(dev, (int, float)) and dev <= _TOL and (m.get("classes") or 0) >= 2


def probability_floor(steps: list[Step]) -> tuple[float, int] | None:
    """(floor, C) when the run feeds probabilities (every value in [0, 1]) to a cross-entropy over
    C >= 2 classes: with inputs in [0, 1] the margin of the true class is at most 1, so the loss
    cannot go below -log(e / (e + C - 1)); else None."""
    m = loss_input(steps)
    c = m.get("classes") or 0
    if m.get("loss") != "cross_entropy" or c < 2 or not _in_unit(m):
        return None
    return math.log(1 + (c - 1) / math.e), c


_SPELLINGS = {"SigmoidBackward0": ("a sigmoid's output (each value in [0, 1])", "sigmoid"),
              "ExpBackward0 of LogSoftmaxBackward0": ("exp() of log_softmax: probabilities again", "exp()"),
              "SoftmaxBackward0": ("a softmax's output (rows that sum to 1)", "softmax")}
"""The op that made the loss input -> (what it is, what to remove)."""


def probabilities_bound(steps: list[Step]) -> dict[str, Any] | None:
    """``{"loss", "floor", "of", "why"}`` when the run feeds probabilities to a loss on logits and
    something besides their range shows it (the op that made them, a softmax in the loss graph, or
    cross-entropy rows that sum to 1: logits can lie in [0, 1] too at the first call), with the
    value that loss cannot go below while its input stays in [0, 1]: cross-entropy over C classes
    -log(e / (e + C - 1)); BCE-with-logits log(1 + 1/e) per element (for a target 1; log 2 for a
    target 0). None otherwise."""
    m = loss_input(steps)
    if not _in_unit(m):
        return None
    spelled = _SPELLINGS.get(str(m.get("made_by")))
    if spelled is not None:
        why = spelled[0]
    elif m.get("loss") == "cross_entropy" and _sums_to_one(m):
        why = "values in [0, 1] whose rows sum to 1"
    elif first_scalar(steps, "loss_probabilities") is not None:
        why = "a softmax or sigmoid right before it in the loss graph"
    else:
        return None
    c = m.get("classes") or 0
    if m.get("loss") == "cross_entropy" and c >= 2:
        return {"loss": "cross_entropy", "floor": math.log(1 + (c - 1) / math.e), "of": f"for {c} classes", "why": why}
    if m.get("loss") == "binary_cross_entropy_with_logits":
        return {"loss": m["loss"], "floor": math.log(1 + 1 / math.e), "of": "per element with 0/1 targets",
                "why": why}
    return None


def _measured_probabilities(steps: list[Step]) -> list[Finding]:
    """The tensor entering cross_entropy/BCE-with-logits is probabilities (its op, or its values)."""
    m = loss_input(steps)
    spelled = _SPELLINGS.get(str(m.get("made_by")))
    if not m or not _in_unit(m) or (spelled is None and not (m.get("loss") == "cross_entropy" and _sums_to_one(m))):
        return []
    what, remove = spelled or ("values in [0, 1] whose rows sum to 1 (probabilities)", "normalisation")
    ev = {k: m.get(k) for k in ("loss", "shape", "classes", "min", "max", "row_sum_dev", "made_by") if k in m}
    bound = probabilities_bound(steps)
    tail = f"; the loss cannot go below {bound['floor']:.4g} (its floor {bound['of']})" if bound else ""
    return [Finding("contract", "error", f"the loss {m.get('loss')} expects logits but gets {what}; measured "
                    f"min {m.get('min'):.3g}, max {m.get('max'):.3g}: it applies "
                    f"{'the sigmoid' if 'binary' in str(m.get('loss')) else 'log_softmax'} itself, so the "
                    f"gradients are squashed and training stalls{tail}", ev,
                    f"pass the logits (remove the {remove} before the loss; keep it for inference only)")]


def _probabilities(steps: list[Step]) -> list[Finding]:
    graph = _graph_probabilities(steps)
    m = loss_input(steps)
    if graph:
        if m:  # the measured input agrees: its range and row sums are evidence too
            graph[0].evidence.update({f"input_{k}": m[k] for k in ("min", "max", "row_sum_dev") if k in m})
        bound = probabilities_bound(steps)
        if bound:
            graph[0].evidence["floor"] = round(bound["floor"], 6)
            return [replace(graph[0], cause=graph[0].cause + f"; the loss cannot go below {bound['floor']:.4g} "
                            f"(its floor {bound['of']})")]
        return graph
    measured = _measured_probabilities(steps)
    if measured:
        return measured
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
    if not steps:
        return [Finding("contract", "info", "not checked — the run recorded no training step, so no loss was seen",
                        {"steps": 0}, "")]
    found = _broadcast(steps) + _probabilities(steps)
    if found:
        return found
    return [Finding("contract", "info", "no shape broadcast into the loss and no probabilities fed to a loss that "
                    f"expects logits were seen over {len(steps)} step(s) (looked at: the shapes given to element-wise "
                    "losses, the first step's loss graph, the input of cross-entropy and BCE-with-logits)",
                    {"steps": len(steps)}, "")]


def _num(x: Any) -> float | None:
    try:
        return stat_value(x)
    except (KeyError, TypeError, ValueError):
        return None


def _zero_loss(steps: list[Step]) -> list[Finding]:
    """A loss exactly 0 at every step (>= 2) with gradient norms all 0: nothing can be learned."""
    losses = [_num(s.scalars.get("loss")) if "loss" in s.scalars else None for s in steps]
    norms = [_num(s.scalars.get("grad_norm")) for s in steps if "grad_norm" in s.scalars]
    if len(steps) < 2 or any(v != 0.0 for v in losses) or any(n != 0.0 for n in norms):
        return []
    m = loss_input(steps)
    ev: dict[str, Any] = {"steps": len(steps), "loss": losses[:8], "grad_norm": norms[:8]}
    if m.get("classes"):
        ev["classes"] = m["classes"]
    one = m.get("classes") == 1
    return [Finding("update", "error", f"the loss is 0 at every step (and its gradients are all zero), over {len(steps)} "
                    "steps: nothing can be learned; " + ("here the model outputs 1 class, and cross-entropy over one "
                                                         "class is always 0" if one else "e.g. a classifier with one "
                                                         "output class, or labels all masked"), ev,
                    "give the last layer one output per class (or BCEWithLogitsLoss on one logit)" if one else
                    "check the number of output classes, the labels (all ignore_index?) and the loss mask (all zero?)")]


def _unapplied(trace: Trace) -> list[Finding]:
    """TensorFlow: trainable variables the loop never passed to ``apply_gradients``."""
    info = ((trace.manifest.extra or {}).get("tensorflow") or {}).get("unapplied_variables")
    names = list(info.get("variables") or []) if isinstance(info, dict) else []
    if not names:
        return []
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    return [Finding("update", "warning", f"trainable variables not passed to apply_gradients: {shown}; they never "
                    "get an update (the loop filters the (gradient, variable) pairs), so they keep their initial "
                    "values", {"variables": names, "first_step": info.get("first_step")},
                    "pass every trainable variable to apply_gradients, or set trainable=False on the ones meant "
                    "to stay fixed")]


def loss_findings(trace: Trace, findings: list[Finding]) -> list[Finding]:
    """``findings`` with what the loss says about ``update``: a loss identically 0 replaces every
    ``update`` finding (they read its consequences: no change, no gradient); trainable variables
    never given to ``apply_gradients`` replace the claim that every parameter changes."""
    steps = list(trace.steps)
    zero = _zero_loss(steps)
    if zero:
        return [f for f in findings if f.check != "update"] + zero
    unapplied = _unapplied(trace)
    if unapplied:
        kept = [f for f in findings if not (f.check == "update" and "every parameter" in f.cause)]
        return kept + unapplied
    return findings
