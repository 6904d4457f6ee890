"""The gradient-clearing bugs, for the ``update`` check: read from ``scalars["grad_clearing"]``
(``runners.observers.torch_clearing``; written only for a step where something was off).

- never cleared: at the first backward of a step the parameters' ``.grad`` is still what the
  previous ``optimizer.step()`` took (same tensor, unchanged): gradients add up across steps;
- cleared between the last backward and ``optimizer.step()``: the step takes None/zero
  gradients although backward produced them (what reads as a detached loss otherwise);
- cleared inside an accumulation loop: with several backwards per step, gradients present
  after one backward are None/zero before the next: only the last micro-batch's survives.

Each finding says what the recorder saw at which steps, and the fix.
"""

from __future__ import annotations

from typing import Any

from reprobisect.trace.format import Step
from reprobisect.workflows.doctor.model import Finding

__all__ = ["check_clearing"]


def _seen(steps: list[Step]) -> list[tuple[int, dict[str, Any]]]:
    return [(s.step, c) for s in steps if isinstance(c := s.scalars.get("grad_clearing"), dict)]


_WHAT = {"stale": "still held the previous step's gradient at the first backward",
         "cleared_before_step": "cleared after the last backward, before optimizer.step()",
         "cleared_between_backwards": "cleared between two backwards of one step"}


def _evidence(hits: list[tuple[int, dict[str, Any]]], key: str, n: int) -> dict[str, Any]:
    first = hits[0][1]
    return {"steps": [k for k, _ in hits][:8], "steps_with_it": len(hits), "steps_recorded": n,
            "parameters": f"{first.get(key)} of the {first.get('with_gradient')} with a gradient {_WHAT[key]} "
                          f"(step {hits[0][0]})",
            "backwards_per_step": first.get("backwards"), "zero_grad_calls": first.get("zero_grad_calls"),
            "called": first.get("called") or []}


def _never(hits: list[tuple[int, dict[str, Any]]], n: int) -> Finding:
    return Finding("update", "error",
                   f"the gradients are never cleared: at the first backward of {len(hits)} of {n} step(s) the "
                   "parameters' .grad still held the gradient the previous optimizer.step() used, so every step "
                   "adds its gradient onto all earlier ones (no zero_grad() / grad = None between steps)",
                   _evidence(hits, "stale", n),
                   "call optimizer.zero_grad() once per optimizer step, before the backward(s) of the step (or right "
                   "after optimizer.step())")


def _before_step(hits: list[tuple[int, dict[str, Any]]], n: int) -> Finding:
    ev = _evidence(hits, "cleared_before_step", n)
    called = f" ({', '.join(ev['called'])} after the last backward)" if ev["called"] else ""
    return Finding("update", "error",
                   f"the gradients are cleared between backward() and optimizer.step(){called}: backward gave the "
                   f"parameters gradients, but at {len(hits)} of {n} step(s) the optimizer took None/zero "
                   "gradients, so nothing trains (the loss is not detached)", ev,
                   "move zero_grad() before loss.backward() (or after optimizer.step()), never between them")


def _in_accumulation(hits: list[tuple[int, dict[str, Any]]], n: int) -> Finding:
    ev = _evidence(hits, "cleared_between_backwards", n)
    k = ev["backwards_per_step"]
    return Finding("update", "error",
                   f"the gradients are cleared inside the accumulation loop: {k} backwards per optimizer step, but "
                   f"the gradients of one backward were None/zero before the next (at {len(hits)} of {n} step(s)), "
                   "so each step uses only the last micro-batch's gradient", ev,
                   "call zero_grad() once before the accumulation loop (or after optimizer.step()), not inside it")


def check_clearing(steps: list[Step]) -> list[Finding]:
    """The clearing findings of the recorded steps (most telling first); none when all was well."""
    seen = _seen(steps)
    out: list[Finding] = []
    n = len(steps)
    before = [(k, c) for k, c in seen if c.get("cleared_before_step") and c.get("cleared_before_step") == c.get(
        "with_gradient")]
    if before:
        out.append(_before_step(before, n))
    between = [(k, c) for k, c in seen if c.get("cleared_between_backwards") and (c.get("backwards") or 0) > 1]
    if between:
        out.append(_in_accumulation(between, n))
    stale = [(k, c) for k, c in seen if c.get("stale")]
    # every step after the first (the first has no previous step) shows it: a loop that never clears
    if stale and 2 * len(stale) >= max(1, n - 1):
        out.append(_never(stale, n))
    return out
