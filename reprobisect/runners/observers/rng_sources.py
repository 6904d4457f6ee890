"""Private random generators the run created without a seed: ``extra.rng_sources``.

``torch.manual_seed``, ``np.random.seed`` and ``random.seed`` seed the global RNGs only. A
generator of one's own built without a seed takes fresh OS entropy and ignores them all:
``np.random.default_rng()``, ``np.random.Generator(np.random.PCG64())``,
``np.random.SeedSequence()``, ``np.random.RandomState()`` (every NumPy bit generator built
with ``seed=None`` draws its entropy through one function, ``numpy.random.bit_generator.randbits``)
and ``random.Random()`` (``Random.seed(None)``). Its draws differ in every run however the
script seeds, and no record names the generator: the values differ, not where they came
from. So this notes each one the user's code builds, with its call site, as evidence for
``bisect repro`` (``reprobisect.core.rng_candidates``), which then holds them seeded
(``reprobisect.runners.hold``'s ``private_rngs``) to confirm it.

Cheap: two wraps at install (the entropy function, ``Random.seed``), a frame walk per
unseeded generator built, nothing per step. A seeded generator is never recorded, and a run
that builds none writes nothing (``extra.rng_sources`` absent). Generators built inside the
standard library, a package (site-packages) or reprobisect itself are not the user's code
and are not listed (``tempfile`` builds an unseeded ``Random`` for its names). Framework-free:
registered for the torch recorder, which installs it when the script imports torch;
generators built before that import are not seen. ``torch.Generator()`` is not listed: an
unseeded one starts from a fixed default seed, the same in every run.

Manifest ``extra.rng_sources``: ``[{"kind": "numpy", "where": "train.py:17", "code":
"rng = np.random.default_rng()", "count": 40}, {"kind": "random.Random", ...}]``, at most
``MAX_SOURCES`` call sites, first seen first.
"""

from __future__ import annotations

import io
import linecache
import os
import sys
import sysconfig
import tokenize
from typing import Any, Callable

from reprobisect.runners.chain import Observer, register_observer

__all__ = ["RngSourcesObserver", "MAX_SOURCES", "KINDS", "call_site"]

MAX_SOURCES = 16
"""Call sites listed at most (a generator per sample built in a loop is one call site)."""

KINDS = {"numpy": "a NumPy generator (np.random.default_rng(), Generator(PCG64()), SeedSequence(), RandomState())",
         "random.Random": "a random.Random()"}
"""What each ``kind`` names, for the answer's wording."""

_STDLIB = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")}
                if p)
_OURS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))) + os.sep


def _not_user(filename: str) -> bool:
    """A file of the standard library, an installed package or reprobisect: not the user's code."""
    if filename.startswith("<") and filename not in ("<stdin>", "<string>"):
        return True  # <frozen importlib._bootstrap>, generated code
    path = os.path.realpath(filename)
    if "site-packages" in path or "dist-packages" in path or path.startswith(_OURS):
        return True
    return path.startswith(_STDLIB)


def call_site(frame: Any) -> tuple[str, str] | None:
    """``(file:line, source line)`` of ``frame`` when it is the user's code; else None.

    ``frame`` is the Python frame that built the generator (NumPy's compiled constructors
    leave no frame of their own; ``random.Random.__init__``'s is skipped by the caller)."""
    if frame is None or _not_user(frame.f_code.co_filename):
        return None
    name = frame.f_code.co_filename
    try:
        rel = os.path.relpath(name)
        name = rel if not rel.startswith("..") else name
    except ValueError:  # another drive (Windows)
        pass
    return f"{name}:{frame.f_lineno}", _code(linecache.getline(frame.f_code.co_filename, frame.f_lineno))


def _code(line: str) -> str:
    """The source line without its comment (the user's words are not evidence), at most 160 characters."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                line = line[:tok.start[1]]
                break
    except (tokenize.TokenError, SyntaxError):  # a line of a longer statement: kept whole
        pass
    return line.strip()[:160]


class RngSourcesObserver(Observer):
    """Lists the generators the user's code built without a seed (see the module docstring)."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.sources: dict[tuple[str, str], dict[str, Any]] = {}

    def install(self) -> Callable[[], None] | None:
        undo = [u for u in (self._wrap_numpy(), self._wrap_random()) if u is not None]
        return (lambda: [u() for u in reversed(undo)]) if undo else None

    def note(self, kind: str, frame: Any) -> None:
        """One unseeded generator of ``kind`` built in ``frame``: listed (or counted) in the manifest."""
        site = call_site(frame)
        if site is None:
            return
        key = (kind, site[0])
        entry = self.sources.get(key)
        if entry is not None:
            entry["count"] += 1
        elif len(self.sources) < MAX_SOURCES:
            self.sources[key] = {"kind": kind, "where": site[0], "code": site[1], "count": 1}
        else:
            return
        update = getattr(getattr(self.rec, "writer", None), "update_extra", None)
        if update is not None:
            update({"rng_sources": [dict(e) for e in self.sources.values()]})

    def _wrap_numpy(self) -> Callable[[], None] | None:
        """Wrap the entropy every NumPy bit generator built without a seed draws."""
        try:  # the recorder's trace writer imports NumPy already; its random package may not be yet
            import numpy.random.bit_generator as bg
        except ImportError:
            return None
        original = getattr(bg, "randbits", None)
        if original is None:  # another NumPy: nothing known to wrap
            return None
        observer = self

        def randbits(n: int) -> int:
            observer.note("numpy", sys._getframe(1))
            return original(n)

        bg.randbits = randbits
        return lambda: setattr(bg, "randbits", original)

    def _wrap_random(self) -> Callable[[], None] | None:
        """Wrap ``random.Random.seed`` (``Random()`` calls it from ``__init__``) for ``a=None``."""
        import random

        original = random.Random.__dict__.get("seed")
        if original is None:
            return None
        observer = self

        def seed(self: Any, a: Any = None, version: int = 2) -> None:
            if a is None and type(self) is not random.SystemRandom:
                frame = sys._getframe(1)
                if frame.f_code is random.Random.__init__.__code__:
                    frame = frame.f_back  # Random(): its caller built it
                observer.note("random.Random", frame)
            return original(self, a, version)

        seed.__doc__ = original.__doc__
        random.Random.seed = seed
        return lambda: setattr(random.Random, "seed", original)


register_observer("torch", "rng_sources", RngSourcesObserver, rank=5)
