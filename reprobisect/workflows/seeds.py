"""The library behind ``bisect seeds``: which chain components depend on the seed.

``run_seeds`` runs one probe per seed (``{seed}`` substituted into the command) and
``seed_map`` compares the traces component by component:

``data_order``    the batch IDs (sample indices) of each step. With no batch IDs
                  recorded, ``unknown``.
``augmentation``  batch *content* (the ``batch``/``input`` records) when the batch IDs
                  agree: same samples, different tensors = seed-dependent augmentation.
``init``          the initial weights. Parameters are recorded *after* each step, so
                  they mix init with data and dropout; the honest signal is step 0's
                  forward pass: a non-stochastic module (not Dropout-like) whose input
                  fingerprints agree across seeds but whose output differs can only
                  differ through its weights. When no such module has agreeing inputs
                  (the data differs from the first layer on), init is ``unknown``, not
                  guessed — unless step 0's full tensors were kept (``--full-steps 0``):
                  then the first layer's output rows are compared on the samples both
                  first batches share (same input row, different output row = weights).
                  Parameter records that a recorder marks as taken before the first
                  step (``meta.phase`` ``init`` / ``before``) are used first.
``dropout``       outputs of Dropout-like modules (class name Dropout*, DropPath,
                  StochasticDepth) whose inputs agree across seeds.
``loss``          the loss (record or scalar) of each step.

Expectations, and the flags raised when a run contradicts them: init, data order (when
the data is shuffled) and dropout (when the model has it) should change with the seed;
a component that does not is flagged ("data order ignores the seed"). The reverse: a
loss that changes while nothing recorded upstream changed depends on the seed through
something unrecorded; the flag says so. ``--noise-floor`` (3 seeds or more) gives the
per-step spread of loss and gradient norm across seeds, the yardstick for judging a
divergence elsewhere against ordinary seed-to-seed noise.

With ``--detail sentinel`` the first two seeds' first difference is escalated
(``reprobisect.workflows.escalate``): both are replayed with full detail from the last
state before it, and ``SeedMap.escalation`` names the full chain's first broken link there.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterable, NamedTuple

import numpy as np

from reprobisect.errors import UsageError
from reprobisect.executors import executor_for
from reprobisect.executors.base import ProbeResult
from reprobisect.core.compare import Comparison
from reprobisect.core.hints import layers_hidden
from reprobisect.core.options import ProbeOptions
from reprobisect.core.verdict import compare_results
from reprobisect.executors.retry import retry
from reprobisect.support.progress import progress
from reprobisect.trace.format import Record, Step
from reprobisect.trace.ranks import read_rank0
from reprobisect.trace.reader import Trace
from reprobisect.workflows.escalate import Escalation, escalate_or_why
from reprobisect.workflows.repro import _failed, spec_for

__all__ = [
    "COMPONENTS",
    "ComponentSensitivity",
    "NoiseFloorStep",
    "SeedControl",
    "SeedMap",
    "substitute_seed",
    "parse_seeds",
    "seed_map",
    "run_seeds",
]

COMPONENTS = ("init", "data_order", "augmentation", "dropout", "loss")
STATUSES = ("changed", "unchanged", "unknown", "absent")
_STOCHASTIC = re.compile(r"(dropout|droppath|drop_path|stochasticdepth)", re.I)
_SEED = "{seed}"


class Finding(NamedTuple):
    """What one analysis says about one component for one pair of seeds."""

    status: str
    """One of ``STATUSES``."""
    evidence: str
    """What was compared, or why it could not be told."""


class DataOrder(NamedTuple):
    """The data-order finding, and whether the batch IDs agreed at every step."""

    status: str
    evidence: str
    ids_equal: bool


class SharedSamples(NamedTuple):
    """Both first batches' IDs, and (row in A, row in B) for each sample both hold."""

    ids_a: list[object]
    ids_b: list[object]
    rows: list[tuple[int, int]]


StepPair = tuple[Step, Step]


