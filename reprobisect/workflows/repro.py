"""The library behind ``bisect probe`` and ``bisect repro``.

``probe_checkout`` probes the current checkout in place (as ``git bisect run`` has it:
git already checked the commit out, so no worktree) and judges it with one predicate,
giving git bisect's exit codes. ``run_repro`` runs the same command N times in the
user's folder (in parallel when the executor has several jobs) and compares every run to
the first: identical, or the first nondeterministic tensor.

Both return frozen result values (truthy when they pass, ``to_json()``); the commands
only render them.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprobisect.errors import ProbeError, UsageError
from reprobisect.executors import submit_all
from reprobisect.executors.base import ProbeResult, ProbeSpec
from reprobisect.core.options import ProbeOptions
from reprobisect.core.verdict import CHECKS, Verdict, classify
from reprobisect.core.verdict import compare_results as compare_traces
from reprobisect.executors.retry import retry as retry_once
from reprobisect.executors.retry import run_with_retry

__all__ = ["ProbeReport", "ReproResult", "probe_checkout", "run_repro", "render_repro", "result_json", "spec_for", "render_comparison"]


def result_json(r: ProbeResult) -> dict[str, Any]:
    """A ``ProbeResult`` as JSON (spec key + argv, outcome, trace, commit, host)."""
    return {
        "key": r.spec.key,
        "argv": list(r.spec.argv),
        "env": dict(r.spec.env),
        "python": r.spec.python,
        "outcome": r.outcome.to_json(),
        "trace": r.trace_dir,
        "commit": r.commit_ran,
        "host": r.host,
    }


def render_comparison(comp: Any) -> str:
    """Text for a comparison: ``reprobisect.render`` when it is there, else ``str``."""
    try:
        from reprobisect import render
    except ImportError:
        return str(comp)
    for name in ("render_comparison", "render_text", "render"):
        fn = getattr(render, name, None)
        if callable(fn):
            try:
                return str(fn(comp))
            except TypeError:
                continue
    return str(comp)


def spec_for(argv: list[str], options: ProbeOptions, *, key: str, workdir: str | os.PathLike | None = None,
             env: dict[str, str] | None = None, python: str | None = None) -> ProbeSpec:
    """A ``ProbeSpec`` running ``argv`` in ``workdir`` (default: the current folder) as is."""
    return ProbeSpec(
        key=key,
        argv=tuple(argv),
        workdir=str(Path(workdir or os.getcwd()).resolve()),
        env=dict(env or {}),
        python=python,
        steps=options.steps,
        full_steps=options.full_steps,
        timeout=options.timeout,
    )


def place(comp: Any) -> str | None:
    """``step S · kind · name`` of a comparison's first difference (None when identical)."""
    if comp is None or bool(comp):
        return None
    d = getattr(comp, "first", None)
    return f"step {d.step} · {d.kind} · {d.name}" if d is not None else "structure"


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

    def __bool__(self) -> bool:
        return bool(self.verdict)

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict.to_json(), "probe": result_json(self.result), "reference": self.reference}


def probe_checkout(argv: list[str], options: ProbeOptions, *, check: str | None = None,
                   reference: str | None = None, cwd: str | os.PathLike | None = None) -> ProbeReport:
    """Probe the checkout in ``cwd`` (default: here) once and judge it with ``check``.

    ``check`` defaults to ``match`` with a reference and is required otherwise. A
    timeout or infrastructure failure is retried once, then reported as ``skip``.
    Tolerance: ``options.tolerance_spec('bitwise')``.
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
        from reprobisect.trace.reader import read_trace

        read_trace(reference)  # a bad reference is the user's mistake: say so before probing
    tol = options.tolerance_spec("bitwise")
    tag = uuid.uuid4().hex[:8]
    with options.make_executor() as ex:
        first = run_with_retry(ex, spec_for(argv, options, key=f"probe-{tag}", workdir=cwd))
        if check == "repro":
            if not first.outcome or first.outcome.status not in ("ok",):
                second = first
                verdict = classify(first, "repro", reference=first, tolerance=tol)
            else:
                second = run_with_retry(ex, spec_for(argv, options, key=f"probe-{tag}-2", workdir=cwd))
                verdict = classify(second, "repro", reference=first, tolerance=tol)
        else:
            verdict = classify(first, check, reference=reference, tolerance=tol)
    return ProbeReport(verdict=verdict, result=first, reference=reference)


# --------------------------------------------------------------------------- repro


@dataclass(frozen=True)
class ReproResult:
    """N runs of one command compared to the first; truthy when all are identical."""

    runs: tuple[ProbeResult, ...]
    comparisons: tuple[Any, ...]
    """``comparisons[i]`` compares run 0 with run i+1 (``reprobisect.core.compare`` results)."""
    tolerance: Any
    hashseeds: tuple[str | None, ...] = ()
    """PYTHONHASHSEED given to each run (None: left as the user's environment has it)."""
    environment_set: dict[str, Any] = field(default_factory=dict)
    """What run 0's environment record says about determinism-relevant settings."""

    def __bool__(self) -> bool:
        return all(bool(c) for c in self.comparisons)

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
    def first_difference(self) -> tuple[int, Any] | None:
        """(run index, comparison) of the first run that differs from run 0, or None."""
        for i, c in enumerate(self.comparisons):
            if not c:
                return i + 1, c
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "deterministic": self.deterministic,
            "tolerance": self.tolerance,
            "runs": [result_json(r) for r in self.runs],
            "hashseeds": list(self.hashseeds),
            "environment_set": self.environment_set,
            "comparisons": [c.to_json() if hasattr(c, "to_json") else str(c) for c in self.comparisons],
            "places": list(self.places),
            "flakiness": self.flakiness or None,
        }


