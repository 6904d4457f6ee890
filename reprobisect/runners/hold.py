"""What a confirming re-run holds fixed inside the user's process (``REPROBISECT_HOLD``).

``bisect repro`` tests a candidate cause of two runs that differ by re-running the pair
with that cause held fixed (``reprobisect.workflows.confirm``). What an environment
variable can hold fixed (``PYTHONHASHSEED``, ``OMP_NUM_THREADS``, ``TF_DETERMINISTIC_OPS``)
it sets itself; what needs a call inside the process is named in ``REPROBISECT_HOLD``
(comma-separated) and done here, right after the script imports the framework:

``loader_seed``     every ``torch.utils.data.DataLoader`` built without ``generator=`` gets
                    ``torch.Generator().manual_seed(0)`` (its shuffle and its workers' seeds)
``one_thread``      ``torch.set_num_threads(1)`` (and one inter-op thread where still allowed)
``deterministic``   ``torch.use_deterministic_algorithms(True)``, cuDNN deterministic, no benchmark
``tf_determinism``  ``tf.config.experimental.enable_op_determinism()``
``numpy_seed``      ``numpy.random.seed(0)``: NumPy's global RNG, which ``torch.manual_seed`` leaves alone
``random_seed``     ``random.seed(0)``: Python's ``random`` module (Keras 3 draws the seed of every
                    layer built without ``seed=`` from it)
``private_rngs``    the generators a script builds without a seed, which take OS entropy and ignore
                    every global seed: each NumPy bit generator built with ``seed=None``
                    (``np.random.default_rng()``, ``Generator(PCG64())``, ``SeedSequence()``,
                    ``RandomState()``) and each ``random.Random()`` gets the next number of a
                    stream seeded with 0 instead (distinct generators stay distinct, in every run alike)
``global_seed``     all three global RNGs of a TensorFlow run (``random``, NumPy, ``tf.random.set_seed(0)``),
                    as ``keras.utils.set_random_seed(0)`` does

Unlike the recorders (which only observe), this changes the run on purpose: it is set only
for confirming re-runs, never for the runs being judged. Registered in
``reprobisect.runners.registry`` (triggers ``torch`` and ``tensorflow``); without the
variable it does nothing.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from reprobisect.core.hints import HOLD_VAR

__all__ = ["HOLDS", "held", "activate_torch", "activate_tensorflow"]

HOLDS = ("loader_seed", "one_thread", "deterministic", "tf_determinism", "numpy_seed", "random_seed", "global_seed",
         "private_rngs")
"""What ``REPROBISECT_HOLD`` may name."""

_GENERATOR_POSITION = 12
"""``generator`` is the DataLoader's 13th positional parameter (``dataset`` first)."""


def held() -> frozenset[str]:
    """What this process's ``REPROBISECT_HOLD`` names (unknown names are ignored)."""
    return frozenset(h.strip() for h in os.environ.get(HOLD_VAR, "").split(",") if h.strip() in HOLDS)


def activate_torch(run: Any) -> None:
    """Hold fixed what ``REPROBISECT_HOLD`` names for torch; returns None (no recorder)."""
    holds = held()
    _seed_globals(holds)
    if not holds & {"loader_seed", "one_thread", "deterministic"}:
        return None
    import torch  # imported by the script already: this is its activation

    if "loader_seed" in holds:
        _seed_loaders(torch)
    if "one_thread" in holds:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # parallel work started already: the intra-op count is what sums
            pass
    if "deterministic" in holds:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return None


def _seed_globals(holds: frozenset[str]) -> None:
    """Seed the global RNGs ``holds`` names (NumPy's, Python's) with 0, at the framework's import:
    before the script builds its model or draws its data."""
    if holds & {"numpy_seed", "global_seed"}:
        try:
            import numpy as np
        except ImportError:  # no NumPy: nothing of it to hold
            pass
        else:
            np.random.seed(0)
    if holds & {"random_seed", "global_seed"}:
        import random

        random.seed(0)
    if "private_rngs" in holds:
        _seed_private()


def _seed_private() -> None:
    """Give every generator built without a seed from now on the next number of one stream
    seeded with 0: NumPy's entropy function (every bit generator built with ``seed=None``
    draws it) and ``random.Random.seed(None)``. The global RNGs are left as the script has them."""
    import random

    stream = random.Random(0)  # built before the wrap below: its own seed is 0, as given
    try:
        import numpy.random.bit_generator as bg
    except ImportError:  # no NumPy: its generators cannot be built
        bg = None
    if bg is not None and hasattr(bg, "randbits") and not getattr(bg.randbits, "_reprobisect_hold", False):
        def randbits(n: int) -> int:
            return stream.getrandbits(n)

        randbits._reprobisect_hold = True  # type: ignore[attr-defined]
        bg.randbits = randbits
    original = random.Random.__dict__.get("seed")
    if original is None or getattr(original, "_reprobisect_hold", False):
        return

    @functools.wraps(original)
    def seed(self: Any, a: Any = None, version: int = 2) -> None:
        return original(self, stream.getrandbits(64) if a is None else a, version)

    seed._reprobisect_hold = True  # type: ignore[attr-defined]
    random.Random.seed = seed


def _seed_loaders(torch: Any) -> None:
    """Give every DataLoader built without a generator one seeded with 0."""
    cls = torch.utils.data.DataLoader
    original = cls.__init__
    if getattr(original, "_reprobisect_hold", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) <= _GENERATOR_POSITION and kwargs.get("generator") is None:
            kwargs["generator"] = torch.Generator().manual_seed(0)
        original(self, *args, **kwargs)

    __init__._reprobisect_hold = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def activate_tensorflow(run: Any) -> None:
    """TF op determinism, the global seeds, when ``REPROBISECT_HOLD`` names them; returns None (no recorder)."""
    holds = held()
    _seed_globals(holds)
    if not holds & {"tf_determinism", "global_seed"}:
        return None
    import tensorflow as tf  # imported by the script already

    if "tf_determinism" in holds:
        tf.config.experimental.enable_op_determinism()
    if "global_seed" in holds:
        tf.random.set_seed(0)
    return None
