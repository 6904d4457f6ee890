"""The library behind ``bisect probe`` and ``bisect repro``.

``probe_checkout`` probes the current checkout in place (as ``git bisect run`` has it:
git already checked the commit out, so no worktree) and judges it with one predicate,
giving git bisect's exit codes. ``run_repro`` runs the same command N times in the
user's folder (in parallel when the executor has several jobs) and compares every run to
the first: identical, or the first nondeterministic tensor; when they differ, it tests the
candidate causes by re-running the pair with each held fixed (``reprobisect.workflows.confirm``).

Both return frozen result values (truthy when they pass); the commands render them
with ``reprobisect.render.repro`` (text and ``--json``).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprobisect.errors import ProbeError, UsageError
from reprobisect.core.compare import Tolerance
from reprobisect.executors import executor_for, submit_all
from reprobisect.executors.base import ProbeResult, ProbeSpec
from reprobisect.core.compare import Comparison
from reprobisect.core.options import ProbeOptions
from reprobisect.core.verdict import CHECKS, Verdict, classify, compare_results
from reprobisect.executors.anycommand import port_in_use
from reprobisect.executors.retry import retry, run_with_retry
from reprobisect.render.runs import divergence_place
from reprobisect.workflows.confirm import Confirmation, confirm_causes, untested
from reprobisect.workflows.escalate import Escalation, escalate, escalate_or_why, not_replayable
from reprobisect.core.hints import cause_candidates
from reprobisect.support.progress import progress
from reprobisect.trace.ranks import open_ranks, read_rank0

__all__ = ["ProbeReport", "ReproResult", "probe_checkout", "run_repro", "spec_for"]


def spec_for(argv: list[str], options: ProbeOptions, *, key: str, workdir: str | os.PathLike | None = None,
             env: dict[str, str] | None = None, python: str | None = None) -> ProbeSpec:
    """A ``ProbeSpec`` running ``argv`` in ``workdir`` (default: the current folder) as is.

    Its environment: ``options.env`` with ``env`` over it."""
    return ProbeSpec(
        key=key,
        argv=tuple(argv),
        workdir=str(Path(workdir or os.getcwd()).resolve()),
        env={**options.env, **(env or {})},
        python=python,
        steps=options.steps,
        full_steps=options.full_steps,
        timeout=options.timeout,
        **options.launch_fields(),
    )


def place(comp: Comparison | None) -> str | None:
    """``step S · kind · name`` of a comparison's first difference (None when identical;
    ``'structure'`` when only the traces' structure differs)."""
    return divergence_place(comp, structure_only="structure")


def _failed(results: list[ProbeResult], what: str) -> ProbeError:
    r = next(r for r in results if not r.outcome)
    msg = f"{what}: run '{r.spec.key}' ended {r.outcome}"
    if not r.outcome.detail:
        tail = [ln.strip() for ln in r.stderr_tail.strip().splitlines() if ln.strip()][-1:]
        if tail:
            msg += f" ({tail[0][:200]})"
    return ProbeError(msg)


# --------------------------------------------------------------------------- probe


@dataclass(frozen=True)
class ProbeReport:
    """One probe of the current checkout and its verdict (truthy when good)."""

    verdict: Verdict
    result: ProbeResult
    reference: str | None = None
    escalation: Escalation | None = None
    """With ``--detail sentinel`` and a bad verdict: the full chain at the first difference, from
    replays of both runs (``--check repro``), or why there is none (``--check match``: the
    reference trace is another run's, which cannot be replayed here)."""

    def __bool__(self) -> bool:
        return bool(self.verdict)

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def probe_checkout(argv: list[str], options: ProbeOptions, *, check: str | None = None,
                   reference: str | None = None, cwd: str | os.PathLike | None = None) -> ProbeReport:
    """Probe the checkout in ``cwd`` (default: here) once and judge it with ``check``.

    ``check`` defaults to ``match`` with a reference and is required otherwise. A
    timeout or infrastructure failure is retried once, then reported as ``skip``.
    Tolerance: ``options.tolerance_for('bitwise')``.
    """
    if check is None:
        if reference is None:
            raise UsageError("give --reference TRACE (a trace of the good run) or --check repro|finite")
        check = "match"
    if check not in CHECKS:
        raise UsageError(f"unknown check '{check}'; use --check match, repro or finite")
    if check == "match" and reference is None:
        raise UsageError("--check match needs --reference TRACE (a trace of the good run, from bisect capture)")
    if reference is not None:
        # a bad reference is the user's mistake: say so before probing. Verified whole (every
        # file's SHA-256, nothing unlisted, every shard against its records): it decides the verdict
        open_ranks(reference, verify=True)
    tol = options.tolerance_for("bitwise")
    tag = uuid.uuid4().hex[:8]
    esc: Escalation | None = None
    with executor_for(options) as ex:
        first = run_with_retry(ex, spec_for(argv, options, key=f"probe-{tag}", workdir=cwd))
        if check == "repro":
            if not first.outcome or first.outcome.status not in ("ok",):
                second = first
                verdict = classify(first, "repro", reference=first, tolerance=tol)
            else:
                second = run_with_retry(ex, spec_for(argv, options, key=f"probe-{tag}-2", workdir=cwd))
                verdict = classify(second, "repro", reference=first, tolerance=tol)
                esc = escalate_or_why(verdict.comparison, first, second, ex, tol)
        else:
            verdict = classify(first, check, reference=reference, tolerance=tol)
            esc = not_replayable(verdict.comparison, _REFERENCE_NOT_REPLAYED)
    return ProbeReport(verdict=verdict, result=first, reference=reference, escalation=esc)