@dataclass(frozen=True)
class ComponentSensitivity:
    """Whether one chain component changed with the seed, and the evidence."""

    component: str
    """One of ``COMPONENTS``."""
    status: str
    """``changed``, ``unchanged``, ``unknown`` (cannot be isolated) or ``absent`` (not in this model)."""
    evidence: str
    """What was compared (first differing record or why it could not be told)."""
    flag: str | None = None
    """Set when the status contradicts what the component should do with the seed."""

    def to_json(self) -> dict[str, Any]:
        return {"component": self.component, "status": self.status, "evidence": self.evidence, "flag": self.flag}


@dataclass(frozen=True)
class NoiseFloorStep:
    """Spread across seeds of the loss and gradient norm at one step."""

    step: int
    loss: tuple[float, ...]
    grad_norm: tuple[float, ...]

    @staticmethod
    def _spread(xs: tuple[float, ...]) -> dict[str, float] | None:
        xs2 = [x for x in xs if math.isfinite(x)]
        if len(xs2) < 2:
            return None
        return {"mean": statistics.fmean(xs2), "std": statistics.stdev(xs2), "range": max(xs2) - min(xs2)}

    @property
    def loss_spread(self) -> dict[str, float] | None:
        return self._spread(self.loss)

    @property
    def grad_norm_spread(self) -> dict[str, float] | None:
        return self._spread(self.grad_norm)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "loss": list(self.loss), "grad_norm": list(self.grad_norm),
                "loss_spread": self.loss_spread, "grad_norm_spread": self.grad_norm_spread}


@dataclass(frozen=True)
class SeedMap:
    """The seed-sensitivity map of one command; truthy when nothing is flagged."""

    seeds: tuple[str, ...]
    components: tuple[ComponentSensitivity, ...]
    runs: tuple[ProbeResult, ...] = ()
    noise_floor: tuple[NoiseFloorStep, ...] | None = None
    first_divergence: Comparison | None = None
    """The comparison of the first two seeds' traces (where they first stop agreeing)."""
    escalation: Escalation | None = None
    """With ``--detail sentinel``: the full chain where the first two seeds first differ, from
    replays of both (``reprobisect.workflows.escalate``); None when they agree or recorded full detail."""
    control: "SeedControl | None" = None
    """The first seed run a second time: whether what changed between seeds changes without a
    seed change too (None: not run, e.g. nothing changed)."""

    def __bool__(self) -> bool:
        return not self.flags

    @property
    def flags(self) -> tuple[str, ...]:
        own = (self.control.flag,) if self.control is not None and self.control.flag else ()
        return tuple(c.flag for c in self.components if c.flag) + own


@dataclass(frozen=True)
class SeedControl:
    """The control experiment behind "changes with the seed": the first seed, run twice.

    A component that differs between seeds 0 and 1 follows the seed only if two runs of seed
    0 agree on it; a shuffle seeded from the clock differs between seeds and between two runs
    of one seed alike. Truthy when the two runs of one seed agree."""

    seed: str
    agreed: bool | None
    """True: the same seed gives identical runs; False: they differ; None: not run (``reason``)."""
    first_difference: str | None = None
    """``step S · kind · name`` where two runs of the same seed first differ."""
    unstable: tuple[str, ...] = ()
    """Components that changed between the seeds and also between two runs of the same seed."""
    reason: str = ""
    check: str = ""
    """The command that tests why a run of one seed does not repeat (``bisect repro``)."""

    def __bool__(self) -> bool:
        return self.agreed is True

    @property
    def text(self) -> str:
        """One line: confirmed, not (only) the seed, or the question with its check."""
        if self.agreed is True:
            return f"confirmed: seed {self.seed} run twice gives identical runs, so the changes above follow the seed"
        if self.agreed is False:
            what = ", ".join(self.unstable) if self.unstable else "the run"
            verb = "change" if len(self.unstable) > 1 else "changes"
            return (f"not (only) the seed: seed {self.seed} run twice differs too (first difference at "
                    f"{self.first_difference}); {what} {verb} without a seed change; check why: {self.check}")
        return (f"hint: does each change above follow the seed, or would it change anyway? check: {self.check}"
                + (f" ({self.reason})" if self.reason else ""))

    @property
    def flag(self) -> str | None:
        """A flag when one seed does not repeat itself (the map cannot tell seed from noise there)."""
        if self.agreed is not False:
            return None
        return (f"seed {self.seed} does not repeat itself (first difference at {self.first_difference}): "
                "a 'changed' above may not be the seed's doing")

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "agreed": self.agreed, "first_difference": self.first_difference,
                "unstable": list(self.unstable), "reason": self.reason or None, "check": self.check, "text": self.text}

    def component(self, name: str) -> ComponentSensitivity:
        for c in self.components:
            if c.component == name:
                return c
        raise KeyError(name)


