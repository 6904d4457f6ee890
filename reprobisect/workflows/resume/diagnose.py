"""Compare a resumed run with the uninterrupted one and name the state component a checkpoint forgot.

Pure: it reads two ``Trace`` values and knows nothing of processes or frameworks. The
uninterrupted run A recorded steps ``0..N-1``; the resumed run C recorded steps
``0..N-K-1``, and C's step ``j`` is A's step ``K + j``. Comparison is bitwise (a resume
either continues the run exactly or it does not): batch IDs, the scalar sentinels
(learning rates, GradScaler scale, Lightning's progress when its recorder wrote it) and
every record's fingerprint.

C is aligned first (``align``): batches its first step drew and discarded to reach its data
position (exactly A's batches of the steps before) are left out, and a C that starts from A's
parameters after an older step s and continues from there (a checkpoint every few steps) is
compared from step s + 1.

At the first aligned step that differs, the component is named by what differs first in
the order a step depends on its state:

0. the checkpoint: C starts from A's parameters after another step than K-1 (a stale file; after
   K-2 with step K's data: saved before ``optimizer.step()``);
1. the step counter: C's data equal A's one step later or earlier over every overlapping step
   (an off-by-one global step: a skipped or repeated batch; the data is the batch IDs, else the
   batch tensors or the model's inputs of a loop that indexes its data by hand), or Lightning's
   ``global_step``. Learning rates shifted while the data is at its own step are the scheduler's
   (4.), and shifted with nothing recorded about the data they are a question, not a verdict;
2. the model parameters at the start: C's initial parameters are not A's after step K-1;
3. data order: the batch IDs differ (and whether the data restarted from its beginning);
   Lightning's ``batch_idx``: the dataloader position;
   the GradScaler: its scale differs (the scaler's decision precedes the optimizer step and the
   scheduler, so a step it skipped — no lr recorded, a schedule stepped only after real updates
   falling behind — is listed under "also" as its consequence, never as learning-rate evidence);
   the optimizer state;
4. learning rate / scheduler (told by what the interrupted run saved after its last step:
   a scheduler saved before it stepped is "saved one step late", an optimizer a scheduler
   drives saved without any scheduler state is "not saved", one saved up to date "not loaded");
   5. Lightning's loop progress and callback states;
6. the records in chain order: a batch tensor, an input or a module output (dropout, an
   augmentation) that differs while its inputs agree is RNG; a loss that differs while the
   batch and the parameters agree is RNG (a sentinel trace sees no activations); parameters
   after the step or optimizer state that differ while the gradients agree are the
   optimizer state.

When every training record agrees, the evaluation summaries both runs recorded between steps
(``scalars["eval"]``: ``evaluation.evaluation_difference``) are compared: other outputs there are
an ``evaluation`` finding (an EMA/averaged copy or a teacher not restored), not a bitwise resume.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from reprobisect.trace.format import Record, Step
from reprobisect.trace.reader import Trace
from reprobisect.workflows.resume.evaluation import evaluation_difference

__all__ = ["COMPONENTS", "Alignment", "Finding", "align", "diagnose", "first_difference"]

COMPONENTS = ("checkpoint", "step counter", "model parameters", "data order", "dataloader position", "learning rate / scheduler",
              "GradScaler", "loop progress", "callback state", "RNG", "optimizer state", "evaluation", "other")
"""The state components a finding can name (``Finding.component``)."""

_FORWARD = ("input", "activation", "output")


@dataclass(frozen=True)
class Finding:
    """The first place a resumed run leaves the uninterrupted one, and the component it points to."""

    step: int
    """The step of the uninterrupted run (``K + j``) where the first difference is."""
    component: str
    """One of ``COMPONENTS``."""
    what: str
    """What differs there, one line (``batch IDs [4, 9] vs [0, 3]``)."""
    why: str
    """Why that points to the component, and the usual fix."""
    also: tuple[str, ...] = field(default_factory=tuple)
    """Other components that differ at the same step (they may follow from the first)."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "component": self.component, "what": self.what, "why": self.why,
                "also": list(self.also)}


def _lr(s: Step) -> Any:
    return s.scalars.get("lr")


def _lr_unrecorded(sa: Step, sc: Step) -> bool:
    """One of the two steps has no learning rate because the GradScaler skipped its
    ``optimizer.step()`` (``scaler_skipped``): the missing rate is no learning-rate evidence."""
    return any(_lr(s) is None and s.scalars.get("scaler_skipped") for s in (sa, sc)) and _lr(sa) != _lr(sc)


_LIGHTNING_COUNTERS = ("global_step", "epoch", "batch_idx")
"""The Trainer's counters that change what training does next (the step count drives schedules,
checkpoints and the run's end). Its loop-progress and callback-state fingerprints are
bookkeeping: after a correct resume at an epoch's last batch Lightning's own
``epoch_progress`` counters differ (ready/started 1 vs 2) while every tensor agrees."""


