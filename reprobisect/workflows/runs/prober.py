"""One judged probe of ``bisect runs``: run a commit on the executor, judge it, cache it.

``Prober.judge`` answers good / bad / skip for one commit (before the terms are applied):
from the cache when this probe ran before, else by running it (timeouts and infrastructure
failures re-run ``retries`` times; with ``repeat`` R, R runs that must agree) and judging
the result with ``reprobisect.core.verdict.classify`` against the reference trace.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from reprobisect.core.verdict import classify
from reprobisect.executors.anycommand import port_in_use
from reprobisect.executors.retry import retry
from reprobisect.core.session import ResultCache, cache_key, probe_environment
from reprobisect.executors.base import Executor, ProbeResult, ProbeSpec
from reprobisect.render.runs import divergence_place, verdict_reason
from reprobisect.vcs.dvc import data_mode, data_skip
from reprobisect.workflows.runs.result import RunsConfig

__all__ = ["Judged", "Prober"]

"""Outcomes of a probe killed from outside (a timeout, a lost worker): not facts about the
code, so re-run ``retries`` times and never cached."""

# (verdict, reason, result, place of the first divergence the verdict rests on or None)
_Run = tuple[str, str, ProbeResult, str | None]


@dataclass(frozen=True)
class Judged:
    """One commit, judged."""

    commit: str
    verdict: str  # good | bad | skip, predicate-level (before term inversion)
    reason: str
    outcome: dict[str, Any] | None
    trace: str | None
    runs: int
    cached: bool
    wall_s: float
    place: str | None = None
    """Where the first divergence this verdict rests on is (``step S · kind · name``), if any."""
    output_tail: str = ""
    """The last lines of the command's output when the probe crashed."""