# --------------------------------------------------------------------------- input


def parse_seeds(text: str | Iterable[object]) -> tuple[str, ...]:
    """'0,1,2' → ('0', '1', '2'); at least two distinct seeds."""
    items = text.split(",") if isinstance(text, str) else [str(x) for x in text]
    seeds = tuple(s.strip() for s in items if s.strip())
    if len(set(seeds)) < 2:
        raise UsageError(f"--seeds needs at least two different seeds, e.g. --seeds 0,1 (got '{text}')")
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds lists a seed twice ('{text}')")
    return seeds


def substitute_seed(argv: list[str], seed: str) -> list[str]:
    """``argv`` with every ``{seed}`` replaced; no ``{seed}`` at all is a UsageError."""
    if not any(_SEED in a for a in argv):
        raise UsageError(
            "the command has no {seed} placeholder; put it where the seed goes, "
            "e.g. bisect seeds --seeds 0,1 -- python train.py --seed {seed}"
        )
    return [a.replace(_SEED, seed) for a in argv]


# --------------------------------------------------------------------------- analysis


def _records(step: Step, kinds: tuple[str, ...]) -> list[Record]:
    return [r for r in step.records if r.kind in kinds]


def _common_steps(a: Trace, b: Trace) -> list[StepPair]:
    bs = {s.step: s for s in b.steps}
    return [(s, bs[s.step]) for s in a.steps if s.step in bs]


def _is_stochastic(rec: Record) -> bool:
    return bool(_STOCHASTIC.search(rec.module or "") or _STOCHASTIC.search(rec.name.rsplit(".", 1)[-1]))


def _sequential(ids: object) -> bool:
    flat = _flatten(ids)
    if len(flat) < 2 or not all(isinstance(x, int) for x in flat):
        return False
    return flat == list(range(flat[0], flat[0] + len(flat)))


def _flatten(x: object) -> list[object]:
    if isinstance(x, (list, tuple)):
        out: list[object] = []
        for y in x:
            out.extend(_flatten(y))
        return out
    return [x]


def _data_order(pairs: list[StepPair]) -> DataOrder:
    """(status, evidence, ids equal at every step) from batch IDs."""
    seen = False
    for sa, sb in pairs:
        if sa.batch_ids is None or sb.batch_ids is None:
            continue
        seen = True
        if sa.batch_ids != sb.batch_ids:
            return DataOrder("changed", f"batch IDs differ at step {sa.step}", False)
    if not seen:
        return DataOrder("unknown", "no batch IDs recorded (the data does not come through a torch DataLoader?)", False)
    return DataOrder("unchanged", f"batch IDs identical over {len(pairs)} step(s)", True)


def _augmentation(pairs: list[StepPair], ids_equal: bool, a: Trace | None = None, b: Trace | None = None) -> Finding:
    if not ids_equal:
        rows = _augmentation_by_samples(a, b, pairs[0]) if pairs else None
        if rows is not None:
            return rows
        return Finding("unknown", ("batch IDs differ (or are not recorded), so content cannot be told from order; "
                                   "add --full-steps 0 to compare the samples both first batches share"))
    found = False
    for sa, sb in pairs:
        bmap = sb.by_key()
        for r in _records(sa, ("batch", "input")):
            o = bmap.get(r.key)
            if o is None:
                continue
            found = True
            if o.fingerprint != r.fingerprint:
                return Finding("changed", f"same samples, different {r.kind} '{r.name}' at step {sa.step}")
    if not found:
        return Finding("unknown", "no batch/input content recorded")
    return Finding("unchanged", "same samples give identical batch content")