def bookkeeping_notes(a: Trace, c: Trace, at: int) -> tuple[str, ...]:
    """Where Lightning's loop progress or callback state first differs between A's steps ``at..``
    and C's steps ``0..`` (``scalars["lightning"]``): said alongside the verdict, never as it."""
    notes: list[str] = []
    for key, what in (("loops", "loop progress"), ("callbacks", "callback state")):
        for sc in c.steps:
            sa = a.step(at + sc.step)
            la, lc = (_lightning(sa), _lightning(sc)) if sa is not None else ({}, {})
            if not la or not lc or la.get(key) == lc.get(key):
                continue
            if key == "loops":
                pa, pc = la.get("progress") or {}, lc.get("progress") or {}
                diff = [f"{k} {pa.get(k)} vs {pc.get(k)}" for k in sorted(set(pa) | set(pc)) if pa.get(k) != pc.get(k)]
                detail = (", ".join(diff[:3]) + (f" (+{len(diff) - 3} more)" if len(diff) > 3 else "")) if diff else \
                    f"{_short(la.get(key))} vs {_short(lc.get(key))}"
            else:
                va, vc = la.get(key) or {}, lc.get(key) or {}
                names = [k for k in sorted(set(va) | set(vc)) if va.get(k) != vc.get(k)]
                detail = "callbacks " + ", ".join(f"'{n}'" for n in names[:3])
            notes.append(f"Lightning {what} differs from step {sa.step} ({detail}): the Trainer's own bookkeeping, "
                         "not a tensor; it matters only if your code reads it")
            break
    return tuple(notes)


def _lightning(s: Step) -> dict[str, Any]:
    v = s.scalars.get("lightning")
    return v if isinstance(v, dict) else {}


def _short(x: Any, n: int = 8) -> str:
    if isinstance(x, list) and len(x) > n:
        return "[" + ", ".join(map(str, x[:n])) + ", ...]"
    return str(x)


def _records_differ(sa: Step, sc: Step) -> Record | None:
    """C's first record (chain order) whose fingerprint is not A's for the same key (init aside)."""
    ka = sa.by_key()
    for r in sc.records:
        if r.kind == "init":
            continue
        ra = ka.get(r.key)
        if ra is not None and ra.fingerprint != r.fingerprint:
            return r
    return None


def first_difference(a: Step, c: Step) -> str | None:
    """One line saying what differs between A's step and C's aligned step (None: bitwise the same)."""
    if a.batch_ids != c.batch_ids:
        return f"batch IDs {_short(a.batch_ids)} vs {_short(c.batch_ids)}"
    for key in ("lr", "scaler_scale", "loss", "grad_norm"):
        if key == "lr" and _lr_unrecorded(a, c):
            continue  # a step the GradScaler skipped records no lr: not a learning rate that differs
        if a.scalars.get(key) != c.scalars.get(key):
            return f"{key} {a.scalars.get(key)!r} vs {c.scalars.get(key)!r}"
    la, lc = _lightning(a), _lightning(c)
    for k in _LIGHTNING_COUNTERS:  # loops/callbacks are bookkeeping: notes (bookkeeping_notes), not a verdict
        if la and lc and la.get(k) != lc.get(k):
            return f"Lightning {k} {la.get(k)!r} vs {lc.get(k)!r}"
    r = _records_differ(a, c)
    if r is not None:
        return f"{r.kind} '{r.name}'"
    missing = {x.key for x in a.records if x.kind != "init"} ^ {x.key for x in c.records if x.kind != "init"}
    if missing:
        kind, name = sorted(missing)[0]
        return f"{kind} '{name}' recorded in one run only"
    return None


def _data_key(s: Step) -> tuple[str, Any] | None:
    """What a step trained on, as (what it is, its value): its batch IDs; without them the
    fingerprints of its batch tensors, or of the model's inputs (a loop that indexes its data by
    hand, ``x[i:i + b]``); None: nothing about its data was recorded."""
    if s.batch_ids is not None:
        return ("batch IDs", list(s.batch_ids))
    for kind, what in (("batch", "batches"), ("input", "model inputs")):
        fps = sorted((r.name, r.fingerprint) for r in s.records if r.kind == kind)
        if fps:
            return (what, fps)
    return None


def _shifted(a: Trace, c: Trace, at: int) -> tuple[int, str] | None:
    """(+1/-1, the evidence) when C's data (batch IDs, else its batch tensors or model inputs) equal
    A's one step later/earlier at every overlapping step and not A's own step at some (an
    off-by-one step counter: the resume skipped or repeated a batch); the learning rates stand in
    only when nothing about the data was recorded (evidence ``learning rates``, which a scheduler
    saved one step late shows too). The LR is not required to shift with the data: a scheduler
    restored from its own state keeps its count while the data follows the step."""
    for d in (1, -1):
        n, moved, ok, basis = 0, False, True, ""
        for sc in c.steps:
            sa, same = a.step(at + sc.step + d), a.step(at + sc.step)
            if sa is None:
                continue
            kc, ka = _data_key(sc), _data_key(sa)
            if kc is not None and ka is not None and kc[0] == ka[0]:
                basis, got, want = kc[0], kc[1], ka[1]
                now = (_data_key(same) or (None, None))[1] if same is not None else got
            elif kc is None and ka is None and _lr(sc) is not None and _lr(sa) is not None:
                basis, got, want, now = "learning rates", _lr(sc), _lr(sa), _lr(same) if same is not None else _lr(sc)
            else:
                continue
            if got != want:
                ok = False
                break
            n += 1
            moved = moved or now != got  # else the data (or lr) is the same at both steps: no evidence of a shift
        if ok and n and moved:
            return d, basis
    return None


