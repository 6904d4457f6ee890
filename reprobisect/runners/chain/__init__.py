"""The framework-free core of the recorders: a step chain plus observers (DESIGN.md).

``observer``: the hook surface (``Observer``, every hook a no-op until overridden), the
registry of observers per framework, and the flattening of a recorder's observers into one
tuple per hook. ``steps``: what both recorders compute the same way at a step's end (names
made unique, the loss scalars, the first non-finite record, JSON-safe floats).
``evaluation``: the evaluation summary (``scalars["eval"]``). None of it imports a framework.
"""

from reprobisect.runners.chain.evaluation import EvalRuns, summarize
from reprobisect.runners.chain.observer import Observer, flatten, observer_classes, register_observer
from reprobisect.runners.chain.steps import combine, first_nonfinite, json_float, loss_scalars, plain_settings, unique

__all__ = ["EvalRuns", "Observer", "combine", "first_nonfinite", "flatten", "json_float", "loss_scalars", "plain_settings",
           "observer_classes", "register_observer", "summarize", "unique"]