def _shared_samples(a: Trace | None, b: Trace | None, sa: Step, sb: Step) -> SharedSamples | None:
    """A's and B's batch IDs, and (row in A, row in B) for each sample both batches hold.

    None when the traces cannot give tensors or a side recorded no batch IDs.
    """
    if not hasattr(a, "tensor") or not hasattr(b, "tensor") or sa.batch_ids is None or sb.batch_ids is None:
        return None
    ids_a, ids_b = _flatten(sa.batch_ids), _flatten(sb.batch_ids)
    return SharedSamples(ids_a, ids_b, [(i, ids_b.index(x)) for i, x in enumerate(ids_a) if x in ids_b])


def _augmentation_by_samples(a: Trace | None, b: Trace | None, pair: StepPair) -> Finding | None:
    """With step-0 tensors stored: batch content rows of the samples both first batches hold."""
    sa, sb = pair
    found = _shared_samples(a, b, sa, sb)
    if found is None or not found.rows:
        return None
    ids_a, ids_b, shared = found
    bmap = sb.by_key()
    compared = 0
    for r in _records(sa, ("batch",)):
        o = bmap.get(r.key)
        if o is None or not (r.stored and o.stored) or r.name == "ids":
            continue
        try:
            xa, xb = a.tensor(sa.step, r), b.tensor(sb.step, o)
        except Exception:
            return None
        if xa is None or xb is None or len(xa) != len(ids_a) or len(xb) != len(ids_b):
            continue
        compared += 1
        for i, j in shared:
            if not np.array_equal(xa[i], xb[j], equal_nan=True):
                return Finding("changed", f"step {sa.step}: sample {ids_a[i]} has different '{r.name}' content under the two seeds")
    if not compared:
        return None
    return Finding("unchanged", f"step {sa.step}: the {len(shared)} sample(s) both batches share have identical content")


def _init(pairs: list[StepPair], a: Trace | None = None, b: Trace | None = None) -> Finding:
    if not pairs:
        return Finding("unknown", "no common step")
    sa, sb = pairs[0]
    bmap = sb.by_key()
    # 1. parameters the recorder took before the first update
    pre = [r for r in _records(sa, ("param",)) if (r.meta or {}).get("phase") in ("init", "before")]
    if pre:
        for r in pre:
            o = bmap.get(r.key)
            if o is not None and o.fingerprint != r.fingerprint:
                return Finding("changed", f"initial parameter '{r.name}' differs")
        return Finding("unchanged", f"{len(pre)} initial parameter(s) identical")
    # 2. step 0: a deterministic module with agreeing inputs and a differing output
    isolated = 0
    for r in _records(sa, ("activation",)):
        if _is_stochastic(r) or r.inputs is None:
            continue
        o = bmap.get(r.key)
        if o is None or o.inputs is None or tuple(o.inputs) != tuple(r.inputs):
            continue
        isolated += 1
        if o.fingerprint != r.fingerprint:
            return Finding("changed", f"step {sa.step}: '{r.name}' ({r.module or 'module'}) has identical inputs and a different output")
    if isolated:
        return Finding("unchanged", f"step {sa.step}: {isolated} module(s) with identical inputs give identical outputs")
    by_rows = _init_by_samples(a, b, sa, sb)
    if by_rows is not None:
        return by_rows
    return Finding("unknown", (f"step {sa.step}: no module sees identical inputs under both seeds (the data differs from "
                               "the first layer on), so init cannot be isolated from data; add --full-steps 0 to "
                               "compare the first layer on the samples both seeds' first batches share"))