class _Gate:
    """Probes run side by side (``shared``), or one alone once the others ended (``alone``);
    a waiting ``alone`` holds new ``shared`` entries back so it is not starved."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._running = 0
        self._alone = 0  # waiting or running alone

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cv:
            self._cv.wait_for(lambda: self._alone == 0)
            self._running += 1
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                self._cv.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._cv:
            self._alone += 1
            self._cv.wait_for(lambda: self._running == 0)
            self._running += 1
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                self._alone -= 1
                self._cv.notify_all()


class Prober:
    """Runs and judges probes of one session (thread-safe: controller threads call ``judge``)."""

    def __init__(self, cfg: RunsConfig, repo: Path, subdir: str, executor: Executor, cache: ResultCache,
                 tolerance: Any) -> None:
        self.cfg = cfg
        self.repo = repo
        self.subdir = subdir
        self.executor = executor
        self.cache = cache
        self.tolerance = tolerance
        self.reference: str | None = None  # good commit's trace (match)
        self.reference_commit: str | None = None
        self.env = probe_environment(env=cfg.env)
        self.links: tuple[str, ...] = ()  # --link paths, checked (git.check_links)
        self.data = data_mode(repo / subdir, cfg.env)  # DVC data restored in each probe (vcs.dvc)
        self._counter = 0
        self._lock = threading.Lock()
        self.runs = 0
        self.stopping = False
        self._gate = _Gate()

    def key(self, commit: str, full_steps: tuple[int, ...] | None = None) -> str:
        """The cache key of a probe of ``commit`` in this session."""
        o = self.cfg.options
        return cache_key(
            commit=commit,
            command=list(self.cfg.command),
            subdir=self.subdir,
            env=self.env,
            steps=o.steps,
            full_steps=list(o.full_steps if full_steps is None else full_steps),
            check=self.cfg.check,
            tolerance=self.tolerance,
            repeat=self.cfg.repeat,
            reference=self.reference_commit if self.cfg.check == "match" else None,
            **({"links": list(self.links)} if self.links else {}),  # linked data changes what a probe sees
            **({"data": self.data} if self.data else {}),
            **(o.launch_fields() if o.detail != "full" or o.state_every else {}),  # what a trace holds
        )

    def cached_trace(self, commit: str) -> str | None:
        """The cached trace of ``commit`` (None when it never ran or left none)."""
        hit = self.cache.get(self.key(commit))
        return str(hit.trace) if hit and hit.trace else None

    def judge(self, commit: str, *, use_cache: bool = True, full_steps: tuple[int, ...] | None = None) -> Judged:
        """``commit`` judged: from the cache (``use_cache``), else probed and cached."""
        t0 = time.monotonic()
        key = self.key(commit, full_steps)
        if use_cache:
            hit = self.cache.get(key)
            if hit is not None:
                place = hit.data.get("place")
                return Judged(commit, hit.verdict, hit.reason, hit.outcome, str(hit.trace) if hit.trace else None, 0,
                              True, 0.0, place=place if isinstance(place, str) else None)
        runs0 = self.runs
        verdict, reason, res, place = self._agreed(self._repeated(commit, full_steps))
        trace = res.trace_dir if res.trace_dir and Path(res.trace_dir, "manifest.json").is_file() else None
        outcome = res.outcome.to_json()
        entry = None
        if verdict != "skip" or not (res.outcome.retryable or data_skip(res.outcome.detail)):  # data may come
            entry = self.cache.put(key, verdict=verdict, reason=reason, outcome=outcome, trace=trace,
                                   extra={"commit": commit, "place": place})
        kept = str(entry.trace) if entry is not None and entry.trace else trace
        return Judged(commit, verdict, reason, outcome, kept, self.runs - runs0, False, round(time.monotonic() - t0, 3),
                      place=place, output_tail=res.last_lines(8) if res.outcome.status == "crashed" else "")

    def _repeated(self, commit: str, full_steps: tuple[int, ...] | None) -> list[_Run]:
        """``repeat`` judged runs of ``commit``; the repeats run side by side (the executor
        bounds how many really run at once)."""
        n = max(1, self.cfg.repeat)
        if n == 1:
            return [self._classify_one(commit, full_steps)]
        with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="repeat") as rp:
            return list(rp.map(lambda _: self._classify_one(commit, full_steps), range(n)))

    def _agreed(self, results: list[_Run]) -> _Run:
        """One verdict from the runs of a commit: theirs when they agree, else a ``flaky`` skip."""
        tested = [r[0] for r in results if r[0] != "skip"]
        # for 'match', where a commit diverges from the reference is a fact about its code;
        # for 'repro', a bad verdict *is* nondeterminism, whose place may move
        places = sorted({r[3] for r in results if r[0] == "bad" and r[3]}) if self.cfg.check == "match" else []
        if not tested:
            return results[0]
        if len(set(tested)) > 1:
            counts = ", ".join(f"{v} {tested.count(v)}" for v in sorted(set(tested)))
            return "skip", f"flaky: {counts} of {len(results)} runs", results[0][2], None
        if len(places) > 1:
            # every run differs, but each at another place: the verdict rests on noise
            return ("skip", f"flaky: all {len(results)} runs differ, but the first divergence moves "
                    f"between them ({'; '.join(places)})", results[0][2], None)
        return next(r for r in results if r[0] != "skip")

    def _classify_one(self, commit: str, full_steps: tuple[int, ...] | None = None) -> _Run:
        """(verdict, reason, result, place of the first divergence the verdict rests on or None)."""
        v, reason, res = self._classify_raw(commit, full_steps)
        if isinstance(v, str):  # decided without a comparison
            return v, reason, res, None
        return v.verdict, verdict_reason(v), res, divergence_place(getattr(v, "comparison", None), structure_only=None)

    def _classify_raw(self, commit: str, full_steps: tuple[int, ...] | None = None) -> tuple[Any, str, ProbeResult]:
        """(a ``Verdict``, or a verdict string with its reason, and the result)."""
        res = self._run_once(commit, full_steps)
        if res.commit_ran and res.commit_ran != commit:
            return "skip", f"the probe ran {res.commit_ran[:10]}, not {commit[:10]} (stale checkout)", res
        if self.cfg.check == "repro":
            other = self._run_once(commit, full_steps)
            v = classify(res, "repro", reference=other, tolerance=self.tolerance)
        elif self.cfg.check == "match" and self.reference is not None:
            v = classify(res, "match", reference=self.reference, tolerance=self.tolerance)
        elif self.cfg.check == "match":
            # the reference itself: good when it produced a trace at all
            if res.outcome.status == "ok":
                return "good", "recorded the reference trace", res
            v = classify(res, "finite")  # skip / crashed → bad, with the outcome as the reason
            if v.verdict == "good":
                return "good", "recorded the reference trace", res
        else:
            v = classify(res, self.cfg.check, tolerance=self.tolerance)
        return v, "", res

    def _run_once(self, commit: str, full_steps: tuple[int, ...] | None = None) -> ProbeResult:
        """One probe with infrastructure retries (timeout / infra re-run ``retries`` times).

        A probe whose rendezvous port was taken (a port fixed in the command, two probes at
        once under ``--jobs``) is retried alone: once no other probe of this search runs."""
        spec = self._spec(commit, full_steps)
        with self._gate.shared():
            self._count_run()
            res = self.executor.submit(spec).result()
            if not port_in_use(res.outcome):
                return retry(self.executor, res, self.cfg.retries, before_each=self._count_run)
        with self._gate.alone():
            return retry(self.executor, res, self.cfg.retries, before_each=self._count_run)

    def _count_run(self) -> None:
        if self.stopping:
            raise KeyboardInterrupt
        with self._lock:
            self.runs += 1

    def spec_for(self, commit: str) -> ProbeSpec:
        """A new probe of ``commit`` as this search runs them (the escalation replays it)."""
        return self._spec(commit)

    def _spec(self, commit: str, full_steps: tuple[int, ...] | None = None) -> ProbeSpec:
        with self._lock:
            self._counter += 1
            n = self._counter
        o = self.cfg.options
        return ProbeSpec(
            key=f"{commit[:12]}-{n}",
            argv=tuple(self.cfg.command),
            repo=str(self.repo),
            revision=commit,
            subdir=self.subdir,
            env=dict(self.cfg.env),
            steps=o.steps,
            full_steps=tuple(o.full_steps if full_steps is None else full_steps),
            stop_on_nonfinite=self.cfg.check == "finite",
            timeout=o.timeout,
            links=self.links,
            **o.launch_fields(),
        )
