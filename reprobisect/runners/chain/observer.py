"""Observers: one concern of a recorder each, called at the recorder's hook points.

Shaped like Lightning's ``Callback`` and Keras' ``CallbackList``: ``Observer`` is a small
hook surface whose every hook does nothing; an observer overrides only the hooks of its
concern. A recorder builds its observers once (in registry order) and keeps, per hook, the
tuple of the observers that override it (``flatten``): a hook point runs that tuple in
order, with no registry lookup and no call into observers that do not care.

Observers are registered per framework (``register_observer``), the way recorders
(``runners.registry``) and executors are: a new observation is one new observer module.
Each says its ``rank``: where it runs at every hook relative to the others (lower first),
whatever order the modules were imported in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Observer", "ObserverEntry", "flatten", "observer_classes", "register_observer"]


class Observer:
    """One concern of a recorder. ``rec`` is the recorder (the step chain) it observes for.

    The hooks a recorder calls (each a no-op here; which of them a framework's recorder
    calls, and with what, its module says):

    - ``install()`` -> an undo callable or None: wrap what the concern watches.
    - ``reset_step()``: a step begins (state kept per step starts afresh).
    - ``step_scalars(scalars)``: add this concern's scalars to the step's (in place).
    - ``after_step(step, opt)``: the step is written.
    """

    def __init__(self, rec: Any) -> None:
        self.rec = rec

    def install(self) -> Callable[[], None] | None:
        return None

    def reset_step(self) -> None:
        return None

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        return None

    def after_step(self, step: int, opt: Any) -> None:
        return None


@dataclass(frozen=True, kw_only=True)
class ObserverEntry:
    """One registered observer."""

    framework: str
    """The recorder it belongs to (``torch``, ``tensorflow``)."""
    name: str
    """Its name, unique per framework; the recorder keeps it as ``rec.observers[name]``."""
    cls: type
    """The ``Observer`` subclass, made once per recorder with the recorder."""
    rank: int
    """Its place in the chain at every hook (lower runs first)."""


_OBSERVERS: dict[str, dict[str, ObserverEntry]] = {}


def register_observer(framework: str, name: str, cls: type, *, rank: int) -> ObserverEntry:
    """Register ``cls`` as observer ``name`` of ``framework``'s recorder, run at ``rank``."""
    entries = _OBSERVERS.setdefault(framework, {})
    if name in entries:
        raise ValueError(f"observer '{name}' of the {framework} recorder is already registered")
    entry = ObserverEntry(framework=framework, name=name, cls=cls, rank=rank)
    entries[name] = entry
    return entry


def observer_classes(framework: str) -> tuple[ObserverEntry, ...]:
    """The observers registered for ``framework``, by rank (then registration order)."""
    return tuple(sorted(_OBSERVERS.get(framework, {}).values(), key=lambda e: e.rank))


def flatten(observers: list[Observer], hook: str) -> tuple[Callable[..., Any], ...]:
    """The bound ``hook`` of each observer that overrides it, in order (made once, at construction)."""
    out = []
    for o in observers:
        fn = getattr(type(o), hook, None)
        if fn is not None and fn is not getattr(Observer, hook, None):
            out.append(getattr(o, hook))
    return tuple(out)