def _restarted(a: Trace, c: Step) -> int | None:
    """The earlier step of A whose batch IDs C's step has (the data restarted there), or None."""
    for sa in a.steps:
        if sa.batch_ids is not None and sa.batch_ids == c.batch_ids:
            return sa.step
    return None


def _stale_checkpoint(a: Trace, c: Trace, at: int) -> int | None:
    """The step of A (not ``at - 1``) after which A's parameters are exactly C's initial ones, or None."""
    have = _init_params(c)
    if not have:
        return None
    for sa in a.steps:
        if sa.step == at - 1:
            continue
        want = _params_after(a, sa.step)
        if want and all(have.get(n) == f for n, f in want.items()):
            return sa.step
    return None


def _params_after(a: Trace, step: int) -> dict[str, str]:
    s = a.step(step)
    return {r.name: r.fingerprint for r in s.records if r.kind == "param"} if s is not None else {}


def _init_params(c: Trace) -> dict[str, str]:
    s = c.step(0)
    return {r.name: r.fingerprint for r in s.records if r.kind == "init"} if s is not None else {}


def _optim_state_differs(sa: Step, sc: Step) -> str | None:
    """The first optimizer-state record that differs while every gradient agrees (full detail), or None."""
    ka = sa.by_key()
    first = None
    for r in sc.records:
        ra = ka.get(r.key)
        if ra is None or ra.fingerprint == r.fingerprint:
            continue
        if r.kind == "grad":
            return None
        if r.kind == "optim_state" and first is None:
            first = r.name
    return first


def _input_seen_at(a: Trace, sa: Step, r: Record) -> int | None:
    """The other step of A (the earliest) whose record ``r.key`` (a model input) has C's
    fingerprint, or None: where the data C trains on at ``sa`` sits in the uninterrupted run."""
    for s in a.steps:
        if s.step == sa.step:
            continue
        ra = s.by_key().get(r.key)
        if ra is not None and ra.fingerprint == r.fingerprint:
            return s.step
    return None


def _chain_component(a: Trace, sa: Step, sc: Step, prev_same: bool) -> tuple[str, str, str] | None:
    """(component, what, why) from the records in chain order; None when they agree."""
    ka = sa.by_key()
    batch_agrees = True
    grads_agree = True
    forward_agrees = True
    for r in sc.records:
        if r.kind == "init":
            continue
        ra = ka.get(r.key)
        if ra is None or ra.fingerprint == r.fingerprint:
            continue
        what = f"{r.kind} '{r.name}'" + (f" ({r.module})" if r.module else "")
        if r.kind == "batch":
            return ("RNG", what + " differs while the batch IDs agree",
                    "the same samples were loaded differently: a random augmentation in the dataset/collate draws "
                    "from an RNG the checkpoint did not save or restore")
        if r.kind in _FORWARD:
            if r.inputs is not None and ra.inputs is not None and tuple(r.inputs) == tuple(ra.inputs):
                return ("RNG", what + " differs while its inputs agree",
                        "a random operation (dropout, an augmentation) drew different numbers: restore the RNG "
                        "states (torch, numpy, python, CUDA) from the checkpoint")
            if r.kind == "input" and batch_agrees:
                seen = _input_seen_at(a, sa, r) if not any(x.kind == "batch" for x in sc.records) else None
                if seen is not None and seen > sa.step:
                    return ("data order", what + f" is the uninterrupted run's input at step {seen}: the data went "
                            f"ahead, skipping {seen - sa.step} step(s)' batches",
                            "the restored data position is past the one the checkpoint was saved at: a step or "
                            "epoch counter saved already incremented (and advanced again on resume) skips batches; "
                            "save the position completed and resume from exactly it")
                if seen is not None:
                    return ("data order", what + f" is the uninterrupted run's input at step {seen}: the data went "
                            "back to an earlier position",
                            "the batches do not come from a DataLoader the recorder sees (sampled with torch.randint, "
                            "indexed by hand): the RNG or position they are drawn from was not restored; save and "
                            "restore it (torch.get_rng_state(), the data index) with the checkpoint")
                return ("RNG", what + " differs while the batch agrees",
                        "the batch was changed between the loader and the model (a random augmentation): restore "
                        "the RNG states from the checkpoint")
            forward_agrees = False
            continue
        if r.kind == "loss" and forward_agrees and batch_agrees and prev_same:
            if a.detail == "sentinel":
                return ("RNG", what + " differs while the batch and the parameters agree",
                        "the forward pass drew different random numbers (dropout): restore the RNG states "
                        "(a sentinel trace has no activations; --detail full names the module)")
            continue
        if r.kind == "grad":
            grads_agree = False
            continue
        if r.kind in ("optim_state", "param") and grads_agree and forward_agrees:
            if r.kind == "param" and a.detail == "sentinel" and sa.scalars.get("loss") != sc.scalars.get("loss"):
                continue
            return ("optimizer state", what + " differs while the gradients agree",
                    "the update used other optimizer state (momentum/Adam moments, step count): save and load "
                    "optimizer.state_dict() with the checkpoint")
    return None


