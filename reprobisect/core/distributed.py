"""What only distributed runs get wrong, read from one multi-rank trace or one comparison.

``findings(traces)`` looks at the ranks of ONE trace (``{rank: Trace}``):

- **ranks out of sync**: in a DDP run every rank holds the same model after every step;
  the first step after which two ranks' parameters (or buffers: BatchNorm running
  statistics) differ is named, with the tensors: an unsynchronized buffer
  (``broadcast_buffers=False``, BatchNorm instead of SyncBatchNorm) or a parameter the
  wrapped module does not reduce;
- **missing and overlapping samples**: the ranks' ``DistributedSampler`` epochs (their
  index sets, noted by ``runners.distributed_torch.sampler_epoch``) together do not draw
  the dataset once: how many samples no rank draws and how many draws repeat another
  rank's (the sampler's own padding aside), and why, from the samplers' settings (a
  per-rank seed; a ``num_replicas``/``rank`` that is not the process's);
- **overlapping samples**: two ranks drew the same sample IDs in one step: the sampler
  does not partition the data (a ``DistributedSampler`` seeded per rank, or no
  ``DistributedSampler`` at all);
- **the same order every epoch**: a rank's shuffled sample order repeats exactly from one
  epoch to the next (``DistributedSampler.set_epoch`` never called).

``rank_local_hints(per_rank)`` reads a comparison rank by rank: a difference that starts
on exactly one rank at a step where the others only receive it through a collective (or
agree) points at something that rank does alone (a rank-local random source that is not
seeded).

``rerun_unsupported`` says why a workflow that re-runs a command with the launcher's
per-process options (the zoom, the sentinel escalation's replays) cannot re-run a
multi-rank trace's command yet: an inconclusive answer instead of a wrong one.

Core module: no ML framework.
"""

from __future__ import annotations

from typing import Any, Mapping

from reprobisect.trace.reader import Trace

__all__ = ["findings", "rank_local_hints", "is_ddp", "rerun_unsupported"]

_SHOWN = 3


def rerun_unsupported(what: str, *trace_dirs: Any) -> str | None:
    """Why ``what`` (``replay``, ``zoom``) cannot re-run the traces at ``trace_dirs``, or None.

    A multi-rank trace (one shard per rank) records a command that starts its ranks
    itself (torchrun, a job script); re-running it with the launcher's per-process options
    (``--replay-from``, ``--zoom-module``) is not implemented: the bootstrap that records
    the ranks does not pass them on, so the re-run would record the run from its start
    instead. Saying so beats a wrong answer.
    """
    from reprobisect.trace import ranks

    for d in trace_dirs:
        if d is None:
            continue
        try:
            multi = ranks.is_multi_rank(d)
        except OSError:
            multi = False
        if multi:
            try:
                world = ranks.world_size_of(d)
            except Exception:
                world = len(ranks.shard_ranks(d))
            return (f"inconclusive: {what} of a distributed run is not supported yet (trace '{d}' holds one shard "
                    f"per rank, {world} ranks; the ranks' records are compared as they are: see the comparison)")
    return None


def is_ddp(t: Trace) -> bool:
    """The trace holds DDP gradient-bucket collectives (every rank should hold the same model)."""
    for s in t.steps[:2]:
        for r in s.records:
            if r.kind == "collective" and (r.meta or {}).get("op") == "ddp_allreduce":
                return True
    return False


