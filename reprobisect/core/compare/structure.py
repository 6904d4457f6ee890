"""Structural differences between two traces: which steps and which records each holds.

Steps are paired by number; inside a step, records are paired by ``(kind, name)`` and
merged in chain order (a record present on one side only keeps the place it holds in its
own trace, and is reported as ``missing`` there). A step only one side holds is a
structural difference, unless the shorter side stopped early (an incomplete trace holding
a prefix of the other's steps: said in the note, not a divergence). Activations a side
could not record because it ran those modules under torch.compile are not structural
differences either. Batch IDs are compared here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from reprobisect.core.compare.results import Divergence, TensorDiff
from reprobisect.trace.format import Record, Step
from reprobisect.trace.reader import Trace

__all__: list[str] = []

_BATCH_IDS = "<batch_ids>"


def _pair_records(sa: Step, sb: Step) -> Iterable[tuple[Record | None, Record | None]]:
    """Both steps' records merged in chain order; a one-sided record keeps its own place."""
    ka = {r.key for r in sa.records}
    rb = sb.records
    bpos = {r.key: i for i, r in enumerate(rb)}
    j = 0
    for ra in sa.records:
        p = bpos.get(ra.key)
        if p is None:
            yield ra, None
            continue
        if p >= j:
            for r in rb[j:p]:
                if r.key not in ka:
                    yield None, r
            j = p + 1
        yield ra, rb[p]
    for r in rb[j:]:
        if r.key not in ka:
            yield None, r


def _batch_diff(sa: Step, sb: Step) -> TensorDiff | None:
    ia, ib = sa.batch_ids, sb.batch_ids
    if ia is None or ib is None or ia == ib:
        return None
    la, lb = list(ia), list(ib)
    first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
    mism = sum(1 for x, y in zip(la, lb) if x != y) + abs(len(la) - len(lb))
    show_a = la[first] if first < len(la) else "(end)"
    show_b = lb[first] if first < len(lb) else "(end)"
    return TensorDiff("diverged", "batch_ids", detail=f"batch IDs differ (first at position {first}: {show_a!r} vs {show_b!r})",
                      mismatched=mism, total=max(len(la), len(lb)), first_index=(first,))


def _unobserved(trace: Trace) -> tuple[str, ...]:
    """Module names whose activations ``trace`` could not record because they ran under
    torch.compile (the recorder's ``environment.torch.compile.unobserved``): ``*`` every
    module, ``NAME.*`` the modules below NAME, ``NAME`` NAME and those below it,
    ``<input>``/``<output>`` the model's own inputs/outputs (``model.compile()``)."""
    env = trace.manifest.environment
    comp = env.get("torch", {}).get("compile") if isinstance(env, dict) and isinstance(env.get("torch"), dict) else None
    if not isinstance(comp, dict) or comp.get("mode") != "compiled":
        return ()
    names = comp.get("unobserved")
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def _not_recorded(r: Record, unobserved: tuple[str, ...]) -> bool:
    """True for an activation (or model input/output) the other trace could not hold: it
    ran that module compiled."""
    if r.kind in ("input", "output"):
        return f"<{r.kind}>" in unobserved
    if r.kind != "activation" or not unobserved:
        return False
    module = r.name.split("#", 1)[0].split("[", 1)[0]
    for u in unobserved:
        if u == "*":
            return True
        if u.endswith(".*"):
            if module.startswith(u[:-1]):
                return True
        elif module == u or module.startswith(u + "."):
            return True
    return False


@dataclass(frozen=True)
class _Steps:
    """Which steps both traces hold, which one side only, and what that means."""

    common: list[int]
    only_a: list[int]
    only_b: list[int]
    structure: str  # the step sets differ: a structural divergence
    note: str  # an incomplete side holds a prefix of the other's steps: said, not a divergence


def _step_structure(a: Trace, b: Trace, steps_a: tuple[int, ...], steps_b: tuple[int, ...]) -> _Steps:
    common = sorted(set(steps_a) & set(steps_b))
    only_a = sorted(set(steps_a) - set(steps_b))
    only_b = sorted(set(steps_b) - set(steps_a))
    structure = note = ""
    if only_a or only_b:
        parts = [f"A has {len(steps_a)} step(s), B has {len(steps_b)}"]
        for side, only in (("A", only_a), ("B", only_b)):
            if only:
                parts.append(f"step{'s' if len(only) > 1 else ''} {_ranges(only)} only in {side}")
        last = max(common) if common else -1
        short = "B" if only_a else "A"
        short_trace = b if only_a else a
        if not (only_a and only_b) and min(only_a or only_b) > last and not short_trace.complete:
            # the shorter side was stopped early (read with allow_incomplete): its steps are a
            # prefix of the other's, so the common steps are all there is to compare
            note = "; ".join(parts) + f" (trace {short} is {short_trace.manifest.status}: compared steps both hold)"
        else:
            structure = "; ".join(parts)
    return _Steps(common, only_a, only_b, structure, note)


def _missing_step(shape: _Steps) -> Divergence:
    """The first divergence of traces whose records agree but whose step sets do not."""
    k = (shape.only_a + shape.only_b)[0]
    side = "a" if shape.only_a and k == shape.only_a[0] else "b"
    return Divergence(k, "step", f"step {k}", "missing",
                      TensorDiff("missing", "structure", detail=shape.structure), origin=True,
                      localization="first", only_in=side)


def _compile_note(note: str, not_recorded: dict[str, int], unobserved: dict[str, tuple[str, ...]]) -> str:
    """``note`` plus, per side, the activations not compared because that side ran them compiled."""
    for side, n in not_recorded.items():
        if n:
            have = "A" if side == "b" else "B"
            said = (f"{n} activation record(s) only in {have} not compared: trace {side.upper()} ran those modules "
                    "under torch.compile, where activations are not recorded")
            if any(u in unobserved[side] for u in ("<input>", "<output>")):
                said += " (nor the inputs and outputs of a model compiled with model.compile())"
            note = f"{note}; {said}" if note else said
    return note


def _ranges(xs: list[int]) -> str:
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:  # type: ignore[list-item]
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)