@dataclass(frozen=True)
class Alignment:
    """How the resumed run C lines up with the uninterrupted run A."""

    start: int
    """The step of A that C's step 0 is: ``at``, or ``s + 1`` after a resume from an older checkpoint (after step s)."""
    trace: Trace
    """C, with the batches its step 0 drew and discarded (to reach its data position) left out."""
    notes: tuple[str, ...] = ()
    """What the alignment did, one sentence each (said beside the verdict)."""


_OCCURRENCE = re.compile(r"^(.*?)(?:#(\d+))?$")


def _drop_skipped(a: Trace, c: Trace, start: int) -> tuple[Trace, tuple[int, int] | None]:
    """C without the first p batches of its step 0 when they are exactly the batches A trained on
    at the p steps before the one whose batch C's step 0 trains on (A's step ``start``; or
    ``start`` +/- 1, a skip one batch off, which the step counter then names): a resume that skips
    to its data position by drawing and discarding the epoch's consumed batches (the recorder
    cannot tell a batch drawn and thrown away from one that trains). Returns (C, the span of A's
    steps dropped); None: nothing dropped."""
    sc = c.step(0)
    if sc is None or not sc.batch_ids or (a.step(start) is not None and sc.batch_ids == a.step(start).batch_ids):
        return c, None
    ids = list(sc.batch_ids)
    drawn = sum(1 for r in sc.records if r.kind == "batch" and _OCCURRENCE.match(r.name).group(1) == "ids")
    for last in (start, start + 1, start - 1):
        sa = a.step(last)
        if sa is None or not sa.batch_ids:
            continue
        want = list(sa.batch_ids)
        if len(ids) <= len(want) or ids[-len(want):] != want:
            continue
        prefix, p, got = ids[:-len(want)], 0, []
        while len(got) < len(prefix):
            prev = a.step(last - p - 1)
            if prev is None or not prev.batch_ids:
                break
            got = list(prev.batch_ids) + got
            p += 1
        if got != prefix or drawn != p + 1:  # one ids record per drawn batch, else they cannot be told apart
            continue
        recs = []
        for r in sc.records:
            if r.kind == "batch":
                base, k = _OCCURRENCE.match(r.name).groups()
                k = int(k or 0) - p
                if k < 0:
                    continue
                r = replace(r, name=base if k == 0 else f"{base}#{k}")
            recs.append(r)
        step0 = replace(sc, records=tuple(recs), batch_ids=want)
        return Trace(path=c.path, manifest=c.manifest, steps=[step0, *c.steps[1:]]), (last - p, last - 1)
    return c, None


def _follows(a: Trace, c: Trace, start: int) -> bool:
    """C's step 0 takes A's step ``start``'s data (batch IDs; without them, its learning rate), and
    not the same as A's step ``start + 1``'s would (an older checkpoint and a counter that agree)."""
    sc, sa, nxt = c.step(0), a.step(start), a.step(start + 1)
    if sc is None or sa is None:
        return False
    if sc.batch_ids is not None and sa.batch_ids is not None:
        return sc.batch_ids == sa.batch_ids and (nxt is None or nxt.batch_ids != sa.batch_ids)
    return _lr(sc) is not None and _lr(sc) == _lr(sa) and (nxt is None or _lr(nxt) != _lr(sa))


def _span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}..{last}"


def align(a: Trace, c: Trace, at: int) -> Alignment:
    """Line C up with A. C's step 0 is A's step ``at`` unless C starts from A's parameters after an
    older step s (the last checkpoint was saved before the interruption: saved every few steps)
    and its data (or learning rate) is A's step s+1's, or it is bitwise A from there: then the resumed run redoes steps s+1..at-1
    and is compared from s+1. Batches drawn and discarded before C's first step are left out."""
    notes: list[str] = []
    start = at
    stale = _stale_checkpoint(a, c, at) if _init_params(c) != _params_after(a, at - 1) else None
    if stale is not None and stale < at - 1:
        cand, _ = _drop_skipped(a, c, stale + 1)
        # its data/lr is that of the step after the checkpoint, or (neither recorded nor changing)
        # every step it recorded is bitwise the uninterrupted run's from there
        if _follows(a, cand, stale + 1) or _diagnose(a, cand, stale + 1) is None:
            start = stale + 1
            notes.append(f"the resumed run restarted from a checkpoint saved after step {stale} (the last one before "
                         f"the interruption after step {at - 1}) and redid {_span(start, at - 1)}: it is compared "
                         f"from step {start} (a checkpoint every few steps loses that work, not the run's continuity)")
    c2, span = _drop_skipped(a, c, start)
    if span:
        notes.append(f"before its first step the resumed run drew and discarded {span[1] - span[0] + 1} batch(es) "
                     f"(those of {_span(*span)}) to reach its data position; they are left out of the comparison")
    return Alignment(start=start, trace=c2, notes=tuple(notes))


