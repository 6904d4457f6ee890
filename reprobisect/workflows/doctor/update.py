"""``update``: does the training step change the model, and if not, which link is broken?

Read from one recorded run (every step's ``init``/``grad``/``param`` records and the
scalars ``no_grad_params``, ``grad_norm``, ``lr``, ``loss``), in the guide's order:

- parameters missing from the optimizer: the model's parameters (the ``init`` records of
  the training forward) that no optimizer step ever holds (``param`` records), and
  optimizer parameters the training forward never used (unnamed ``param_groups.G.I``:
  an optimizer built on a copy of the model);
- a detached graph: backward ran, but no parameter of the optimizer got a gradient;
- parameters that never receive a gradient while others do (disconnected, or
  intentionally unused), and frozen ones (``requires_grad=False``, the recorder's
  ``frozen_params``);
- a learning rate at zero, from the start or driven there by a scheduler;
- gradients never cleared, cleared between ``backward`` and ``step``, or cleared inside an
  accumulation loop (``workflows.doctor.clearing``: before the links above, which these
  bugs would otherwise pass for: a detached loss, a working update path);
- an optimizer step that changes no parameter although gradients and learning rate are
  non-zero; and the symptoms themselves: a loss identical at every step, or a loss that
  grows tenfold or more while rising at most steps (diverging updates).
"""

from __future__ import annotations

import math
from typing import Any

from reprobisect.trace.format import Step, stat_value
from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.clearing import check_clearing
from reprobisect.workflows.doctor.model import Finding

__all__ = ["check_update"]

_UNNAMED = "param_groups."


def _names(steps: list[Step], kind: str) -> dict[str, str]:
    """name -> fingerprint of the first ``kind`` record of each name."""
    out: dict[str, str] = {}
    for s in steps:
        for r in s.records:
            if r.kind == kind:
                out.setdefault(r.name, r.fingerprint)
    return out


def _float(x: Any) -> float | None:
    try:
        return stat_value(x)
    except (KeyError, TypeError, ValueError):
        return None


def _short(names: list[str], limit: int = 8) -> list[str]:
    return names[:limit] + ([f"... ({len(names)} in all)"] if len(names) > limit else [])


def _losses(steps: list[Step]) -> list[float | None]:
    return [_float(s.scalars["loss"]) if "loss" in s.scalars else None for s in steps]


def _flat(losses: list[float | None]) -> bool:
    vals = [v for v in losses if v is not None]
    return len(vals) >= 3 and len(vals) == len(losses) and len(set(vals)) == 1


def _membership(steps: list[Step], frozen: set[str]) -> list[Finding]:
    """Parameters missing from the optimizer, or an optimizer on parameters the model does not use."""
    model = _names(steps, "init")
    stepped = _names(steps, "param")
    if not model or not stepped:
        return []
    foreign = sorted(n for n in stepped if n.startswith(_UNNAMED))
    missing = sorted(n for n in model if n not in stepped and n not in frozen)
    if foreign and len(missing) == len([n for n in model if n not in frozen and not n.startswith(_UNNAMED)]):
        ev = {"model_parameters_not_in_optimizer": _short(missing), "optimizer_parameters_unused": _short(foreign),
              "no_gradients_steps": [s.step for s in steps if s.scalars.get("no_gradients")]}
        return [Finding("update", "error",
                        f"the optimizer holds {len(foreign)} tensor(s) the training forward never uses and none of the "
                        f"model's {len(missing)} parameter(s): it was built on a copy of the model (or another model), "
                        "so the model that computes the loss is never updated", ev,
                        "build the optimizer on the parameters of the model you train (after any deepcopy, .to() "
                        "or wrapping), e.g. torch.optim.SGD(model.parameters(), ...)")]
    if missing and foreign:
        ev = {"not_in_optimizer": _short(missing), "optimizer_parameters_unused": _short(foreign),
              "in_optimizer": len(stepped)}
        return [Finding("update", "warning",
                        f"{len(missing)} parameter(s) the model uses are in no optimizer, and the optimizer holds "
                        f"{len(foreign)} tensor(s) the training forward never uses: were layers replaced after the "
                        "optimizer was built (pruning, a new head, a module swapped or re-created)? The new layers "
                        "never change", ev,
                        "build the optimizer (again) after the model's last structural change, on model.parameters()")]
    if missing:
        ev = {"not_in_optimizer": _short(missing), "in_optimizer": len(stepped)}
        return [Finding("update", "warning",
                        f"{len(missing)} parameter(s) the model uses are in no optimizer, so they never change",
                        ev, "add them to the optimizer's param groups, or set requires_grad=False if they are meant "
                        "to stay frozen")]
    return []


