"""The random generators a re-run can seed as candidate causes of two runs that differ.

Split from ``reprobisect.core.hints`` (which re-exports every public name here): the
``CauseCandidate`` each cause is, ``HOLD_VAR``, and the generators ``torch.manual_seed``
leaves alone, which ``hints.cause_candidates`` adds to its list (``with_global_rngs``):

- the global RNGs of NumPy and Python's ``random`` (or, for TensorFlow, one global seed),
  tried when nothing records a draw from them: the question is asked, the re-run answers it;
- the private generators the recorder saw built without a seed (manifest
  ``extra.rng_sources``, ``reprobisect.runners.observers.rng_sources``: ``np.random.default_rng()``,
  ``random.Random()`` ... with their call site): a record that an entropy source exists, so
  tried first, named by its call site, and held seeded by ``reprobisect.runners.hold``'s
  ``private_rngs``.

When both runs fetched the same sample ids, the data's order is not what differs: the
DataLoader's shuffle is no candidate then (its workers' seeds only while torch was not
seeded), and what is left to suspect is what makes the values, not what orders them.
Pure: no framework import; reads only the traces' manifests and step batch ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["HOLD_VAR", "CauseCandidate", "with_global_rngs", "rng_sources", "same_ids", "OUTSIDE_MATH",
           "OUTSIDE_ORDER", "OUTSIDE_VALUES", "ORDER_KINDS", "step_of"]

ORDER_KINDS = ("batch", "input")
"""Record kinds that carry the data itself (its order, its values)."""

OUTSIDE_MATH = ("something else computes differently (an op without a deterministic implementation, the thread "
                "count, the hardware?)")
OUTSIDE_ORDER = "something outside the seeds orders the data (the time, the pid, the environment?)"
"""What is left after a data-order candidate (string hashing, the loader's generator) is ruled out."""
OUTSIDE_VALUES = ("something outside the seeds makes the data's values (the ids agree: a generator seeded from the "
                  "time or the pid, a file that changes?)")
"""What is left once a data candidate is ruled out and both runs fetched the same sample ids."""


def step_of(trace: Any, k: int) -> Any:
    """Step ``k`` of ``trace`` (None when it has none, or no trace)."""
    if trace is None:
        return None
    for s in getattr(trace, "steps", ()):
        if s.step == k:
            return s
    return None


def same_ids(trace_a: Any, trace_b: Any, first: Any) -> bool:
    """Both runs fetched the same sample ids at the first difference, which is in the data: its
    values differ, not its order."""
    sa, sb = step_of(trace_a, first.step), step_of(trace_b, first.step)
    return (first.kind in ORDER_KINDS and sa is not None and sb is not None and sa.batch_ids is not None
            and sa.batch_ids == sb.batch_ids)


HOLD_VAR = "REPROBISECT_HOLD"
"""The variable naming what ``reprobisect.runners.hold`` holds fixed inside a re-run
(comma-separated: ``loader_seed``, ``one_thread``, ``deterministic``, ``tf_determinism``, ``numpy_seed``,
``random_seed``, ``global_seed``, ``private_rngs``)."""


@dataclass(frozen=True, kw_only=True)
class CauseCandidate:
    """One cause a pair of re-runs can test: hold it fixed, and see whether the runs agree."""

    name: str
    """``hashseed``, ``loader_seed``, ``one_thread``, ``deterministic``, ``tf_determinism``, ``numpy_seed``,
    ``random_seed``, ``global_seed`` or ``private_rngs``."""
    held: str
    """What the re-runs hold fixed, as the user would set it (``PYTHONHASHSEED=0``)."""
    env: dict[str, str]
    """The variables the re-runs set (``HOLD_VAR`` for what needs the runner)."""
    question: str
    """The cause as a question (``does string hashing decide the data order?``)."""
    cause: str
    """The cause stated as fact, once a re-run confirmed it."""
    fix: str
    """What to change once it is confirmed."""
    outside: str
    """What is left to suspect when holding it fixed does not make the runs agree."""
    hint: str | None = None
    """The comparison's hint this candidate tests (shown in its place once tested)."""


# --------------------------------------------------------------------------- global RNGs as causes to test

_OUTSIDE_DRAWS = ("something else draws differently in every run (a generator seeded from the time or the pid, "
                  "another unseeded generator?)")


def _numpy_candidate() -> CauseCandidate:
    return CauseCandidate(
        name="numpy_seed", held="NumPy's global RNG seeded (numpy.random.seed(0) at start-up)",
        env={HOLD_VAR: "numpy_seed"},
        question="does the run draw from NumPy's global RNG (np.random.*), which nothing seeds?",
        cause="the run draws from NumPy's global RNG (np.random.*), which nothing seeds (torch.manual_seed does not)",
        fix="seed it (np.random.seed(N)) or draw from a seeded generator (np.random.default_rng(N), a torch.Generator)",
        outside=_OUTSIDE_DRAWS)


def _random_candidate() -> CauseCandidate:
    return CauseCandidate(
        name="random_seed", held="Python's random module seeded (random.seed(0) at start-up)",
        env={HOLD_VAR: "random_seed"},
        question="does the run draw from Python's random module (random.*), which nothing seeds?",
        cause="the run draws from Python's random module (random.*), which nothing seeds (torch.manual_seed does not)",
        fix="seed it (random.seed(N)) or draw from a seeded random.Random(N)", outside=_OUTSIDE_DRAWS)


def _global_seed_candidate(layers: list[str]) -> CauseCandidate:
    named = f" ({', '.join(layers[:4])}{' …' if len(layers) > 4 else ''} got no seed=)" if layers else ""
    what = (f"an unseeded random layer{named} draws a new mask/noise in every run" if layers
            else "an unseeded random op (a Dropout or noise layer without seed=, tf.random.* without a seed, "
                 "NumPy or Python random) draws differently in every run")
    return CauseCandidate(
        name="global_seed", held="a global seed (random, NumPy and tf.random seeded with 0 at start-up, as "
                                 "keras.utils.set_random_seed(0))",
        env={HOLD_VAR: "global_seed"}, question=f"does {what}, with no global seed set?",
        cause=f"{what}, and no global seed is set",
        fix=("give the layer a seed (e.g. Dropout(rate, seed=N)) or call keras.utils.set_random_seed(N) "
             "(tf.random.set_seed(N)) before building the model"),
        outside=OUTSIDE_MATH)


def _tf_extra(trace: Any) -> dict[str, Any]:
    extra = getattr(getattr(trace, "manifest", None), "extra", None) or {}
    tf_info = extra.get("tensorflow") if isinstance(extra, dict) else None
    return tf_info if isinstance(tf_info, dict) else {}


def with_global_rngs(order: list[CauseCandidate], trace_a: Any, trace_b: Any, first: Any) -> list[CauseCandidate]:
    """``order`` with the generators ``torch.manual_seed`` leaves alone as candidates too: any
    draw from them (an augmentation, a dropout mask, a shuffle of one's own, the data itself)
    differs in every run however torch is seeded.

    First, the private generators the recorder saw built without a seed (``rng_sources``):
    a record that such a source exists. Then, for TensorFlow (the manifest has
    ``extra.tensorflow``), one candidate, a global seed; first when the recorder listed random
    layers built without ``seed=`` and no global seed (``unseeded_random_layers``,
    ``global_seed``), since in graph mode no layer output names them, else last. Otherwise
    NumPy's then Python's global RNG: before the loader's generator when both runs fetched the
    same sample ids at the first differing step (the samples' values differ, not their order:
    what loading them drew), else after the others. With the same ids, what is left to suspect
    after a data candidate is what makes the values (``OUTSIDE_VALUES``), not what orders them.
    """
    private = [_private_candidate(rng_sources(trace_a, trace_b))] if rng_sources(trace_a, trace_b) else []
    same = same_ids(trace_a, trace_b, first)
    if same:
        order = [c if c.outside != OUTSIDE_ORDER else _values_outside(c) for c in order]
    tf_a, tf_b = _tf_extra(trace_a), _tf_extra(trace_b)
    if tf_a or tf_b:
        layers = list(tf_a.get("unseeded_random_layers") or tf_b.get("unseeded_random_layers") or ())
        seeded = tf_a.get("global_seed") is not None and tf_b.get("global_seed") is not None
        c = _global_seed_candidate([str(x) for x in layers])
        return [*private, c, *order] if layers and not seeded else [*private, *order, c]
    rngs = [_numpy_candidate(), _random_candidate()]
    if not same:
        return [*private, *order, *rngs]
    keep = [c for c in order if c.name != "loader_seed"]
    return [*private, *keep, *rngs, *[c for c in order if c.name == "loader_seed"]]




def _values_outside(c: CauseCandidate) -> CauseCandidate:
    from dataclasses import replace

    return replace(c, outside=OUTSIDE_VALUES)


# --------------------------------------------------------------------------- private generators built without a seed


def rng_sources(trace_a: Any, trace_b: Any) -> list[dict[str, Any]]:
    """The generators either run built without a seed (manifest ``extra.rng_sources``), by call
    site, run A's first; empty when neither recorded one (or the traces predate the record)."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[Any, Any]] = set()
    for t in (trace_a, trace_b):
        extra = getattr(getattr(t, "manifest", None), "extra", None) or {}
        for e in (extra.get("rng_sources") or ()) if isinstance(extra, dict) else ():
            if isinstance(e, dict) and (e.get("kind"), e.get("where")) not in seen:
                seen.add((e.get("kind"), e.get("where")))
                out.append(e)
    return out


_KIND_SAID = {"numpy": ("a NumPy generator built without a seed", "np.random.default_rng(N) (or Generator(PCG64(N)), "
                        "SeedSequence(N), RandomState(N)), or pass one seeded generator down"),
              "random.Random": ("a random.Random() built without a seed", "random.Random(N)")}


def _site(e: dict[str, Any]) -> str:
    """``np.random.default_rng() at train.py:16`` (the recorded code when there is some)."""
    code = str(e.get("code") or "").strip()
    what = code if code else _KIND_SAID.get(str(e.get("kind")), ("a generator built without a seed", ""))[0]
    return f"{what} at {e.get('where')}"


def _private_candidate(sources: list[dict[str, Any]]) -> CauseCandidate:
    """Hold the recorded private generators seeded: named by their call sites."""
    sites = "; ".join(_site(e) for e in sources[:3]) + (f"; and {len(sources) - 3} more" if len(sources) > 3 else "")
    kinds = [k for k in _KIND_SAID if any(e.get("kind") == k for e in sources)] or ["numpy"]
    what = " and ".join(_KIND_SAID[k][0] for k in kinds)
    fix = "; ".join(_KIND_SAID[k][1] for k in kinds)
    return CauseCandidate(
        name="private_rngs", held=f"the unseeded generators seeded ({sites})", env={HOLD_VAR: "private_rngs"},
        question=(f"does {what} ({sites}) draw differently in every run? it takes fresh OS entropy, which "
                  "np.random.seed, random.seed and torch.manual_seed do not touch"),
        cause=(f"{what} ({sites}) takes fresh OS entropy in every run; the global seeds (np.random.seed, "
               "random.seed, torch.manual_seed) do not reach it"),
        fix=f"seed it: {fix}", outside=_OUTSIDE_DRAWS)