def diagnose(a: Trace, c: Trace, at: int, *, saved: tuple[dict[str, Any], ...] = ()) -> Finding | None:
    """The first difference between A's steps ``at..`` and C's steps ``0..`` and its component (None: bitwise).

    C is aligned first (``align``): batches it drew and discarded to reach its data position are
    left out, and a resume from an older checkpoint is compared from the step after it. ``saved``:
    what the interrupted run's end-of-step code saved (``Reference.saved``), the evidence that
    tells a scheduler saved before it stepped from one never saved or never loaded."""
    al = align(a, c, at)
    found = _diagnose(a, al.trace, al.start, tuple(saved))
    if found is None:  # training agrees: what it evaluated between steps may not (evaluation_difference)
        ev = evaluation_difference(a, al.trace, al.start)
        if ev is not None:
            return Finding(step=ev[0], component="evaluation", what=ev[1], why=ev[2])
    return found


def _diagnose(a: Trace, c: Trace, at: int, saved: tuple[dict[str, Any], ...] = ()) -> Finding | None:
    also: list[str] = []
    prev_same = True
    for sc in c.steps:
        s = at + sc.step
        sa = a.step(s)
        if sa is None:
            break
        what = first_difference(sa, sc)
        if sc.step == 0:
            want, have = _params_after(a, at - 1), _init_params(c)
            bad = sorted(n for n in want if n in have and have[n] != want[n])
            if bad and what is None:
                what = f"initial parameter '{bad[0]}'"
        else:
            bad = []
        if what is None:
            continue
        la, lc = _lightning(sa), _lightning(sc)
        found = _name(a, c, at, sa, sc, what, bad, prev_same, saved)
        if found[0] == "GradScaler":
            also.extend(_scaler_consequences(a, c, at, sa, sc))
        for key, comp in (("global_step", "step counter"), ("batch_idx", "dataloader position"),
                          ("loops", "loop progress"), ("callbacks", "callback state")):
            if la and lc and la.get(key) != lc.get(key) and comp != found[0]:
                also.append(f"{comp} (Lightning {key} {_short(la.get(key))} vs {_short(lc.get(key))})")
        return Finding(step=s, component=found[0], what=found[1], why=found[2], also=tuple(also))
    return None