def _init_by_samples(a: Trace | None, b: Trace | None, sa: Step, sb: Step) -> Finding | None:
    """With step-0 tensors stored: the first layer's output rows for samples in both batches.

    The first deterministic module that consumes the model's input directly is compared
    row by row on the samples (batch IDs) both first batches hold; identical input rows
    and different output rows can only come from its weights.
    """
    found = _shared_samples(a, b, sa, sb)
    if found is None or not found.rows:
        return None
    ids_a, ids_b, shared = found
    inputs_a = {r.fingerprint: r for r in _records(sa, ("input",))}
    bmap = sb.by_key()
    for r in _records(sa, ("activation", "output")):
        if _is_stochastic(r) or not r.inputs or not r.stored or r.inputs[0] not in inputs_a:
            continue
        o = bmap.get(r.key)
        in_a = inputs_a[r.inputs[0]]
        in_b = bmap.get(in_a.key)
        if o is None or in_b is None or not (o.stored and in_a.stored and in_b.stored):
            continue
        try:
            xa, xb = a.tensor(sa.step, in_a), b.tensor(sb.step, in_b)
            ya, yb = a.tensor(sa.step, r), b.tensor(sb.step, o)
        except Exception:  # a missing shard: this signal is not available
            return None
        if any(t is None for t in (xa, xb, ya, yb)) or not (len(xa) == len(ids_a) == len(ya) and len(xb) == len(ids_b) == len(yb)):
            continue
        rows = [(i, j) for i, j in shared if np.array_equal(xa[i], xb[j], equal_nan=True)]
        if not rows:
            continue
        diff = [(i, j) for i, j in rows if not np.array_equal(ya[i], yb[j], equal_nan=True)]
        where = f"step {sa.step}: '{r.name}' ({r.module or 'module'}) on {len(rows)} sample(s) both batches share"
        if diff:
            return Finding("changed", f"{where}: same input rows, different output rows")
        return Finding("unchanged", f"{where}: same input rows, same output rows")
    return None


def _dropout(pairs: list[StepPair], hidden: str | None = None) -> Finding:
    """``hidden``: why the traces hold no layer outputs (``hints.layers_hidden``), if so."""
    present = False
    comparable = 0
    for sa, sb in pairs:
        bmap = sb.by_key()
        for r in _records(sa, ("activation",)):
            if not _is_stochastic(r):
                continue
            present = True
            o = bmap.get(r.key)
            if o is None or r.inputs is None or o.inputs is None or tuple(o.inputs) != tuple(r.inputs):
                continue
            comparable += 1
            if o.fingerprint != r.fingerprint:
                return Finding("changed", f"step {sa.step}: '{r.name}' ({r.module or 'dropout'}) masks identical inputs differently")
    if not present and hidden is not None:
        return Finding("unknown", f"layer outputs were {hidden}, so dropout cannot be seen (REPROBISECT_TF_EAGER=1 "
                                  "records every layer's output)")
    if not present:
        return Finding("absent", "no Dropout-like module recorded")
    if comparable:
        return Finding("unchanged", f"{comparable} dropout output(s) with identical inputs are identical")
    return Finding("unknown", "dropout inputs already differ under the two seeds")


def _loss_values(step: Step) -> list[tuple[str, str]]:
    vals = [(f"loss record '{r.name}'", r.fingerprint) for r in _records(step, ("loss",))]
    if "loss" in (step.scalars or {}):
        vals.append(("loss scalar", repr(step.scalars["loss"])))
    return vals


def _loss(pairs: list[StepPair]) -> Finding:
    seen = False
    for sa, sb in pairs:
        la, lb = dict(_loss_values(sa)), dict(_loss_values(sb))
        for k in la:
            if k in lb:
                seen = True
                if la[k] != lb[k]:
                    return Finding("changed", f"{k} differs at step {sa.step}")
    if not seen:
        return Finding("unknown", "no loss recorded")
    return Finding("unchanged", f"loss identical over {len(pairs)} step(s)")


_ORDER = {"changed": 3, "unchanged": 2, "unknown": 1, "absent": 0}


def _merge(results: list[Finding]) -> Finding:
    """Over several seed pairs: changed wins, then unchanged (only if no pair was unknown)."""
    changed = [r for r in results if r.status == "changed"]
    if changed:
        return changed[0]
    if any(r.status == "unknown" for r in results):
        return next(r for r in results if r.status == "unknown")
    return results[0]


