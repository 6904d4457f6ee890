"""``overfit``: the guide's first move, on the user's unmodified command. Reuse one batch,
dropout and weight decay off, train on it repeatedly; a model and update path that work
drive the loss far down (and the accuracy to 100 %).

The run is recorded at sentinel detail with the recorder's ``overfit`` switch
(``runners.overfit_torch``): the first training batch of each ``DataLoader`` is repeated,
dropout runs with ``p=0``, every param group's weight decay is 0. Read: the loss per step,
the accuracy on the fixed batch (when output and labels look like classification), what
was switched off, and how long the run took. Verdicts:

- fits: accuracy 100 %, or the loss at or below 10 % of its first value (or below 1e-3): ``info``;
- still falling: the loss is lower than at the start, has not fit, and still moved by more
  than 5 % over the second half of the steps: ``info``, inconclusive, with the number of
  steps to try (a slow but healthy run is not called broken);
- cannot fit: a plateau far from fit (at most 5 % change over the second half), or a loss
  that rose: ``warning`` with what to inspect;
- a loss exactly 0 at every step: ``warning``, there is nothing to fit (never a fit);
- cross-entropy on probabilities (the recorder's ``scalars.loss_input``: values in [0, 1])
  ending at its floor, -log(e / (e + C - 1)) for C classes: ``warning``, "plateaus at X, the
  floor of cross-entropy on probabilities" (never a fit, even at 100 % accuracy);
- a loss on logits fed probabilities (shown by the op that made them, or rows that sum to 1)
  and still above the value it cannot go below: ``warning``, "not shown to fit one batch" with
  that value, whatever the accuracy;
- a loss that broadcasts predictions against targets to a bigger shape (the fixed-batch run's
  own ``scalars.loss_shape_broadcast``/``loss_broadcast``): ``info``, inconclusive, whatever the
  verdict would be (kept as ``fixed_batch_result``): the loss's minimum is not at the targets;
- a learning rate at 0 at the end of the run (a schedule drove it there): ``info``,
  inconclusive (``update`` names it);
- not run: no batch came from a ``DataLoader`` to repeat: ``info``, inconclusive (never a pass).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from reprobisect.trace.format import Step, stat_value
from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.contract import first_scalar, probabilities_bound, probability_floor
from reprobisect.workflows.doctor.finite import first_nonfinite
from reprobisect.workflows.doctor.model import Finding

__all__ = ["DEFAULT_OVERFIT_STEPS", "check_overfit"]

DEFAULT_OVERFIT_STEPS = 60
"""Optimizer steps on the fixed batch when ``--overfit-steps`` is not given."""


def _loss(s: Step) -> float | None:
    try:
        v = stat_value(s.scalars["loss"])
    except (KeyError, TypeError, ValueError):
        return None
    return v


def _rows(steps: list[Step]) -> list[int]:
    """Indices of the table's rows: the first step, a few in between, the last."""
    n = len(steps)
    picks = sorted({0, n // 10, n // 4, n // 2, (3 * n) // 4, n - 1})
    return [i for i in picks if 0 <= i < n]


def _lr_zero_from(steps: list[Step]) -> int | None:
    """The step from which every param group's learning rate is 0 to the end, or None."""
    at = None
    for s in steps:
        lr = s.scalars.get("lr")
        vals = []
        for v in lr if isinstance(lr, list) else []:
            try:
                vals.append(stat_value(v))
            except (KeyError, TypeError, ValueError):
                vals.append(None)
        if vals and all(v == 0.0 for v in vals):
            at = s.step if at is None else at
        else:
            at = None
    return at


def _bound(steps: list[Step], vals: list[float], acc_end: Any, took: str, ev: dict[str, Any]) -> list[Finding]:
    """A loss that cannot move: 0 from the start, or at the floor of cross-entropy on probabilities."""
    if all(v == 0.0 for v in vals):
        return [Finding("overfit", "warning", f"the loss is 0 at every step of the fixed-batch run ({took}): there is "
                        "nothing to fit and nothing can be learned (its gradients are zero); e.g. a classifier with one "
                        "output class, or labels all masked", ev, "see `--check update`; check the number of output "
                        "classes and the loss mask")]
    floor = probability_floor(steps)
    end = vals[-1]
    if floor is None or end > floor[0] * 1.02 + 1e-3:
        return []
    ev["floor"] = round(floor[0], 6)
    acc = f" (accuracy {acc_end:.0%})" if acc_end is not None else ""
    return [Finding("overfit", "warning", f"on one batch the loss plateaus at {end:.4g}{acc}, the floor of "
                    f"cross-entropy on probabilities: with inputs in [0, 1] it cannot go below {floor[0]:.4g} for "
                    f"{floor[1]} classes ({took}), so the model is not shown to fit", ev,
                    "pass logits to the loss, not probabilities (`--check contract` names the op)")]


def _on_probabilities(steps: list[Step], vals: list[float], acc_end: Any, took: str,
                      ev: dict[str, Any]) -> list[Finding]:
    """A loss on logits fed probabilities (``contract.probabilities_bound``), still above the value
    it cannot go below: whatever the accuracy, the fixed-batch test cannot show a fit. A loss that
    went below that value says the input is no longer probabilities: the usual verdicts apply."""
    b = probabilities_bound(steps)
    first, end = vals[0], vals[-1]
    if b is None or end < b["floor"] * 0.98:
        return []
    ev.update(floor=round(b["floor"], 6), loss_input=b["why"])
    acc = f", accuracy {acc_end:.0%}" if acc_end is not None else ""
    why = ("an accuracy of 100% on one batch is not a fit of the loss" if acc_end == 1.0 else
           "the fixed-batch test cannot show a fit")
    return [Finding("overfit", "warning", f"not shown to fit one batch: the loss went from {first:.4g} to {end:.4g}"
                    f"{acc} ({took}), but the loss {b['loss']} is fed {b['why']}, so it cannot go below "
                    f"{b['floor']:.4g} {b['of']}: {why}", ev,
                    "pass logits to the loss, not probabilities (`--check contract` names the op), then run the "
                    "fixed-batch test again")]


def _broadcast_note(steps: list[Step]) -> dict[str, Any] | None:
    """The broadcast into the loss the fixed-batch run itself recorded (``scalars.loss_shape_broadcast``
    or ``loss_broadcast``), or None."""
    hit = first_scalar(steps, "loss_shape_broadcast") or first_scalar(steps, "loss_broadcast")
    return hit[1] if hit is not None else None


def _with_broadcast(found: list[Finding], steps: list[Step]) -> list[Finding]:
    """A verdict of a fixed-batch run whose loss broadcasts predictions against targets to a bigger
    shape: the loss's minimum is not at the targets, so whether it fits says nothing about the
    model until the shapes agree; the verdict is kept as evidence (``fixed_batch_result``)."""
    b = _broadcast_note(steps)
    if b is None or not found or found[0].cause.startswith(("inconclusive", "on one repeated batch")):
        return found
    f = found[0]
    shapes = (f"{b.get('input')} against {b.get('target')} to {b.get('to')}" if "input" in b
              else f"{b.get('from')} to {b.get('to')}")
    return [replace(f, severity="info", cause=f"inconclusive: the loss broadcasts {shapes} (see [contract]), so it "
                    "compares every prediction with every target and its minimum is not at the targets: the "
                    "fixed-batch result says nothing about the model until the shapes agree",
                    evidence={**f.evidence, "fixed_batch_result": f.cause, "loss_broadcast": b},
                    next="make the predictions and targets the same shape where the loss is computed "
                    "(`--check contract`), then run the fixed-batch test again")]


def check_overfit(trace: Trace | None, *, wall_s: float, asked: int) -> list[Finding]:
    """The ``overfit`` finding of the fixed-batch run (``asked`` steps, ``wall_s`` seconds)."""
    steps = list(trace.steps) if trace is not None else []
    return _with_broadcast(_verdict(steps, wall_s=wall_s, asked=asked), steps)


def _nonfinite(steps: list[Step], bad: int, ev: dict[str, Any]) -> Finding:
    """The loss of the fixed-batch run went non-finite: blamed on what went non-finite first.

    A loss that breaks while the model's outputs are finite is the loss's arithmetic on this
    batch (a log of 0), not an unstable update: lowering the learning rate would not help.
    """
    at = steps[bad].step
    hit = first_nonfinite(steps[:bad + 1])
    first = hit[1].kind if hit is not None else None
    ev = {**ev, "first_nonfinite_kind": first}
    check = "run `bisect doctor --check finite` for the first non-finite tensor"
    if first == "loss":
        return Finding("overfit", "warning", f"on one repeated batch the loss becomes non-finite at step {at} while "
                       "the model's outputs stay finite: the loss arithmetic breaks on this batch (a log of 0, a "
                       "division by a tiny value), not the update", ev,
                       f"compute the loss with a numerically stable function (log_softmax, logsigmoid, "
                       f"BCEWithLogitsLoss); {check}")
    if first in ("batch", "input"):
        return Finding("overfit", "warning", f"on one repeated batch the loss becomes non-finite at step {at}: the "
                       "batch itself holds NaN/Inf", ev, f"inspect the batch's samples; {check}")
    if first in ("grad", "param", "optim_state"):
        return Finding("overfit", "warning", f"on one repeated batch the loss becomes non-finite at step {at}: the "
                       f"update is unstable even without changing data (the first non-finite tensor is a {first})",
                       ev, f"lower the learning rate; {check}")
    return Finding("overfit", "warning", f"on one repeated batch the loss becomes non-finite at step {at}"
                   + (f" (the first non-finite record is a {first})" if first else "")
                   + ": the forward or the update breaks even without changing data", ev, check)


def _verdict(steps: list[Step], *, wall_s: float, asked: int) -> list[Finding]:
    """The fixed-batch run's verdict from its loss (and accuracy) per step."""
    info = [s.scalars.get("overfit") for s in steps if isinstance(s.scalars.get("overfit"), dict)]
    base: dict[str, Any] = {"steps_run": len(steps), "steps_asked": asked, "wall_s": round(wall_s, 2)}
    if not steps:
        return [Finding("overfit", "info", "inconclusive: the fixed-batch run recorded no step", base, "")]
    if not any(i.get("repeated") for i in info):
        return [Finding("overfit", "info", "inconclusive: no batch came from a torch DataLoader, so the doctor could "
                        "not repeat one (a batch built inside the loop is not repeated); the fixed-batch test did not run",
                        base, "reuse one batch by hand: draw it once before the loop and train on it repeatedly")]
    losses = [_loss(s) for s in steps]
    accs = [i.get("accuracy") for i in info] if len(info) == len(steps) else [None] * len(steps)
    rows = _rows(steps)
    table = {"step": [steps[i].step for i in rows], "loss": [losses[i] for i in rows]}
    if any(a is not None for a in accs):
        table["accuracy"] = [accs[i] for i in rows]
    last = info[-1] if info else {}
    ev = {"table": table, **base, "dropout_calls_zeroed": last.get("dropout_zeroed", 0),
          "weight_decay_zeroed": last.get("weight_decay_zeroed") or {}, "batch_ids": steps[0].batch_ids}
    bad = next((i for i, v in enumerate(losses) if v is None or not math.isfinite(v)), None)
    if bad is not None and losses[bad] is not None:
        return [_nonfinite(steps, bad, ev)]
    vals = [v for v in losses if v is not None]
    if len(vals) < 2:
        return [Finding("overfit", "info", "inconclusive: the fixed-batch run recorded no loss to follow", ev, "")]
    first, end = vals[0], vals[-1]
    acc_end = accs[-1]
    took = f"{len(steps)} steps, {base['wall_s']:g} s"
    bound = _bound(steps, vals, acc_end, took, ev) or _on_probabilities(steps, vals, acc_end, took, ev)
    if bound:
        return bound
    if acc_end == 1.0 or end <= 0.1 * first or abs(end) < 1e-3:
        acc = f", accuracy {acc_end:.0%}" if acc_end is not None else ""
        return [Finding("overfit", "info", f"fits one batch: loss {first:.4g} -> {end:.4g}{acc} ({took}); the model, "
                        "loss and update path work together on it", ev, "")]
    zero = _lr_zero_from(steps)
    if zero is not None:
        ev["lr_zero_from_step"] = zero
        return [Finding("overfit", "info", f"inconclusive: on one batch the loss went from {first:.4g} to {end:.4g}, "
                        f"but the learning rate is 0 from step {zero} of the fixed-batch run ({took}), so the test "
                        "says nothing about the model", ev, "see `--check update` for the learning rate")]
    half = vals[len(vals) // 2]
    stalled = len(vals) >= 10 and abs(half - end) <= 0.05 * abs(half)
    if end < first and not stalled:
        slow = "" if end < 0.5 * first else " (slowly: the learning rate may be low for this test)"
        return [Finding("overfit", "info", f"inconclusive: on one batch the loss fell from {first:.4g} to {end:.4g} "
                        f"in {took}{slow} and is still falling, but has not fit yet", ev,
                        f"run longer: bisect doctor --check overfit --overfit-steps {max(4 * len(steps), 200)}")]
    acc = f", accuracy {acc_end:.0%}" if acc_end is not None else ""
    trend = ("rose from" if end >= first and not stalled else f"stalls at {end:.4g} (it was {half:.4g} at step "
             f"{steps[len(vals) // 2].step}); it went from")
    return [Finding("overfit", "warning", f"cannot fit one batch: repeated {len(steps)} times with dropout and weight "
                    f"decay off, the loss {trend} {first:.4g} to {end:.4g}{acc} ({base['wall_s']:g} s)", ev,
                    "inspect, in order: the batch and its labels (do they belong together?), the output layer and "
                    "loss pairing (an activation such as ReLU/sigmoid/clamp before the output that cannot reach the "
                    "targets; `--check contract`), gradients and updates (`--check update`), the learning rate (too "
                    "low or too high), numerical precision")]