def _name(a: Trace, c: Trace, at: int, sa: Step, sc: Step, what: str, bad_init: list[str],
          prev_same: bool, saved: tuple[dict[str, Any], ...] = ()) -> tuple[str, str, str]:
    la, lc = _lightning(sa), _lightning(sc)
    stale = _stale_checkpoint(a, c, at) if bad_init else None
    if stale is not None:
        if stale == at - 2 and _follows(a, c, at):
            return ("checkpoint", f"the resumed run starts from the uninterrupted run's parameters after step {stale}, "
                    f"not after step {at - 1}, yet goes on with step {at}'s data: the checkpoint is one update behind "
                    "its own step counter",
                    "the checkpoint was saved before that step's optimizer.step() (after backward) while its step "
                    "counter already counted the step: save after the update (and the scheduler/scaler steps)")
        return ("checkpoint", f"the resumed run starts from the uninterrupted run's parameters after step {stale}, "
                f"not after step {at - 1}",
                "the resume loaded the model of another step: the file it read was last saved after that step (a "
                "save every few steps, with a step counter taken from elsewhere), or it is another file than the one "
                "saved after the interruption's step (Lightning's ModelCheckpoint writes last-v1.ckpt next to an "
                "existing last.ckpt unless enable_version_counter=False)")
    counter = _counter_component(a, c, at, sa, sc, what)
    if counter is not None:
        return counter
    if la and lc and la.get("global_step") != lc.get("global_step"):
        return ("step counter", f"Lightning global_step {la.get('global_step')} vs {lc.get('global_step')}",
                "the restored global step is not the one the checkpoint was saved at")
    if bad_init:
        return ("model parameters", f"the resumed run starts from other parameters ('{bad_init[0]}' is not the "
                f"uninterrupted run's after step {at - 1})",
                "the checkpoint's model weights were not saved/loaded (or were saved at another step)")
    if sa.batch_ids != sc.batch_ids:
        r = _restarted(a, sc)
        where = ""
        if r is not None and r < sa.step:
            where = (f"; they are the uninterrupted run's step {r}: the data restarted at the start of the epoch (or "
                     "its shuffle was drawn again from a re-seeded generator)" if r == 0 else
                     f"; they are the uninterrupted run's step {r}: the data went back to an earlier position (an "
                     "earlier epoch's shuffle replayed: a sampler's generator state not restored, or a restarted "
                     "epoch)")
        elif r is not None and r > sa.step:
            where = (f"; they are the uninterrupted run's step {r}: the data went ahead, skipping {r - sa.step} "
                     "step(s)' batches (a step or epoch counter saved already incremented and advanced again?)")
        comp = "dataloader position" if la.get("batch_idx") != lc.get("batch_idx") and la and lc else "data order"
        return (comp, f"batch IDs {_short(sa.batch_ids)} vs {_short(sc.batch_ids)}{where}",
                "the data position was not restored: save the sampler/dataloader state (StatefulDataLoader, "
                "the epoch and batches consumed) and skip to it on resume")
    scaler = _scaler_component(a, sa, sc, saved)
    if scaler is not None:  # the scaler's decision precedes the optimizer step and the scheduler
        return scaler
    opt = _optim_state_differs(sa, sc)
    if opt is not None:
        return ("optimizer state", f"optimizer state '{opt}' differs while the gradients agree"
                + (f" (and the learning rate: {_lr(sa)!r} vs {_lr(sc)!r})" if _lr(sa) != _lr(sc) else ""),
                "the optimizer's state (momentum/Adam moments, its step count, its param_groups' learning rates) "
                "was not saved/loaded: save and load optimizer.state_dict() with the checkpoint (Keras: save the "
                "whole model, .keras, not its weights only, or the optimizer's variables)")
    lr = _lr_component(a, sa, sc, saved)
    if lr is not None:
        return lr
    if la and lc and la.get("batch_idx") != lc.get("batch_idx"):
        return ("dataloader position", f"Lightning batch_idx {la.get('batch_idx')} vs {lc.get('batch_idx')}",
                "the checkpoint restored the trainer's dataloader position differently (Lightning's batch_idx)")
    chain = _chain_component(a, sa, sc, prev_same)
    if chain is not None:
        return chain
    for key, comp in (("loops", "loop progress"), ("callbacks", "callback state")):
        if la and lc and la.get(key) != lc.get(key):
            va, vc = la.get(key), lc.get(key)
            if isinstance(va, dict) and isinstance(vc, dict):  # name the callback whose state differs
                name = next(k for k in sorted(set(va) | set(vc)) if va.get(k) != vc.get(k))
                return (comp, f"Lightning callback state '{name}' differs ({_short(va.get(name))} vs "
                        f"{_short(vc.get(name))})", f"the checkpoint did not restore the callback '{name}' as it was")
            return (comp, f"Lightning {key} {_short(va)} vs {_short(vc)}",
                    f"the checkpoint restored the trainer's {comp} differently (Lightning's {key})")
    return ("other", what, "no state component explains it from what was recorded; compare the traces "
                           "(bisect compare) or record with --detail full")


def _counter_component(a: Trace, c: Trace, at: int, sa: Step, sc: Step, what: str) -> tuple[str, str, str] | None:
    """The step counter, when C's data is A's one step later/earlier at every overlapping step
    (``_shifted``): the resume skipped a batch or trains on one again. Learning rates shifted
    with no record of the data are no such evidence on their own: a scheduler saved one step late
    shifts them the same way (``_lr_component`` says which, or asks)."""
    shift = _shifted(a, c, at)
    la, lc = _lightning(sa), _lightning(sc)
    if shift is None or (_restarted(a, sc) == 0 and sa.batch_ids != sc.batch_ids and sc.step == 0):
        return None  # no shift, or the data starts over: an epoch restart, which can look like an off-by-one
    if la and lc and "global_step" in la and la.get("global_step") == lc.get("global_step"):
        return None  # Lightning's own step counter agrees
    d, basis = shift
    if basis == "learning rates" or (_data_key(sa) == _data_key(sc) and _lr(sa) == _lr(sc)):
        return None  # learning rates alone: the scheduler's, or a question (``_lr_component``)
    s = sa.step
    did = (f"it skipped the batch of step {s} (it trains on step {s + 1}'s at step {s})" if d > 0 else
           f"it trains on step {s - 1}'s batch again at step {s}")
    return ("step counter", f"the resumed run's {basis} are the uninterrupted run's one step "
            f"{'later' if d > 0 else 'earlier'} at every step compared: {did} ({what})",
            f"the restored step counter is off by {d:+d}, so the data position is one batch "
            f"{'ahead' if d > 0 else 'behind'}: save the number of steps (or batches) completed and resume from "
            f"exactly that count (a counter saved {'after its increment and incremented again' if d > 0 else 'before its increment'} "
            "on resume is one off)")


