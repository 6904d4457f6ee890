"""The ``bisect runs`` session: its phases, in the order they run.

``find_first_bad`` reads as the phases: ``open`` (resolve the revisions, lock the
repository, start or resume the session log) → ``verify_endpoints`` (``--good`` and
``--bad`` probe as their flags say) → ``search`` (K probes in flight on the executor, the
pure search marks their verdicts: ``reprobisect.core.search.Bisection``) → ``recheck``
(the culprit and its parent again, uncached) → ``answer`` (the commits, the first
divergence inside the culprit against its parent, the cost).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from reprobisect.core.envdiff import data_changes
from reprobisect.core.verdict import CHECKS, compare_results
from reprobisect.core.search import Bisection, SearchResult
from reprobisect.core.session import ResultCache, SessionEvent, SessionLog, cache_key
from reprobisect.errors import ProbeError, ReproError, UsageError
from reprobisect.executors import executor_for
from reprobisect.executors.base import Executor
from reprobisect.core.outcome import Outcome
from reprobisect.core.probe import ProbeResult
from reprobisect.render.runs import divergence_text, escalation_text, named, output_lines, place_text, probe_line, short
from reprobisect.support.progress import Progress
from reprobisect.vcs import git as _g
from reprobisect.workflows.runs.prober import Judged, Prober
from reprobisect.workflows.runs.result import DEFAULT_TERMS, CommitSummary, RunsConfig, RunsResult
from reprobisect.workflows.runs.resume import load_for_resume, session_path, unfinished
from reprobisect.workflows.escalate import escalate

__all__ = ["RunsSession", "find_first_bad"]


def find_first_bad(
    config: RunsConfig,
    *,
    executor: Executor | None = None,
    progress: Any = None,
    on_event: Callable[[SessionEvent], None] | None = None,
) -> RunsResult:
    """Search the history between ``config.good`` and ``config.bad`` for the first bad commit.

    ``executor``: where probes run (default: built from ``config.options``; closed at the
    end when built here). ``progress``: a ``reprobisect.support.progress.Progress`` to update
    (default: one is made unless ``options.quiet``). ``on_event``: called with every
    event appended to the session log (tests use it to interrupt a session).
    Raises ``UsageError`` for bad input and ``ProbeError`` when an endpoint does not probe
    the way its flag says.
    """
    session = RunsSession(config, executor=executor, progress=progress, on_event=on_event)
    with session.open():  # resolve the revisions, lock the repository, start the session log
        session.verify_endpoints()
        found = session.search()
        recheck = session.recheck(found)
        return session.answer(found, recheck)


def check_config(cfg: RunsConfig) -> None:
    """Refuse (one line) a configuration no search can run, before anything is read."""
    if not cfg.command:
        raise UsageError("give the training command after --, e.g. bisect runs --good G --bad B -- python train.py")
    if cfg.check not in CHECKS:
        raise UsageError(f"unknown check '{cfg.check}'; use --check match, repro or finite")
    if cfg.repeat < 1:
        raise UsageError(f"--repeat must be at least 1 (got {cfg.repeat})")
    terms = tuple(cfg.terms)
    if len(terms) != 2 or terms[0] == terms[1]:
        raise UsageError(f"--terms takes two different names, e.g. old,new (got {','.join(terms)})")


class RunsSession:
    """One ``bisect runs`` session; its methods are its phases, called in order."""

    def __init__(self, cfg: RunsConfig, *, executor: Executor | None = None, progress: Any = None,
                 on_event: Callable[[SessionEvent], None] | None = None) -> None:
        check_config(cfg)
        self.t0 = time.monotonic()
        self.cfg = cfg
        self.opts = cfg.options
        self.terms: tuple[str, str] = (cfg.terms[0], cfg.terms[1])
        self.tolerance = self.opts.tolerance_for("bitwise")
        self._given_executor = executor
        self._given_progress = progress
        self.on_event = on_event
        self.invert = False  # custom terms: True when --good probes bad (the good end's behaviour is "old")
        self.cached = 0  # verdicts taken from the cache or the resumed log
        self.replayed = 0
        self.traces: dict[str, str | None] = {}
        self.places: dict[str, str | None] = {}
        self.reasons: dict[str, str] = {}
        self.skipped: dict[str, str] = {}

    # ------------------------------------------------------------------ open

    @contextlib.contextmanager
    def open(self) -> Iterator["RunsSession"]:
        """Resolve the range and check a log to resume; then, for the session's life, hold
        the repository's lock, the session log, the executor, the progress line and the
        pool of controller threads. Whatever interrupts the session stops its probes."""
        self._resolve()
        if self.cfg.resume:  # fail early, before any executor starts; loaded again under the lock
            load_for_resume(self.log_path, self.header, self.points, self.terms, self.parents)
        with contextlib.ExitStack() as stack:
            what = f"bisect runs --good {self.cfg.good} --bad {self.cfg.bad}"
            stack.enter_context(_g.session_lock(self.info, timeout=self.cfg.lock_timeout, what=what,
                                                option="--lock-timeout", on_wait=None if self.opts.quiet else _say))
            # last out (after the executor removed this session's worktrees): a SIGKILL'd session's
            # leftovers that were still in use at the start (its orphaned probe) go now, not at the next start
            stack.callback(self._prune_stale)
            self.pool = stack.enter_context(cf.ThreadPoolExecutor(max_workers=max(1, self.opts.jobs),
                                                                  thread_name_prefix="runs"))
            stack.callback(self.pool.shutdown, wait=True, cancel_futures=True)
            executor = self._given_executor
            if executor is None:  # made here, closed here (kills running probes, removes worktrees)
                executor = stack.enter_context(contextlib.closing(executor_for(self.opts)))
            self.prober = Prober(self.cfg, self.top, self.subdir, executor, ResultCache(self.cache_dir / "cache"),
                                 self.tolerance)
            self.prober.links = self.links
            self._open_log()
            self.progress = self._given_progress
            if self.progress is None:
                self.progress = stack.enter_context(Progress(f"bisect runs ({self.cfg.check})", quiet=self.opts.quiet,
                                                                   lines=True))
            if self.replaced:
                self.progress.note(f"note: an unfinished session with these arguments ({self.replaced} probes) was "
                                   "replaced; --resume continues one instead (its verdicts stay cached)")
            try:
                yield self
            except BaseException:
                self.prober.stopping = True  # the controller threads start no further probe
                raise

    def _resolve(self) -> None:
        """The repository, the folder the command runs from, the range, the session's log."""
        cfg, opts = self.cfg, self.opts
        cwd = Path(cfg.cwd or os.getcwd()).resolve()
        self.info = _g.open_repo(cfg.repo if cfg.repo else cwd)
        self.top = self.info.root
        self.subdir = self.info.subdir
        if cfg.repo is not None:
            # the command runs from the user's folder when it lies inside the repository
            try:
                self.subdir = os.path.relpath(cwd, self.top) if cwd.is_relative_to(self.top) else "."
            except ValueError:
                self.subdir = "."
        self.links = _g.check_links(self.info, opts.link)
        self.good = _g.resolve(self.info, cfg.good)
        self.bad = _g.resolve(self.info, cfg.bad)
        # the revisions as the user typed them: git's messages name what was typed (HEAD), not a hash
        self.points, self.parents = _g.bisect_axis(self.info, cfg.good, cfg.bad, first_parent=cfg.first_parent)
        self.cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else self.info.common_dir / "reprobisect"
        terms = list(self.terms)
        session_id = cache_key(
            good=self.good, bad=self.bad, command=list(cfg.command), subdir=self.subdir, check=cfg.check,
            steps=opts.steps, first_parent=cfg.first_parent, terms=terms, repeat=cfg.repeat, tolerance=self.tolerance,
        )[:16]
        self.log_path = session_path(self.cache_dir, session_id)
        self.header = {
            "good": self.good, "bad": self.bad, "command": list(cfg.command), "subdir": self.subdir,
            "check": cfg.check, "steps": opts.steps, "first_parent": cfg.first_parent, "terms": terms,
            "repeat": cfg.repeat, "points": len(self.points), "repo": str(self.top),
        }

    def _open_log(self) -> None:
        """Clean up after killed sessions, then load the log to resume or start a new one
        (only while this session holds the repository's lock)."""
        # leftovers of SIGKILL'd sessions (worktrees of dead pids): cleaned on start (a fresh one
        # or --resume), also when every probe of this session comes from the cache
        self._prune_stale()
        self.replaced = 0
        if self.cfg.resume:
            self.log = load_for_resume(self.log_path, self.header, self.points, self.terms, self.parents)
        else:
            self.replaced = unfinished(self.log_path)
            self.log = SessionLog.create(self.log_path, self.header)
        self.logged = {(e.role, e.point): e for e in self.log.events}

    def _prune_stale(self) -> None:
        """Remove the worktrees of dead sessions that no live process works in
        (``prune_stale_worktrees``) and prune git's list; a courtesy that never fails the session."""
        try:
            _g.prune_stale_worktrees(self.info)
        except (OSError, ReproError):
            pass

    def _record(self, j: Judged, role: str, verdict: str, rnd: int | None = None) -> None:
        """Append a judged probe to the session log (fsynced) and tell ``on_event``."""
        ev = SessionEvent(point=j.commit, verdict=verdict, reason=j.reason, outcome=j.outcome,
                          attempts=max(1, j.runs), cached=j.cached, wall_s=j.wall_s, role=role, round=rnd)
        self.log.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def _as_term(self, v: str) -> str:
        """A predicate-level verdict as a search verdict (inverted when --good probes bad)."""
        if v == "skip" or not self.invert:
            return v
        return "good" if v == "bad" else "bad"

    # ------------------------------------------------------------------ verify endpoints

    def verify_endpoints(self) -> None:
        """--good first (it is the reference for 'match'), then --bad; refuse either when it
        does not probe the way its flag says."""
        cfg, terms, good, bad = self.cfg, self.terms, self.good, self.bad
        self.progress.phase("endpoints", 2, f"verifying --good {named(good, cfg.good)} and --bad {named(bad, cfg.bad)}")
        jg = self.prober.judge(good)
        self.cached += jg.cached
        self.progress.probed(None if jg.cached else jg.wall_s, f"--good {short(good)}: {jg.verdict}")
        if jg.verdict == "skip" or (terms == DEFAULT_TERMS and jg.verdict != "good"):
            if jg.output_tail:  # a crash: what the command printed last
                self.progress.note(output_lines(jg.output_tail))
            fix = "" if "--link" in jg.reason else "; pick a good revision where the command runs"
            raise ProbeError(f"--good {cfg.good} does not probe {terms[0]}: {jg.reason}{fix}")
        self.invert = jg.verdict == "bad"  # custom terms: the good end's behaviour is "old"
        if ("endpoint", good) not in self.logged:
            self._record(jg, "endpoint", "good")
        if cfg.check == "match":
            self.prober.reference = jg.trace
            self.prober.reference_commit = good
            if not jg.trace:
                raise ProbeError(f"--good {cfg.good} left no trace to compare against: {jg.reason}")
        jb = self.prober.judge(bad)
        self.cached += jb.cached
        self.progress.probed(None if jb.cached else jb.wall_s, f"--bad {short(bad)}: {jb.verdict}")
        vb = self._as_term(jb.verdict)
        if vb != "bad":
            what = "could not be tested" if vb == "skip" else f"probes {terms[0]} like --good"
            raise ProbeError(
                f"--bad {cfg.bad} does not probe {terms[1]}: it {what} ({jb.reason}); "
                "the change is not in this range, or the check/tolerance does not see it"
            )
        if ("endpoint", bad) not in self.logged:
            self._record(jb, "endpoint", "bad")
        self.traces.update({good: jg.trace, bad: jb.trace})
        self.places[bad] = jb.place
        self.reasons.update({good: jg.reason, bad: jb.reason})

    # ------------------------------------------------------------------ search

    def search(self) -> SearchResult:
        """Keep ``jobs`` probes in flight until the search has its answer."""
        bis = self._bisection()
        running: dict[cf.Future, str] = {}
        self.progress.phase("search", _expected_probes(len(bis.remaining())), f"{len(bis.remaining())} commits left")
        while not bis.done:
            free = self.opts.jobs - len(running)
            if free > 0:
                for p in bis.next(free):
                    running[self.pool.submit(self.prober.judge, p)] = p
            if not running:
                break
            self.progress.update(f"round {bis.result().rounds} · {len(bis.remaining())} commits left · probing "
                                 + ", ".join(short(p) for p in running.values()))
            done, _ = cf.wait(list(running), timeout=0.5, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                p = running.pop(fut)
                self._take(bis, p, fut.result())
            for p in bis.obsolete():
                bis.cancel(p)
        return bis.result()

    def _bisection(self) -> Bisection:
        """A new search, or the resumed one with the log's verdicts replayed."""
        if not self.cfg.resume:
            return Bisection(self.points, terms=self.terms, parents=self.parents)  # type: ignore[arg-type]
        try:
            bis = Bisection.replay(self.points, self.log.search_rounds(), terms=self.terms,  # type: ignore[arg-type]
                                   parents=self.parents)
        except ReproError as e:
            raise UsageError(f"the session log {self.log_path} cannot be replayed: {e}; "
                             "start afresh without --resume (or delete the log)") from None
        self.replayed = len(self.log.search_events())
        self.cached += self.replayed
        for e in self.log.events:
            if e.role == "search":
                self.reasons[e.point] = e.reason
                if e.verdict == "skip":
                    self.skipped[e.point] = e.reason
        return bis

    def _take(self, bis: Bisection, p: str, j: Judged) -> None:
        """Mark a finished probe in the search (unless the search no longer needs it), log it, say it."""
        self.cached += j.cached
        v = self._as_term(j.verdict)
        if p in bis.obsolete() or p not in bis.in_flight:
            bis.cancel(p)
            return
        bis.mark(p, v)
        self.traces[p] = j.trace
        self.reasons[p] = j.reason
        self.places[p] = j.place
        if v == "skip":
            self.skipped[p] = j.reason
        rnd = bis.log[-1].get("round") if bis.log and bis.log[-1].get("point") == p else None
        self._record(j, "search", v, rnd if isinstance(rnd, int) else None)
        self.progress.probed(None if j.cached else j.wall_s)
        self.progress.note(probe_line(p, v, self.terms, j.reason))
        if j.output_tail:  # a crash: what the command printed last
            self.progress.note(output_lines(j.output_tail))

    # ------------------------------------------------------------------ re-check

    def recheck(self, found: SearchResult) -> str:
        """Re-run the culprit and its parent, uncached: 'agreed', 'disagreed: ...' or 'skipped'."""
        if found.first_bad is None or not self.cfg.recheck:
            return "skipped"
        fb = found.first_bad
        parent = self._parent(fb)
        self.progress.phase("re-check", 2, f"re-checking {short(fb)} and its parent {short(parent)}")
        # keep full tensors at the step where the cached traces first differ, so the
        # answer can give real magnitudes (max abs / rel, mismatches, ULPs)
        full = tuple(self.cfg.options.full_steps)
        pre, _ = self._divergence(self.traces.get(parent) or self.prober.cached_trace(parent), self.traces.get(fb))
        if pre and pre.get("first") and isinstance(pre["first"].get("step"), int):
            full = tuple(sorted(set(full) | {pre["first"]["step"]}))
        futs = {self.pool.submit(self.prober.judge, c, use_cache=False, full_steps=full): c for c in (parent, fb)}
        again: dict[str, Judged] = {}
        for fut in cf.as_completed(futs):
            again[futs[fut]] = fut.result()
            self.progress.probed(again[futs[fut]].wall_s, f"{short(futs[fut])}: {again[futs[fut]].verdict}")
        for j in again.values():
            self._record(j, "recheck", self._as_term(j.verdict))
        vp, vf = self._as_term(again[parent].verdict), self._as_term(again[fb].verdict)
        moved = _moved(fb, [("the search", self.places.get(fb)), ("the re-check", again[fb].place)]) \
            if self.cfg.check == "match" else ""
        if vp == "good" and vf == "bad" and moved:
            return moved
        if vp == "good" and vf == "bad":
            self.traces[fb] = again[fb].trace or self.traces.get(fb)
            self.traces[parent] = again[parent].trace or self.traces.get(parent)
            self.places[fb] = again[fb].place or self.places.get(fb)
            return "agreed"
        return (f"disagreed: on re-run {short(parent)} probed {vp} and {short(fb)} probed {vf}; "
                "the command is flaky or the environment changed; re-run with --repeat 3")

    # ------------------------------------------------------------------ answer

    def answer(self, found: SearchResult, recheck: str) -> RunsResult:
        """The commits as the answer shows them, the first divergence inside the culprit, the cost."""
        div, div_text, last_good = None, "", found.last_good
        if found.first_bad is not None:
            last_good = self._parent(found.first_bad)
            good_trace, bad_trace = self._parent_trace(last_good), self.traces.get(found.first_bad)
            div, div_text = self._divergence(good_trace, bad_trace)
            div, div_text = self._escalated(div, div_text, (last_good, good_trace), (found.first_bad, bad_trace))
            if recheck == "agreed" and self.cfg.check == "match":
                # the culprit against its parent must diverge where it diverged against --good
                recheck = _moved(found.first_bad, [("the re-check against --good", self.places.get(found.first_bad)),
                                                   ("the comparison with its parent", _place_of(div))]) or recheck
        cfg = self.cfg
        return RunsResult(
            first_bad=self._summary(found.first_bad) if found.first_bad else None,
            last_good=self._summary(last_good) if last_good else None,
            candidates=tuple(self._summary(c) for c in found.candidates),
            skipped=tuple((c, self.skipped.get(c, "")) for c in found.skipped),
            divergence=div,
            divergence_text=div_text,
            reason=self.reasons.get(found.first_bad, "") if found.first_bad else "",
            check=cfg.check,
            terms=self.terms,
            command=tuple(cfg.command),
            range_size=len(self.points) - 1,
            probes=found.probes,
            runs=self.prober.runs,
            cached=self.cached,
            rounds=found.rounds,
            wall_s=round(time.monotonic() - self.t0, 3),
            recheck=recheck,
            session_log=str(self.log_path),
            resumed=cfg.resume,
            good_rev=cfg.good,
            bad_rev=cfg.bad,
            range_good=self.good,
            range_bad=self.bad,
            replayed=self.replayed,
        )

    def _escalated(self, div: dict[str, Any] | None, text: str, good: tuple[str, str | None],
                   bad: tuple[str, str | None]) -> tuple[dict[str, Any] | None, str]:
        """With ``--detail sentinel``: the full chain at the step the culprit's sentinels first
        differ from its parent's, from replays of both (``reprobisect.workflows.escalate``)."""
        if not div or not div.get("first", {}).get("sentinel") or good[1] is None or bad[1] is None:
            return div, text
        self.progress.update(f"replaying {short(good[0])} and {short(bad[0])} with full detail at step {div['first']['step']}")
        try:
            comp = compare_results(good[1], bad[1], self.tolerance)
            sides = [ProbeResult(spec=self.prober.spec_for(c), outcome=Outcome("ok"), trace_dir=t) for c, t in (good, bad)]
            esc = escalate(comp, sides[0], sides[1], self.prober.executor, self.tolerance)
        except ReproError as e:
            return div, f"{text}\nfull detail at step {div['first']['step']} is inconclusive: {e}"
        if esc is None:
            return div, text
        return {**div, "escalation": esc.to_json()}, f"{text}\n{escalation_text(esc)}"

    def _parent_trace(self, parent: str) -> str | None:
        """The trace of the culprit's parent: known, cached, or (never probed: a merge
        history, or no re-check) probed once now, so the answer can name the first
        divergence inside the culprit."""
        trace = self.traces.get(parent) or self.prober.cached_trace(parent)
        if trace is None:
            self.progress.update(f"probing the culprit's parent {short(parent)} for the divergence")
            jp = self.prober.judge(parent)
            self._record(jp, "parent", self._as_term(jp.verdict))
            trace = jp.trace
        return trace

    def _parent(self, commit: str) -> str:
        """The culprit's parent to re-check and compare against: its first parent on the axis."""
        if self.parents:
            on_axis = set(self.points)
            for p in self.parents.get(commit, ()):
                if p in on_axis:
                    return p
        return self.points[self.points.index(commit) - 1]

    def _summary(self, commit: str) -> CommitSummary:
        info = _g.commit_info(self.top, commit)
        return CommitSummary(hash=info.hash, subject=info.subject, author=f"{info.author} <{info.email}>",
                             date=info.date, diffstat=info.diffstat)

    def _divergence(self, last_good_trace: str | None, bad_trace: str | None) -> tuple[dict[str, Any] | None, str]:
        """The first divergence of ``bad_trace`` against ``last_good_trace`` (data + text)."""
        if not last_good_trace or not bad_trace:
            return None, "no trace on one side to compare (the culprit did not record a trace)"
        try:
            comp = compare_results(last_good_trace, bad_trace, self.tolerance)
        except ReproError as e:
            return None, f"traces could not be compared: {e}"
        except Exception as e:  # compare is another module's: never lose the answer over it
            return None, f"traces could not be compared: {type(e).__name__}: {e}"
        if bool(comp):
            return None, "the traces agree under the tolerance (the change is not in the recorded steps)"
        # a data version change (DVC) is an environment difference: said before any tensor
        text = "".join(f"{c}\n    " for c in data_changes(getattr(comp, "env", ())))
        if comp.first is None:
            return {"structure": comp.structure}, text + divergence_text(comp)
        data: dict[str, Any] = {"first": comp.first.to_json(), "origin": comp.origin.to_json() if comp.origin else None,
                                "environment": [d.to_json() for d in comp.env], "tolerance": comp.tolerance.describe()}
        if getattr(comp, "explanation", ""):
            data["explanation"] = comp.explanation
        hints = list(getattr(comp, "hints", None) or ())
        if hints:
            data["hints"] = hints
        return data, text + divergence_text(comp)


def _moved(commit: str, seen: list[tuple[str, str | None]]) -> str:
    """'disagreed: ...' when runs of ``commit`` put the first divergence in different places
    (a verdict resting on nondeterminism), else ''."""
    known = [(who, where) for who, where in seen if where]
    if len({where for _, where in known}) < 2:
        return ""
    runs = "; ".join(f"{where} in {who}" for who, where in known)
    return (f"disagreed: the first divergence of {short(commit)} moves between runs ({runs}): its command is "
            "nondeterministic there, so this verdict cannot be trusted; re-run with --repeat 3 "
            "(or find the nondeterminism first with bisect repro)")


def _place_of(data: dict[str, Any] | None) -> str | None:
    """``step S · kind · name`` from ``RunsSession._divergence``'s data (None: no tensor diverges)."""
    first = (data or {}).get("first")
    if not isinstance(first, dict) or first.get("step") is None:
        return None
    return place_text(first.get("step"), first.get("kind"), first.get("name"))


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _expected_probes(candidates: int) -> int:
    """Probes a bisection of ``candidates`` commits is expected to take: log2 of the range (at least 1)."""
    return max(1, math.ceil(math.log2(candidates))) if candidates > 1 else 1