_REFERENCE_NOT_REPLAYED = (
    "the reference trace is another run's (maybe of another commit) and cannot be replayed from this checkout; "
    "let bisect runs replay both commits, or capture the reference and probe with --detail full")


# --------------------------------------------------------------------------- repro


@dataclass(frozen=True)
class ReproResult:
    """N runs of one command compared to the first; truthy when all are identical."""

    runs: tuple[ProbeResult, ...]
    comparisons: tuple[Comparison, ...]
    """``comparisons[i]`` compares run 0 with run i+1 (``reprobisect.core.compare`` results)."""
    tolerance: Tolerance
    hashseeds: tuple[str | None, ...] = ()
    """PYTHONHASHSEED given to each run (None: left as the user's environment has it)."""
    environment_set: dict[str, Any] = field(default_factory=dict)
    """What run 0's environment record says about determinism-relevant settings."""
    escalation: Escalation | None = None
    """With ``--detail sentinel``: the full chain at the first difference, from replays
    (``reprobisect.workflows.escalate``); None when the runs agree or recorded full detail."""
    confirmations: tuple[Confirmation, ...] = ()
    """When the runs differ: each candidate cause and what re-running the pair with it held
    fixed showed (``reprobisect.workflows.confirm``), in the order tried; untested ones
    (``--no-confirm``, the cap) are questions. Empty when the runs agree or nothing is a candidate."""
    superseded_hints: tuple[str, ...] = ()
    """The comparison's hints whose candidate was never tried because one tried before it was
    confirmed: a question the confirmed cause answers (the renderer drops them)."""

    def __bool__(self) -> bool:
        return all(bool(c) for c in self.comparisons)

    @property
    def confirmed(self) -> Confirmation | None:
        """The candidate cause a re-run confirmed, or None."""
        return next((c for c in self.confirmations if c), None)

    @property
    def deterministic(self) -> bool:
        return bool(self)

    @property
    def places(self) -> tuple[str | None, ...]:
        """Where each run first differs from run 0 (None: identical), for runs 1..N-1."""
        return tuple(place(c) for c in self.comparisons)

    @property
    def flakiness(self) -> str:
        """Why one comparison does not tell the whole story: the first difference moves
        between runs, or only some runs differ ('' when neither)."""
        places = self.places
        differing = [(i + 1, w) for i, w in enumerate(places) if w]
        if not differing:
            return ""
        if len({w for _, w in differing}) > 1:
            where = ", ".join(f"{w} (run {i})" for i, w in differing)
            return (f"the first difference moves between runs ({where}): the nondeterminism is not at one fixed "
                    "place, so fix what is common to these places (or the earliest), then run again")
        if len(differing) < len(places):
            return (f"only {len(differing)} of {len(places)} runs differ from run 0: the nondeterminism does not "
                    "show in every run, so fewer runs could miss it; use --runs 5 or more to confirm a fix")
        return ""

    @property
    def first_difference(self) -> tuple[int, Comparison] | None:
        """(run index, comparison) of the first run that differs from run 0, or None."""
        for i, c in enumerate(self.comparisons):
            if not c:
                return i + 1, c
        return None


def _env_settings(trace_dir: str | None) -> dict[str, Any]:
    if not trace_dir:
        return {}
    env = read_rank0(trace_dir, allow_incomplete=True).manifest.environment
    out: dict[str, Any] = {}
    for k in ("env_vars", "determinism"):
        if isinstance(env.get(k), dict):
            out[k] = env[k]
    th = (env.get("torch") or {}) if isinstance(env.get("torch"), dict) else {}
    for k, v in th.items():
        if "thread" in k:
            out.setdefault("threads", {})[k] = v
    return out