def _lr_component(a: Trace, sa: Step, sc: Step, saved: tuple[dict[str, Any], ...]) -> tuple[str, str, str] | None:
    """The learning rate / scheduler, when the rate differs (None: it does not, or it is only missing
    on a step the GradScaler skipped: ``_lr_unrecorded``)."""
    if _lr(sa) != _lr(sc) and not _lr_unrecorded(sa, sc):
        lag = _lr_lag(a, sa, sc)
        what = f"learning rate {_lr(sa)!r} vs {_lr(sc)!r}" + (f" ({lag[1]})" if lag else "")
        data = _data_at_own_step(a, sa, sc)
        if data:
            what += f", while the resumed run's {data} are the uninterrupted run's at step {sa.step}"
        timing = _scheduler_timing(saved)
        if timing is not None:
            return ("learning rate / scheduler", what + timing[0], timing[1])
        if lag is not None and not data:  # nothing recorded says whether the data moved with it
            return ("learning rate / scheduler", what,
                    f"is the LR scheduler's state {'behind' if lag[0] > 0 else 'ahead'} (saved before "
                    "scheduler.step(), or not saved/loaded), or is the step counter a schedule is computed from off "
                    f"by {-lag[0]:+d}? nothing recorded tells which: check the step count the checkpoint holds "
                    "against the optimizer steps taken, and when its scheduler's state was saved")
        if a.detail == "sentinel":  # no optimizer state recorded: a fresh optimizer's lr looks the same
            return ("learning rate / scheduler", what,
                    "the LR scheduler's state, or the optimizer's (its param_groups carry the lr), was not "
                    "saved/loaded; a sentinel trace holds no optimizer state to tell them apart: --detail full does")
        return ("learning rate / scheduler", what,
                "the LR scheduler's state was not saved or not loaded (or saved before it stepped): save "
                "scheduler.state_dict() after scheduler.step() and load it on resume")
    return None


def _scaler_component(a: Trace, sa: Step, sc: Step,
                      saved: tuple[dict[str, Any], ...]) -> tuple[str, str, str] | None:
    """The GradScaler, when its scale differs at the step: the scale a step's loss is multiplied by
    is the scaler's state carried from the step before, so at the first step that differs nothing
    recorded earlier set it. A step skipped in one run only at the same scale is no such evidence
    (its gradients overflowed in one run only: they differ first). None: the scales agree."""
    va, vc = sa.scalars.get("scaler_scale"), sc.scalars.get("scaler_scale")
    if va == vc:
        return None
    what = f"GradScaler scale {va!r} vs {vc!r}"
    first = a.steps[0].scalars.get("scaler_scale") if a.steps else None
    fresh = vc is not None and vc == first
    if fresh:
        what += (f": the resumed run's is the scale the uninterrupted run started with (a fresh GradScaler's "
                 f"init_scale{', 2**16 by default' if vc == 65536.0 else ''})")
    for s, who, other in ((sc, "resumed", "uninterrupted"), (sa, "uninterrupted", "resumed")):
        t = sa if s is sc else sc
        if s.scalars.get("scaler_skipped") and not t.scalars.get("scaler_skipped"):
            what += (f"; the {who} run's GradScaler skipped this step's optimizer.step() (its scaled gradients "
                     f"overflowed), the {other} run's did not")
    return ("GradScaler", what, _scaler_why(saved, va, vc, fresh))


def _file_name(save: dict[str, Any], default: str) -> str:
    """The name of the file a noted save wrote (``default`` for a save to a buffer)."""
    return os.path.basename(save.get("file") or "") or default


def _file_names(saves: Any) -> str:
    """The names of the files the noted ``saves`` wrote, sorted, once each."""
    return ", ".join(sorted({_file_name(x, "an in-memory buffer") for x in saves}))


def _scaler_why(saved: tuple[dict[str, Any], ...], va: Any, vc: Any, fresh: bool) -> str:
    """Why the scales differ, from what the interrupted run saved after its last step (each save's
    ``scaler_scales``, ``runners.preempt_torch``): not saved, saved before ``scaler.update()``, or
    saved and not loaded; without that note, both are said."""
    fix = "save scaler.state_dict() with the checkpoint and load it on resume (scaler.load_state_dict)"
    starts = "starts again from its initial scale" if fresh else "starts from another scale"
    held = [x for x in saved if x.get("scaler_scales")]
    if held:
        name = _file_name(held[-1], "the checkpoint")
        scale = held[-1]["scaler_scales"][-1]
        if scale == va:
            return (f"the interrupted run saved {name} with the GradScaler's state (scale {scale!r}), yet the resumed "
                    f"run's scaler {starts}: the resume did not load it (scaler.load_state_dict), or built the "
                    "GradScaler again after loading it")
        if scale == vc:
            return (f"the interrupted run saved {name} with the GradScaler's scale {scale!r}, the one before that "
                    "step's scaler.update(): saved before the scaler updated; save after scaler.update()")
        return f"the GradScaler's state in {name} (scale {scale!r}) is not the one the run had: {fix}"
    noted = [x for x in saved if "scaler_scales" in x]
    if noted:
        names = _file_names(noted)
        return (f"the GradScaler's state was not saved: no file the interrupted run saved after its last step "
                f"({names}) holds it, so the resumed run's scaler {starts}; {fix}")
    return f"the GradScaler's state (scale, growth tracker) was not saved or not loaded: {fix}"