def seed_map(traces: list[Trace], seeds: tuple[str, ...]) -> tuple[ComponentSensitivity, ...]:
    """The component map from one trace per seed (``Trace`` objects, same order as ``seeds``)."""
    if len(traces) < 2:
        raise UsageError("a seed map needs traces of at least two seeds")
    per: dict[str, list[Finding]] = {c: [] for c in COMPONENTS}
    sequential = False
    for other in traces[1:]:
        pairs = _common_steps(traces[0], other)
        order = _data_order(pairs)
        ids_equal = order.ids_equal
        per["data_order"].append(Finding(order.status, order.evidence))
        per["augmentation"].append(_augmentation(pairs, ids_equal, traces[0], other))
        per["init"].append(_init(pairs, traces[0], other))
        per["dropout"].append(_dropout(pairs, layers_hidden(traces[0]) or layers_hidden(other)))
        per["loss"].append(_loss(pairs))
        if pairs and pairs[0][0].batch_ids is not None:
            sequential = _sequential(pairs[0][0].batch_ids) and ids_equal
    merged = {c: _merge(v) for c, v in per.items()}

    def flag(c: str, status: str) -> str | None:
        if c == "init" and status == "unchanged":
            return "init ignores the seed: the weights are the same under every seed (a fixed seed inside the model code, or a checkpoint?)"
        if c == "data_order" and status == "unchanged" and not sequential:
            return "data order ignores the seed: the same shuffled order under every seed (a sampler/generator seeded with a constant?)"
        if c == "dropout" and status == "unchanged":
            return "dropout ignores the seed: identical masks under every seed (seeded with a constant, or p=0 / eval mode?)"
        if c == "loss" and status == "changed":
            upstream = [merged[u].status for u in ("init", "data_order", "augmentation", "dropout")]
            if all(s in ("unchanged", "absent") for s in upstream):
                return "the loss changes with the seed although nothing recorded upstream does: a seed-dependent loss term or an unhooked random op?"
        if c == "loss" and status == "unchanged":
            upstream = [merged[u].status for u in ("init", "data_order", "augmentation", "dropout")]
            if "changed" in upstream:
                return "the loss is identical under every seed although its inputs change: is the loss computed from the model's output?"
        return None

    out = []
    for c in COMPONENTS:
        status, ev = merged[c]
        if c == "data_order" and status == "unchanged" and sequential:
            ev += " (sequential: no shuffling)"
        out.append(ComponentSensitivity(c, status, ev, flag(c, status)))
    return tuple(out)


def _scalar(step: Step, names: tuple[str, ...], kinds: tuple[str, ...] = ()) -> float:
    sc = step.scalars or {}
    for n in names:
        if n in sc:
            try:
                return float(sc[n])
            except (TypeError, ValueError):
                pass
    for k in sc:
        if any(n in k for n in names):
            try:
                return float(sc[k])
            except (TypeError, ValueError):
                pass
    for r in step.records:
        if r.kind in kinds:
            v = r.stat("mean")
            if v is not None:
                return v
    return math.nan


def noise_floor(traces: list[Trace]) -> tuple[NoiseFloorStep, ...]:
    """Per step: loss and gradient norm of every seed (spread via ``NoiseFloorStep``)."""
    steps = sorted(set.intersection(*[{s.step for s in t.steps} for t in traces]))
    out = []
    for k in steps:
        ss = [t.step(k) for t in traces]
        out.append(NoiseFloorStep(
            step=k,
            loss=tuple(_scalar(s, ("loss",), ("loss",)) for s in ss),
            grad_norm=tuple(_scalar(s, ("grad_norm", "grad_norm_total", "total_grad_norm")) for s in ss),
        ))
    return tuple(out)


# --------------------------------------------------------------------------- running