def _env_settings(trace_dir: str | None) -> dict[str, Any]:
    if not trace_dir:
        return {}
    from reprobisect.trace.reader import read_trace

    env = read_trace(trace_dir, allow_incomplete=True).manifest.environment
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


def run_repro(argv: list[str], options: ProbeOptions, *, runs: int = DEFAULT_RUNS, hashseed_differ: bool = False,
              cwd: str | os.PathLike | None = None) -> ReproResult:
    """Run ``argv`` ``runs`` times in ``cwd`` (default: here) and compare each run to the first.

    With ``hashseed_differ`` run i gets ``PYTHONHASHSEED=i`` (exposes set/dict-order
    bugs); otherwise the runs inherit the user's environment unchanged. Tolerance:
    ``options.tolerance_spec('bitwise')``. A run that cannot produce a trace (crash,
    skip, timeout) is a ``ProbeError``: there is nothing to compare.
    """
    if runs < 2:
        raise UsageError(f"--runs must be at least 2 (got {runs})")
    tol = options.tolerance_spec("bitwise")
    tag = uuid.uuid4().hex[:8]
    seeds: list[str | None] = [str(i) if hashseed_differ else None for i in range(runs)]
    specs = [
        spec_for(argv, options, key=f"repro-{tag}-run{i}", workdir=cwd,
                 env={"PYTHONHASHSEED": seeds[i]} if seeds[i] is not None else None)
        for i in range(runs)
    ]
    from reprobisect.support.progress import progress

    with options.make_executor() as ex, progress("repro", total=runs, quiet=options.quiet) as p:
        futures = submit_all(ex, specs)
        results = []
        for i, f in enumerate(futures):
            p.update(f"run {i}")
            results.append(retry_once(ex, f.result()))
            p.advance()
        if not all(r.outcome for r in results):
            crashed = next(r for r in results if not r.outcome)
            tail = crashed.last_lines(10)
            if tail and not options.quiet:  # what the command printed last (its output.log has it all)
                p.note(f"run '{crashed.spec.key}' ended {crashed.outcome.status}; its last output:\n"
                       + "\n".join(f"    | {ln}" for ln in tail.splitlines()))
            raise _failed(results, "cannot judge determinism")
        comps = tuple(compare_traces(results[0], r, tol) for r in results[1:])
        env_set = _env_settings(results[0].trace_dir)
    return ReproResult(runs=tuple(results), comparisons=comps, tolerance=tol, hashseeds=tuple(seeds), environment_set=env_set)


def render_repro(result: ReproResult) -> str:
    """Text for ``bisect repro``: the verdict, what the environment set, the first difference."""
    n = len(result.runs)
    lines: list[str] = []
    seeds = [s for s in result.hashseeds if s is not None]
    if seeds:
        lines.append(f"PYTHONHASHSEED per run: {', '.join(seeds)}")
    env_vars = result.environment_set.get("env_vars") or {}
    if env_vars:
        lines.append("environment set: " + ", ".join(f"{k}={v}" for k, v in sorted(env_vars.items())))
    if "PYTHONHASHSEED" not in env_vars:
        lines.append("PYTHONHASHSEED: unset (string hashing, and so set order, is randomised per run)")
    threads = result.environment_set.get("threads") or {}
    if threads:
        lines.append("threads: " + ", ".join(f"{k}={v}" for k, v in sorted(threads.items())))
    det = result.environment_set.get("determinism") or {}
    if det:
        lines.append("determinism: " + ", ".join(f"{k}={v}" for k, v in sorted(det.items()) if not isinstance(v, dict)))
    first = result.first_difference
    if first is None:
        steps = result.runs[0].spec.steps
        lines.append(f"deterministic: {n} runs identical over {steps} step(s) ({_tol_text(result)})")
    else:
        i, comp = first
        lines.append(f"NOT deterministic: run {i} differs from run 0 ({_tol_text(result)})")
        lines.append(render_comparison(comp))
        if result.flakiness:
            lines.append(f"note: {result.flakiness}")
        # hint: lines come with the comparison (reprobisect.core.hints: only what the evidence supports)
        if not all(r.trace_dir and Path(r.trace_dir).exists() for r in result.runs):
            lines.append("(the traces were temporary; pass --keep or -o DIR to keep them for bisect compare)")
    return "\n".join(lines)


def _tol_text(result: ReproResult) -> str:
    t = result.tolerance
    if isinstance(t, dict):
        return f"atol {t.get('atol', 0):g}, rtol {t.get('rtol', 0):g}"
    return str(t)