def _scaler_consequences(a: Trace, c: Trace, at: int, sa: Step, sc: Step) -> list[str]:
    """What follows from a GradScaler named at ``sa``: no learning rate recorded on a skipped step,
    and a later learning rate behind by the optimizer steps the resumed run's scaler skipped (a
    scheduler stepped only after a real optimizer step falls behind by them)."""
    out = []
    if _lr_unrecorded(sa, sc):
        who = "resumed" if _lr(sc) is None else "uninterrupted"
        out.append(f"no learning rate recorded at step {sa.step} in the {who} run, whose GradScaler skipped "
                   "optimizer.step(): a consequence of the scale, not a learning rate that differs")
    skipped = 0
    for yc in c.steps[c.steps.index(sc):]:
        ya = a.step(at + yc.step)
        if ya is None:
            break
        if yc is not sc and _lr(ya) is not None and _lr(yc) is not None and _lr(ya) != _lr(yc):
            lag = a.step(ya.step - skipped) if skipped > 0 else None
            tail = (f" = the uninterrupted run's at step {lag.step}: behind by the {skipped} optimizer step(s) the "
                    "resumed run's GradScaler skipped (a consequence, when the scheduler steps only after a real "
                    "optimizer step)") if lag is not None and _lr(lag) == _lr(yc) else ""
            out.append(f"learning rate at step {ya.step} {_lr(ya)!r} vs {_lr(yc)!r}{tail}")
            break
        skipped += int(bool(yc.scalars.get("scaler_skipped"))) - int(bool(ya.scalars.get("scaler_skipped")))
    return out


def _lr_lag(a: Trace, sa: Step, sc: Step) -> tuple[int, str] | None:
    """(+1/-1, what) when C's learning rate at A's step s is A's at step s-1 (the schedule one step
    behind) or s+1 (ahead) and not A's own; None: neither."""
    for e in (1, -1):
        other = a.step(sa.step - e)
        if other is not None and _lr(other) == _lr(sc) != _lr(sa):
            return e, (f"the uninterrupted run's learning rate at step {other.step}: the schedule is one step "
                       f"{'behind' if e > 0 else 'ahead'}")
    return None


def _data_at_own_step(a: Trace, sa: Step, sc: Step) -> str:
    """What C's step trained on (batch IDs, batches, model inputs) when it is exactly A's at the same
    step and not A's at the step before or after (so the data position is right and tells it
    apart from an off-by-one step counter); '' when not recorded, not equal or not telling."""
    kc = _data_key(sc)
    if kc is None or kc != _data_key(sa):
        return ""
    for near in (a.step(sa.step - 1), a.step(sa.step + 1)):
        if near is not None and _data_key(near) == kc:
            return ""
    return kc[0]


def _scheduler_timing(saved: tuple[dict[str, Any], ...]) -> tuple[str, str] | None:
    """(what, why) from what the interrupted run saved after its last step (``Reference.saved``):
    a scheduler saved before it stepped, saved as it was and not loaded, or not saved at all
    beside an optimizer a scheduler drives; None: no save seen (or none that tells)."""
    last = next((s for s in reversed(saved) if s.get("schedulers")), None)
    if last is None:
        return _scheduler_unsaved(saved)
    name = _file_name(last, "the checkpoint")
    sched = last["schedulers"][-1]
    n, k = last.get("optimizer_steps"), int(last.get("scheduler_steps_after") or 0)
    if k > 0:
        return (f"; the checkpoint's scheduler is {'one step' if k == 1 else f'{k} steps'} behind its optimizer",
                f"saved before the scheduler stepped, not unsaved: the interrupted run saved {name} after "
                f"{n} optimizer step(s) with the scheduler at last_epoch {sched.get('last_epoch')}, then called "
                f"scheduler.step() {k} more time(s) before the next step began; the resumed run's schedule is "
                f"{'one step' if k == 1 else f'{k} steps'} late. Save after scheduler.step() (or step the "
                "scheduler before the save)")
    return ("; the checkpoint holds the scheduler as it was after its last step",
            f"the interrupted run saved {name} after {n} optimizer step(s) with the scheduler's state up to date "
            f"(last_epoch {sched.get('last_epoch')}), yet the resumed run's learning rate differs: the resume did not "
            "load it (scheduler.load_state_dict), or built the scheduler again after loading the optimizer")


def _scheduler_unsaved(saved: tuple[dict[str, Any], ...]) -> tuple[str, str] | None:
    """(what, why) when the interrupted run's saves after its last step hold an optimizer that an LR
    scheduler drives (its param groups carry ``initial_lr``) and no scheduler state; None otherwise."""
    driven = [s for s in saved if s.get("scheduled_optimizer")]
    if not driven:
        return None
    names = _file_names(saved)
    return (f"; no file the interrupted run saved after its last step ({names}) holds a scheduler's state",
            f"the LR scheduler was not saved: the checkpoint holds the optimizer, whose param groups carry a "
            f"scheduler's initial_lr, but no scheduler state_dict, so the resumed run's scheduler counts its steps "
            "from zero. Save scheduler.state_dict() in the checkpoint and load it on resume")