def run_seeds(argv: list[str], options: ProbeOptions, *, seeds: tuple[str, ...] | str,
              noise: bool = False, cwd: str | os.PathLike | None = None, confirm: bool = False) -> SeedMap:
    """Probe ``argv`` once per seed (``{seed}`` substituted) and map seed sensitivity.

    ``noise`` (3 seeds or more) adds the per-step noise floor. A seed whose probe
    produced no trace is a ``ProbeError`` naming it. Unless ``options.full_steps`` says
    otherwise, step 0's full tensors are kept: without them init and augmentation cannot
    be told apart from data order whenever the data order follows the seed.

    When a component changed between seeds, ``confirm`` runs the first seed once more (the
    control: ``SeedControl``): what also changes between two runs of one seed does not follow
    the seed (``bisect seeds`` does unless ``--no-confirm``; the library only when asked).
    With ``confirm`` False the map says it was not checked.
    """
    if not options.full_steps:
        options = replace(options, full_steps=(0,))

    seeds = parse_seeds(seeds) if isinstance(seeds, str) else parse_seeds(list(seeds))
    if noise and len(seeds) < 3:
        raise UsageError(f"--noise-floor needs at least 3 seeds (got {len(seeds)}); e.g. --seeds 0,1,2")
    argvs = [substitute_seed(argv, s) for s in seeds]
    tag = uuid.uuid4().hex[:8]
    specs = [
        replace(spec_for(a, options, key=f"seed-{tag}-{i}", workdir=cwd), extra_launch_args=("--seed", s))
        for i, (a, s) in enumerate(zip(argvs, seeds))
    ]
    with executor_for(options) as ex, progress("seeds", total=len(specs), quiet=options.quiet) as p:
        futures = [ex.submit(s) for s in specs]
        results = []
        for s, f in zip(seeds, futures):
            p.update(f"seed {s}")
            results.append(retry(ex, f.result()))
            p.advance()
        if not all(r.outcome for r in results):
            raise _failed(results, "cannot map seed sensitivity")
        traces = [read_rank0(r.trace_dir, allow_incomplete=True) for r in results]  # rank 0 of a multi-rank trace
        comps = seed_map(traces, seeds)
        nf = noise_floor(traces) if noise else None
        first = compare_results(results[0], results[1], "bitwise")
        esc = escalate_or_why(first, results[0], results[1], ex, "bitwise")
        control = _control(ex, results[0], traces[0], comps, seeds[0], argv, confirm=confirm,
                           note=None if options.quiet else p.note)
    return SeedMap(seeds=seeds, components=comps, runs=tuple(results), noise_floor=nf, first_divergence=first,
                   escalation=esc, control=control)


def _control(ex: Any, run: ProbeResult, trace: Trace, comps: tuple[ComponentSensitivity, ...], seed: str,
             argv: list[str], *, confirm: bool, note: Any) -> SeedControl | None:
    """Run ``seed`` again when a component changed between seeds; None when nothing changed."""
    import shlex

    from reprobisect.render.runs import divergence_place

    changed = [c.component for c in comps if c.status == "changed"]
    if not changed:
        return None
    check = f"bisect repro --runs 2 -- {shlex.join(substitute_seed(argv, seed))}"
    if not confirm:
        return SeedControl(seed=seed, agreed=None, reason="no control run made", check=check)
    if note is not None:
        note(f"confirm: running seed {seed} once more, to tell the seed's changes from run-to-run ones (1 more run)")
    again = retry(ex, ex.submit(replace(run.spec, key=f"{run.spec.key}-control", attempt=0)).result())
    if not again.outcome:
        return SeedControl(seed=seed, agreed=None, reason=f"not tested: the control run ended {again.outcome.status}",
                           check=check)
    comp = compare_results(run, again, "bitwise")
    if comp:
        return SeedControl(seed=seed, agreed=True, check=check)
    same = seed_map([trace, read_rank0(again.trace_dir, allow_incomplete=True)], (seed, seed))
    unstable = tuple(c.component for c in same if c.status == "changed" and c.component in changed)
    return SeedControl(seed=seed, agreed=False, first_difference=divergence_place(comp, structure_only="structure"),
                       unstable=unstable, check=check)