DEFAULT_RUNS = 3
"""Runs ``repro`` compares by default: two runs miss nondeterminism that shows in some runs
only (measured: a script whose difference shows in about half its runs was missed twice by
two runs; three caught it)."""


DEFAULT_CONFIRM_MAX = 3
"""Candidate causes ``repro`` tests at most (two runs each) unless told otherwise."""


def run_repro(argv: list[str], options: ProbeOptions, *, runs: int = DEFAULT_RUNS, hashseed_differ: bool = False,
              cwd: str | os.PathLike | None = None, confirm: bool = False,
              confirm_max: int = DEFAULT_CONFIRM_MAX) -> ReproResult:
    """Run ``argv`` ``runs`` times in ``cwd`` (default: here) and compare each run to the first.

    With ``hashseed_differ`` run i gets ``PYTHONHASHSEED=i`` (exposes set/dict-order
    bugs); otherwise the runs inherit the user's environment unchanged. Tolerance:
    ``options.tolerance_for('bitwise')``. A run that cannot produce a trace (crash,
    skip, timeout) is a ``ProbeError``: there is nothing to compare.

    When the runs differ, the candidate causes (``cause_candidates``) are tested, at most
    ``confirm_max`` of them, two more runs each (``reprobisect.workflows.confirm``); with
    ``confirm`` False (the library's default: the doctor and audits keep their cost; ``bisect
    repro`` confirms unless ``--no-confirm``) they are only named, as questions with the check to make.
    """
    if runs < 2:
        raise UsageError(f"--runs must be at least 2 (got {runs})")
    if confirm_max < 0:
        raise UsageError(f"--confirm-max must be 0 or more (got {confirm_max})")
    tol = options.tolerance_for("bitwise")
    tag = uuid.uuid4().hex[:8]
    seeds: list[str | None] = [str(i) if hashseed_differ else None for i in range(runs)]
    specs = [
        spec_for(argv, options, key=f"repro-{tag}-run{i}", workdir=cwd,
                 env={"PYTHONHASHSEED": seeds[i]} if seeds[i] is not None else None)
        for i in range(runs)
    ]
    with executor_for(options) as ex, progress("repro", total=runs, quiet=options.quiet) as p:
        futures = submit_all(ex, specs)
        results = []
        for i, f in enumerate(futures):
            p.update(f"run {i}")
            r = f.result()
            results.append(r if port_in_use(r.outcome) else retry(ex, r))
            p.advance()
        # a run whose rendezvous port another run held (a port fixed in the command, --jobs): again, alone
        results = [retry(ex, r) if port_in_use(r.outcome) else r for r in results]
        if not all(r.outcome for r in results):
            crashed = next(r for r in results if not r.outcome)
            tail = crashed.last_lines(10)
            if tail and not options.quiet:  # what the command printed last (its output.log has it all)
                p.note(f"run '{crashed.spec.key}' ended {crashed.outcome.status}; its last output:\n"
                       + "\n".join(f"    | {ln}" for ln in tail.splitlines()))
            raise _failed(results, "cannot judge determinism")
        comps = tuple(compare_results(results[0], r, tol) for r in results[1:])
        env_set = _env_settings(results[0].trace_dir)
        first = next((i for i, c in enumerate(comps) if not c), None)
        esc = escalate(comps[first], results[0], results[first + 1], ex, tol) if first is not None else None
        found, moot = ((), ()) if first is None else _causes(
            (results[0], results[first + 1]), comps[first], ex, tol, confirm=confirm, confirm_max=confirm_max,
            note=None if options.quiet else p.note)
    return ReproResult(runs=tuple(results), comparisons=comps, tolerance=tol, hashseeds=tuple(seeds),
                       environment_set=env_set, escalation=esc, confirmations=found, superseded_hints=moot)


def _causes(pair: tuple[ProbeResult, ProbeResult], comp: Comparison, ex: Any, tol: Tolerance, *, confirm: bool,
            confirm_max: int, note: Any) -> tuple[tuple[Confirmation, ...], tuple[str, ...]]:
    """The candidate causes of ``pair``'s difference, tested unless ``confirm`` is False, and the
    hints of those left untried because an earlier one was confirmed."""
    ta = read_rank0(pair[0].trace_dir, allow_incomplete=True)
    tb = read_rank0(pair[1].trace_dir, allow_incomplete=True)
    candidates = cause_candidates(ta, tb, comp, same_command=True)
    where = place(comp)
    if not confirm:
        return tuple(untested(c, pair[0].spec.argv, "not tried", where) for c in candidates), ()
    found = confirm_causes(pair, candidates, ex, tol, max_tries=confirm_max, original=where, note=note)
    if not any(found):
        return found, ()
    return found, tuple(c.hint for c in candidates[len(found):] if c.hint)