def _desync(traces: Mapping[int, Trace]) -> str | None:
    ranks = sorted(traces)
    if len(ranks) < 2 or not all(is_ddp(traces[r]) for r in ranks):
        return None
    base = traces[ranks[0]]
    for s0 in base.steps:
        ref = {r.key: r for r in s0.records if r.kind in ("init", "param")}
        for other in ranks[1:]:
            so = traces[other].step(s0.step)
            if so is None:
                continue
            diff = [r for r in so.records if r.kind in ("init", "param") and r.key in ref
                    and ref[r.key].fingerprint != r.fingerprint]
            if not diff:
                continue
            buffers = [r for r in diff if (r.meta or {}).get("buffer")]
            params = [r for r in diff if not (r.meta or {}).get("buffer")]
            shown = ", ".join(f"'{r.name}'" + (" (buffer)" if (r.meta or {}).get("buffer") else "")
                              for r in (buffers + params)[:_SHOWN])
            more = f" and {len(diff) - _SHOWN} more" if len(diff) > _SHOWN else ""
            when = "before the first update" if diff[0].kind == "init" else f"after step {s0.step}"
            why = ("unsynchronized buffers: BatchNorm running statistics drift apart when DDP does not broadcast "
                   "buffers (broadcast_buffers=False) and each rank sees different data; use SyncBatchNorm or "
                   "keep broadcast_buffers=True" if not params else
                   "a parameter DDP does not reduce (outside the wrapped module, or updated outside the optimizer "
                   "step) or a rank-local change to the weights")
            return (f"ranks {ranks[0]} and {other} hold different models {when} ({len(diff)} tensor(s): {shown}{more}); "
                    f"DDP keeps every rank's model identical, so the invariant is broken: {why}")
    return None


def _overlap(traces: Mapping[int, Trace]) -> str | None:
    ranks = sorted(traces)
    if len(ranks) < 2:
        return None
    for s0 in traces[ranks[0]].steps:
        drawn = {}
        for r in ranks:
            s = traces[r].step(s0.step)
            if s is not None and s.batch_ids:
                drawn[r] = set(_flat(s.batch_ids))
        for i, a in enumerate(sorted(drawn)):
            for b in sorted(drawn)[i + 1:]:
                shared = sorted(drawn[a] & drawn[b], key=str)
                if shared:
                    ex = ", ".join(map(str, shared[:_SHOWN]))
                    return (f"ranks {a} and {b} drew overlapping samples at step {s0.step} ({len(shared)} shared "
                            f"sample ID(s), e.g. {ex}): the sampler does not partition the data across ranks (a "
                            "DistributedSampler seeded differently per rank or given another rank, or no DistributedSampler)")
    return None


def _flat(ids: Any) -> list[Any]:
    out: list[Any] = []
    for x in ids if isinstance(ids, list) else [ids]:
        out.extend(_flat(x) if isinstance(x, list) else [x])
    return out