def _gradients(steps: list[Step], frozen: set[str]) -> list[Finding]:
    """A detached graph (no gradient at all), or parameters that never receive one."""
    if not steps:
        return []
    if all(s.scalars.get("no_gradients") for s in steps):
        names = list(steps[-1].scalars.get("no_grad_params") or [])
        if names and all(n in frozen for n in names):
            return [Finding("update", "error", "every parameter of the optimizer is frozen (requires_grad=False): "
                            "nothing can train", {"frozen": _short(sorted(frozen))},
                            "unfreeze the parameters you mean to train (requires_grad=True)")]
        ev = {"steps": [s.step for s in steps], "loss": _losses(steps)[:6], "parameters_without_gradient": _short(names)}
        return [Finding("update", "error", "backward ran but no parameter got a gradient: the loss is detached from "
                        "the model (.detach(), .item() or .numpy() and back, a tensor rebuilt with torch.tensor(), "
                        "or the forward under torch.no_grad())", ev,
                        "follow the loss back to the model's output and remove the detach/.item()/torch.tensor() "
                        "round trip; check that loss.grad_fn is not None")]
    never = set(steps[0].scalars.get("no_grad_params") or [])
    for s in steps[1:]:
        never &= set(s.scalars.get("no_grad_params") or [])
    out = []
    frozen_here = sorted(n for n in never if n in frozen)
    disconnected = sorted(n for n in never if n not in frozen)
    if disconnected:
        out.append(Finding("update", "warning",
                           f"{len(disconnected)} parameter(s) in the optimizer never received a gradient in "
                           f"{len(steps)} step(s) while others did: disconnected from the loss, or intentionally unused",
                           {"never_gradient": _short(disconnected), "steps": len(steps)},
                           "if they should train, find where their output leaves the graph (a .detach(), a branch "
                           "not used in the loss); if unused on purpose, leave them out of the optimizer"))
    if frozen_here:
        out.append(Finding("update", "info", f"{len(frozen_here)} frozen parameter(s) (requires_grad=False) are in "
                           "the optimizer and never change", {"frozen": _short(frozen_here)}, ""))
    return out


def _lr(steps: list[Step]) -> list[Finding]:
    """A learning rate at zero: from the start, or driven there (by a scheduler) at some step."""
    lrs = [s.scalars.get("lr") for s in steps]
    if not any(isinstance(x, list) and x for x in lrs):
        return []
    zero_at = None
    for s, lr in zip(steps, lrs):
        vals = [_float(v) for v in (lr or [])]
        if vals and all(v == 0.0 for v in vals):
            zero_at = s.step if zero_at is None else zero_at
        else:
            zero_at = None
    if zero_at is None:
        return []
    ev = {"lr": {s.step: lr for s, lr in zip(steps, lrs)}, "zero_from_step": zero_at}
    if zero_at == steps[0].step:
        return [Finding("update", "error", "the learning rate is 0 from the first step: the optimizer changes nothing",
                        ev, "set a learning rate > 0 (check the config value and its parsing)")]
    first = next((lr for lr in lrs if lr), None)
    return [Finding("update", "error", f"the learning rate fell to 0 at step {zero_at} and stayed there (it was "
                    f"{first} at the first step): a learning-rate schedule drove it to zero, so parameters stop moving",
                    ev, "read the scheduler's formula and when it is stepped (per batch vs per epoch, total steps, "
                    "warmup/decay lengths); its factor must stay > 0 for the whole run")]


def _unchanged_params(steps: list[Step]) -> list[str]:
    """Names of optimizer parameters whose value never changed over the recorded steps."""
    before = _names(steps, "init")
    changed: set[str] = set()
    seen: set[str] = set()
    for s in steps:
        for r in s.records:
            if r.kind != "param":
                continue
            seen.add(r.name)
            if before.get(r.name) not in (None, r.fingerprint):
                changed.add(r.name)
            before[r.name] = r.fingerprint
    return sorted(seen - changed)


