"""``finite``: the first non-finite tensor along the chain of one recorded run.

The run is recorded at full detail and ends at the first step holding a NaN or Inf
(``stop_on_nonfinite``). The chain order of a step (``batch`` → ``input`` → ``activation``
→ ``output`` → ``loss`` → ``grad`` → ``param``) makes "first" meaningful: the first record
whose stats count a NaN or Inf is the boundary to investigate, and the kind says which of
the guide's causes it is (a bad batch, an unstable forward or loss, exploding gradients, an
update that overflowed). The evidence names the step, the tensor, its stats, the sample IDs
of the batch and the gradient norms and learning rates of the steps before it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from reprobisect.trace.format import Record, Step, stat_value
from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.model import Finding

__all__ = ["check_finite", "first_nonfinite"]

_CAUSES = {
    "init": ("the initial parameters already hold NaN/Inf before any update (initialisation or a loaded checkpoint)",
             "inspect how '{name}' is initialised or loaded; the first update cannot repair it"),
    "batch": ("the batch is already non-finite when the loader hands it over (samples {ids})",
              "inspect samples {ids} in the dataset and the feature construction (a corrupt record, a division by "
              "zero); reject or repair them at load time"),
    "input": ("the model's input is already non-finite (samples {ids}): the data, not the model",
              "inspect samples {ids} and any transform between the loader and the model"),
    "activation": ("the forward pass first produces NaN/Inf in module {where} while everything before it is finite",
                   "look for log, exp, division, sqrt or a large power in {where} on samples {ids}; run that operation "
                   "in float32 if it runs in lower precision; `bisect capture --full-steps {step}` keeps the tensors"),
    "output": ("the model's output is non-finite while its inputs are finite (a numerically unstable forward)",
               "look for log, exp, division or overflow in the model's last layers on samples {ids}"),
    "loss": ("the loss is non-finite while the model's outputs are finite: the loss arithmetic breaks on this batch "
             "(a log of 0, a division by a tiny value)",
             "compute the loss with a numerically stable library function (log_softmax / BCEWithLogitsLoss instead "
             "of log(softmax) or log(sigmoid)), and inspect samples {ids}"),
    "collective": ("a collective (all-reduce/broadcast) carries the first NaN/Inf",
                   "find the rank whose contribution was non-finite: `bisect compare` on the rank shards"),
    "grad": ("the gradient of '{name}' is non-finite while the loss is finite: backward overflowed",
             "log the gradient norm before clipping per step (see the norms below); lower the learning rate or fix "
             "the initialisation/normalisation if they grow, else look for an op whose derivative is infinite "
             "(sqrt or pow at 0)"),
    "param": ("the update makes '{name}' non-finite while its gradient is finite: the optimizer step overflowed",
              "check the learning rate and the optimizer state (eps, momentum) of '{name}'"),
    "optim_state": ("the optimizer state '{name}' is non-finite while the gradients are finite",
                    "check the optimizer's eps and the gradient scale"),
}


def _bad(rec: Record) -> bool:
    st = rec.stats or {}
    return bool(st.get("nan")) or bool(st.get("inf"))


def first_nonfinite(steps: Iterable[Step]) -> tuple[Step, Record] | None:
    """The first record of ``steps`` (in step and chain order: a trace's ``steps``) whose stats
    count a NaN or Inf; a GradScaler's skipped step's gradients do not count (that is what it
    skips for)."""
    for step in steps:
        skipped = bool(step.scalars.get("scaler_skipped"))
        for rec in step.records:
            if skipped and rec.kind == "grad":
                continue
            if _bad(rec):
                return step, rec
    return None


def _ids(step: Step, limit: int = 16) -> str:
    ids = step.batch_ids
    if not ids:
        return "(no sample IDs: the batch did not come from a DataLoader)"
    if len(ids) > limit:
        return ", ".join(str(i) for i in ids[:limit]) + f", ... ({len(ids)} in all)"
    return ", ".join(str(i) for i in ids)


def _num(x: Any) -> Any:
    try:
        v = stat_value(x)
    except (KeyError, TypeError, ValueError):
        return x
    return v if math.isfinite(v) else str(x)


def _history(trace: Trace, upto: int, limit: int = 5) -> dict[str, list[Any]]:
    """Gradient norm (before clipping), loss and learning rates of the steps up to ``upto``."""
    steps = [s for s in trace.steps if s.step <= upto][-limit:]
    return {
        "steps": [s.step for s in steps],
        "grad_norm": [_num(s.scalars.get("grad_norm")) if "grad_norm" in s.scalars else None for s in steps],
        "loss": [_num(s.scalars.get("loss")) if "loss" in s.scalars else None for s in steps],
        "lr": [s.scalars.get("lr") for s in steps],
    }


def _growing(norms: list[Any]) -> bool:
    """Finite norms that grew by at least 10x over the steps shown (exploding gradients)."""
    vals = [v for v in norms if isinstance(v, (int, float)) and math.isfinite(v)]
    return len(vals) >= 2 and vals[0] > 0 and vals[-1] / vals[0] >= 10


def _evidence(trace: Trace, step: Step, rec: Record) -> dict[str, Any]:
    st = rec.stats or {}
    numel = math.prod(rec.shape) if rec.shape else 1
    before = [r for r in step.records if r.order < rec.order or (r.order == rec.order and r is not rec)]
    later_bad = sorted({r.kind for r in step.records if _bad(r) and r is not rec})
    return {
        "step": step.step,
        "tensor": f"{rec.kind} '{rec.name}'",
        "module": rec.module,
        "shape": list(rec.shape),
        "dtype": rec.dtype,
        "nan": st.get("nan"), "inf": st.get("inf"), "elements": numel,
        "stats": {k: _num(st.get(k)) for k in ("min", "max", "mean", "norm") if k in st},
        "sample_ids": list(step.batch_ids) if step.batch_ids else None,
        "finite_before_it": sorted({r.kind for r in before if not _bad(r)}),
        "also_nonfinite": later_bad,
        "history": _history(trace, step.step),
    }


def _input_from_code(step: Step, rec: Record) -> bool:
    """Whether no record of ``step`` before ``rec`` is its input (by fingerprint): the input was
    made by code between modules, unrecorded, so its finiteness is unknown."""
    if not rec.inputs:
        return False
    earlier = {r.fingerprint for r in step.records if r is not rec and r.kind in ("batch", "input", "activation")}
    return not any(fp in earlier for fp in rec.inputs)


def check_finite(trace: Trace) -> list[Finding]:
    """The ``finite`` finding of one recorded run: the first non-finite tensor (error), or
    an ``info`` that none appeared in the steps recorded."""
    hit = first_nonfinite(trace.steps)
    if hit is None:
        n = len(trace.steps)
        return [Finding("finite", "info", f"no NaN or Inf in the {n} step(s) recorded (batch, forward, loss, "
                        "gradients, parameters)", {"steps": n}, "")]
    step, rec = hit
    cause, nxt = _CAUSES.get(rec.kind, ("a tensor of kind '{kind}' is the first non-finite one", ""))
    fill = {"name": rec.name, "module": rec.module or rec.name, "where": f"'{rec.module or rec.name}'", "ids": _ids(step), "step": step.step, "kind": rec.kind}
    ev = _evidence(trace, step, rec)
    if rec.kind == "activation" and rec.module and rec.module != rec.name:
        fill["where"] = f"'{rec.name}' ({rec.module})"  # the module's path and its class
    cause = cause.format(**fill)
    if rec.kind == "activation" and _input_from_code(step, rec):
        ev["input_from"] = "forward code between modules (no recorded tensor has its input's fingerprint)"
        cause = (f"the first NaN/Inf recorded is the output of module {fill['where']}, whose input (samples "
                 f"{fill['ids']}) was computed by forward code between modules (a torch.log, exp, division or sqrt in "
                 "the parent's forward): the NaN/Inf starts there or in the module; the batch and the model's input "
                 "are finite")
        nxt = ("look for log, exp, division or sqrt in the forward code that computes the input of '{name}' (and in "
               "'{name}' itself) on samples {ids}; `bisect capture --full-steps {step}` keeps the tensors")
    if rec.kind == "grad" and _growing(ev["history"]["grad_norm"]):
        cause = (f"the gradient norm grew from {ev['history']['grad_norm'][0]:.3g} to overflow by step {step.step}: "
                 "exploding gradients")
        nxt = "lower the learning rate, fix the initialisation or normalisation, or clip (after the cause is understood)"
    return [Finding("finite", "error", f"step {step.step}: {cause}", ev, nxt.format(**fill))]