def _same_epoch_order(traces: Mapping[int, Trace]) -> str | None:
    for r in sorted(traces):
        seq = [_flat(s.batch_ids) for s in traces[r].steps if s.batch_ids]
        ids = [i for b in seq for i in b]
        for period in range(1, len(seq) // 2 + 1):
            first = [i for b in seq[:period] for i in b]
            if len(set(first)) != len(first) or first == sorted(first, key=str):
                continue  # not one shuffled pass
            nxt = [i for b in seq[period:2 * period] for i in b]
            if nxt == first and set(ids[len(first):]) <= set(first):
                return (f"rank {r} draws the same shuffled sample order every epoch (epoch of {period} step(s)); "
                        "call DistributedSampler.set_epoch(epoch) at the start of each epoch")
    return None


def _samplers(t: Trace) -> list[dict[str, Any]]:
    notes = t.manifest.extra.get("samplers") if isinstance(t.manifest.extra, dict) else None
    return [n for n in notes if isinstance(n, dict)] if isinstance(notes, list) else []


def _popcount(hexbits: str) -> tuple[int, int]:
    """(the bitmap as an int, how many bits are set)."""
    v = int.from_bytes(bytes.fromhex(hexbits), "little") if hexbits else 0
    return v, bin(v).count("1")


def _sampler_cause(notes: Mapping[int, dict[str, Any]], world: int) -> str:
    """Why the ranks' samplers of one epoch do not partition the data, from their settings."""
    wrong = [(r, n) for r, n in sorted(notes.items()) if n.get("num_replicas") != world or n.get("rank") != r]
    if wrong:
        r, n = wrong[0]
        return (f"rank {r}'s DistributedSampler says num_replicas={n.get('num_replicas')}, rank={n.get('rank')} in a run "
                f"of world size {world}: pass num_replicas=world_size and rank=the process's rank (or leave both unset)")
    seeds = {r: n.get("seed") for r, n in sorted(notes.items())}
    if len(set(seeds.values())) > 1 and any(n.get("shuffle") for n in notes.values()):
        said = ", ".join(f"rank {r}: seed {v}" for r, v in list(seeds.items())[:_SHOWN])
        return (f"the ranks' DistributedSamplers are seeded differently ({said}): each shuffles its own permutation; "
                "give every rank the same seed")
    return "the samplers' index sets do not partition the dataset"


def _coverage(traces: Mapping[int, Trace]) -> str | None:
    """Missing and overlapping samples of one DistributedSampler epoch across all ranks
    (``runners.distributed_torch.sampler_epoch`` notes each rank's index set)."""
    ranks = sorted(traces)
    world = len(ranks)
    if ranks != list(range(world)):
        return None
    by_epoch: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for r in ranks:
        for n in _samplers(traces[r]):
            by_epoch.setdefault((n.get("sampler", 0), n.get("epoch", 0)), {}).setdefault(r, n)
    for (k, epoch), notes in sorted(by_epoch.items()):
        if sorted(notes) != ranks:
            continue
        size = {n.get("dataset_len") for n in notes.values()}
        if len(size) != 1:
            continue
        total = size.pop()
        step = min(int(n.get("step", 0)) for n in notes.values())
        cause = _sampler_cause(notes, world)
        where = f"epoch {epoch} (from step {step}, sampler {k}), ranks {ranks[0]}-{ranks[-1]}"
        if not all(isinstance(n.get("indices"), str) for n in notes.values()):
            if cause.startswith("the samplers'"):
                continue
            return f"the ranks do not draw the dataset once between them in {where}: {cause} (not counted: dataset too large)"
        union, drawn = 0, 0
        for n in notes.values():
            v, _c = _popcount(n["indices"])
            union |= v
            drawn += int(n.get("drawn", 0))
        covered = bin(union).count("1")
        one = notes[0]
        planned = int(one.get("total_size", total))
        dropped = max(total - planned, 0) if one.get("drop_last") else 0  # drop_last trims the tail
        padded = max(planned - total, 0) if not one.get("drop_last") else 0  # else the head is repeated
        missing = total - covered - dropped
        overlap = drawn - covered - padded
        if missing <= 0 and overlap <= 0:
            continue
        return (f"the ranks do not draw the dataset once between them in {where}: {max(missing, 0)} of {total} samples "
                f"are drawn by no rank (missing) and {max(overlap, 0)} draw(s) repeat a sample another rank draws "
                f"(overlap): {cause}")
    return None


def findings(traces: Mapping[int, Trace]) -> list[str]:
    """What the ranks of ONE trace show about the run (see the module docstring), in words."""
    if len(traces) < 2:
        return []
    out = []
    for check in (_desync, _coverage, _overlap, _same_epoch_order):
        try:  # a finding is a courtesy: never lose the comparison over one
            said = check(traces)
        except Exception:
            said = None
        if said:
            out.append(said)
    return out


def rank_local_hints(per_rank: Mapping[int, Any]) -> list[str]:
    """A hint when the difference starts on one rank only (the others receive it through a
    collective, or agree) -- ``per_rank`` is ``{rank: Comparison}``."""
    if len(per_rank) < 2:
        return []
    firsts = {r: c.first for r, c in per_rank.items() if c.first is not None}
    if not firsts:
        return []
    step = min(d.step for d in firsts.values())
    own = [r for r, d in firsts.items() if d.step == step and d.localization != "arrival"]
    if len(own) != 1:
        return []
    r = own[0]
    others = sorted(set(per_rank) - {r})
    how = ("receive it through a collective" if any(firsts.get(o) is not None and firsts[o].step == step for o in others)
           else "agree")
    text = (f"the difference starts on rank {r} only (at step {step}; rank(s) {', '.join(map(str, others))} {how}): "
            f"look for what rank {r} does alone")
    if step == 0:
        text += " -- a rank-local random source that is not seeded (noise, dropout or augmentation drawn from an " \
                "unseeded or per-rank generator)"
    return [text]