def check_update(trace: Trace) -> list[Finding]:
    """The ``update`` findings of one recorded run (most telling first), or one ``info``."""
    # a step a GradScaler skipped, or one holding a NaN/Inf (``finite``'s finding), says nothing about the path
    steps = [s for s in trace.steps if not s.scalars.get("scaler_skipped") and not s.scalars.get("first_nonfinite")]
    if not steps:
        return []
    frozen = set()
    for s in steps:
        frozen |= set(s.scalars.get("frozen_params") or [])
    clearing = check_clearing(steps)
    if clearing:  # what the recorder saw of .grad explains the symptoms the probes below would misname
        return clearing + [f for f in _membership(steps, frozen) if f.severity != "info"]
    infos: list[Finding] = []
    for probe in (lambda: _membership(steps, frozen), lambda: _gradients(steps, frozen), lambda: _lr(steps)):
        found = probe()
        if any(f.severity != "info" for f in found):
            return found
        infos += found
    return _movement(steps) + infos


def _diverging(losses: list[float | None]) -> bool:
    """Finite positive losses over >= 5 steps, rising at >= 70 % of them, ending >= 10x the first."""
    vals = [v for v in losses if v is not None and math.isfinite(v)]
    if len(vals) < 5 or len(vals) != len(losses) or vals[0] <= 0:
        return False
    ups = sum(1 for a, b in zip(vals, vals[1:]) if b > a)
    return ups >= 0.7 * (len(vals) - 1) and vals[-1] >= 10 * vals[0]


def _movement(steps: list[Step]) -> list[Finding]:
    """No cause found: do the parameters move, and does the loss?"""
    losses = _losses(steps)
    still = _unchanged_params(steps)
    total = len(_names(steps, "param"))
    norms = [_float(s.scalars.get("grad_norm")) for s in steps if "grad_norm" in s.scalars]
    ev: dict[str, Any] = {"steps": len(steps), "loss": losses[:8], "grad_norm": norms[:8],
                          "lr": steps[-1].scalars.get("lr"), "parameters": total}
    if total and len(still) == total and len(steps) >= 2:
        ev["unchanged"] = _short(still)
        return [Finding("update", "error", f"no parameter changed in {len(steps)} optimizer step(s) although they have "
                        "gradients and a learning rate > 0", ev,
                        "print one parameter before and after optimizer.step(); check for a step that is skipped "
                        "(a GradScaler, a closure) or parameters restored after the step")]
    if _flat(losses):
        ev["unchanged"] = _short(still)
        return [Finding("update", "warning", f"the loss is exactly {losses[0]} at every one of {len(steps)} steps while "
                        "parameters change: the update does not reach what the loss measures", ev,
                        "check the labels and the output/loss pairing (bisect doctor --check contract when it exists)")]
    if _diverging(losses):
        vals = [v for v in losses if v is not None]
        ev["loss_growth"] = round(vals[-1] / vals[0], 3)
        return [Finding("update", "warning", f"the loss grows from {vals[0]:.4g} to {vals[-1]:.4g} "
                        f"({vals[-1] / vals[0]:.3g}x) over {len(steps)} steps while every parameter changes: the "
                        "updates diverge (a learning rate too high for this loss, or a weight decay so large that "
                        "lr x weight_decay overshoots)", ev,
                        "lower the learning rate; check weight_decay (typical: 1e-4..1e-1); compare the fixed-batch "
                        "run (`--check overfit`, which turns weight decay off)")]
    if still and any(n for n in still if not n.startswith(_UNNAMED)) and len(steps) >= 2:
        ev["unchanged"] = _short(still)
        return [Finding("update", "info", f"{len(still)} of {total} parameter(s) did not change over {len(steps)} "
                        "step(s)", ev, "")]
    finite = [n for n in norms if n is not None and math.isfinite(n)]
    ev["grad_norm_range"] = [min(finite), max(finite)] if finite else None
    return [Finding("update", "info", f"the update path works: every parameter has a gradient and changes, over "
                    f"{len(steps)} step(s)", ev, "")]
