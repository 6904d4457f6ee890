"""``bisect runs``: find the commit that changed (or broke) training between two revisions.

The driver around the pure search (``reprobisect.core.search.Bisection``): it resolves the
range, verifies both endpoints, then keeps K probes in flight on an executor, marks
their verdicts, re-checks the culprit and its parent, and names the first divergence
inside the culprit against the last good commit (``reprobisect.core.compare``).

What makes it safe to run on a real repository:

- Probes run in detached worktrees under a cache folder (the executor's job); this module
  only reads the repository (``rev-parse``, ``rev-list``, ``show``). The user's working
  tree, index, HEAD, untracked files and stashes are never touched.
- Every verdict is cached by (commit, command, environment relevant to the probe,
  recorder version, steps, check, tolerance, reference) and appended (fsynced) to a
  session log before the search moves on; ``resume=True`` replays the log and continues.
  A Ctrl-C kills the running probes (the executor removes its worktrees) and leaves the
  log consistent: every line in it is a finished probe.
- Infrastructure failures (timeout, a probe killed from outside) are retried once, then
  skipped, never blamed; with ``repeat`` R every probe runs R times and disagreement is a
  skip with reason ``flaky``.

Verdicts, per ``check``: ``match`` — the commit's trace equals the GOOD commit's trace
under the tolerance (bitwise by default: both sides run on this machine); ``finite`` —
no NaN/Inf in N steps; ``repro`` — two runs at the commit agree. Terms other than
good/bad (``("old", "new")``) hunt a change in either direction: the behaviour of the
``good`` revision is "old", whatever the predicate says about it.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from reprobisect.errors import ProbeError, ReproError, UsageError
from reprobisect.executors.base import Executor, ProbeResult, ProbeSpec
from reprobisect.core.options import ProbeOptions
from reprobisect.core.session import ResultCache, SessionEvent, SessionLog, cache_key, probe_environment

__all__ = ["RunsConfig", "RunsResult", "CommitSummary", "find_first_bad", "session_path"]

_DEFAULT_TERMS = ("good", "bad")


@dataclass(frozen=True, kw_only=True)
class RunsConfig:
    """What ``bisect runs`` searches and how."""

    good: str
    """A revision whose training behaves the old/expected way (``--good``)."""
    bad: str
    """A revision whose training changed (``--bad``); must descend from ``good``."""
    command: tuple[str, ...]
    """The user's training command, unmodified (``python train.py --lr 3e-4``)."""
    repo: str | None = None
    """Any folder inside the repository; None: ``cwd``."""
    cwd: str | None = None
    """The folder the user ran bisect from; the command runs from the same relative folder
    inside each worktree. None: the current directory."""
    check: str = "match"
    """'match' (trace equals the good commit's), 'repro' (two runs agree) or 'finite'."""
    options: ProbeOptions = field(default_factory=ProbeOptions)
    """Shared probe options: steps, jobs, timeout, tolerance, executor, quiet, out, keep."""
    first_parent: bool = False
    """Follow only the first parent of merges (``git rev-list --first-parent``)."""
    repeat: int = 1
    """Run each probe this many times and require agreement (flaky commands)."""
    resume: bool = False
    """Continue the interrupted session with the same arguments from its log."""
    terms: tuple[str, str] = _DEFAULT_TERMS
    """Names for the behaviour before/after the change (``old,new`` hunts a fix too)."""
    retries: int = 1
    """Re-runs of a probe that timed out or was killed from outside, before it is skipped."""
    recheck: bool = True
    """Re-run the culprit and its parent (uncached) before answering."""
    cache_dir: str | None = None
    """Cache + session folder; None: ``<common git dir>/reprobisect``."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every probe."""
    lock_timeout: float = 0.0
    """Seconds to wait for another session on the same repository to finish (``--lock-timeout``);
    0: refuse at once, naming the session that holds the lock."""


@dataclass(frozen=True)
class CommitSummary:
    """A commit as the answer shows it."""

    hash: str
    subject: str = ""
    author: str = ""
    date: str = ""
    diffstat: str = ""

    @property
    def short(self) -> str:
        return self.hash[:10]

    def __str__(self) -> str:
        return f"{self.short} {self.subject}".strip()

    def to_json(self) -> dict[str, Any]:
        return {"hash": self.hash, "subject": self.subject, "author": self.author, "date": self.date, "diffstat": self.diffstat}


@dataclass(frozen=True)
class RunsResult:
    """The answer of ``bisect runs``; truthy when it names one first bad commit and the
    re-check of that commit and its parent agreed with the search."""

    first_bad: CommitSummary | None
    """The first commit with the new behaviour; None when ambiguous or not found."""
    last_good: CommitSummary | None
    """The newest commit known to have the old behaviour."""
    candidates: tuple[CommitSummary, ...]
    """Every commit the answer could be ("could be any of"), oldest first; one when exact."""
    skipped: tuple[tuple[str, str], ...]
    """(commit, reason) for every commit that could not be tested."""
    divergence: dict[str, Any] | None
    """The first divergence inside the culprit against the last good commit
    (step, kind, name, module, verdict, magnitude), when both traces could be compared."""
    divergence_text: str
    """The same, as a line of text (or why there is none)."""
    reason: str
    """Why the culprit probed bad (the verdict's reason)."""
    check: str
    terms: tuple[str, str]
    command: tuple[str, ...]
    range_size: int
    """Commits in the searched range (good excluded)."""
    probes: int
    """Commits judged by the search (endpoints and re-checks not included)."""
    runs: int
    """Probe processes started in this session (retries, repeats, endpoints, re-checks)."""
    cached: int
    """Verdicts taken from the cache or the resumed log instead of a new probe."""
    rounds: int
    wall_s: float
    recheck: str
    """'agreed', 'disagreed: ...' or 'skipped'."""
    session_log: str
    resumed: bool = False
    good_rev: str = ""
    """``--good`` as the user typed it (``v1.2``, ``HEAD~5``); the hash is ``range_good``."""
    bad_rev: str = ""
    """``--bad`` as the user typed it (``HEAD``); the hash is ``range_bad``."""
    range_good: str = ""
    range_bad: str = ""
    replayed: int = 0
    """Search verdicts replayed from the session log (``--resume``); counted in ``probes``."""

    def __bool__(self) -> bool:
        return self.first_bad is not None and not self.recheck.startswith("disagreed")

    def __str__(self) -> str:
        from reprobisect.workflows.runs import render_result

        return render_result(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "found": bool(self),
            "inconclusive": self.recheck.split(":", 1)[1].strip() if self.first_bad is not None and self.recheck.startswith("disagreed") else None,
            "first_bad": self.first_bad.to_json() if self.first_bad else None,
            "last_good": self.last_good.to_json() if self.last_good else None,
            "candidates": [c.to_json() for c in self.candidates],
            "skipped": [{"commit": c, "reason": r} for c, r in self.skipped],
            "divergence": self.divergence,
            "divergence_text": self.divergence_text,
            "reason": self.reason,
            "check": self.check,
            "terms": list(self.terms),
            "command": list(self.command),
            "range_size": self.range_size,
            "probes": self.probes,
            "runs": self.runs,
            "cached": self.cached,
            "rounds": self.rounds,
            "wall_s": self.wall_s,
            "recheck": self.recheck,
            "session_log": self.session_log,
            "resumed": self.resumed,
            "good": {"rev": self.good_rev, "hash": self.range_good},
            "bad": {"rev": self.bad_rev, "hash": self.range_bad},
            "replayed": self.replayed,
        }


# --------------------------------------------------------------------------- git (read-only)


def _commit_summary(repo: Path, commit: str) -> CommitSummary:
    from reprobisect.vcs import git as _g

    info = _g.commit_info(repo, commit)
    return CommitSummary(hash=info.hash, subject=info.subject, author=f"{info.author} <{info.email}>", date=info.date, diffstat=info.diffstat)


def session_path(cache_dir: Path, session_id: str) -> Path:
    """Where the log of session ``session_id`` lives."""
    return cache_dir / "sessions" / f"{session_id}.jsonl"


# --------------------------------------------------------------------------- one judged probe


@dataclass(frozen=True)
class _Judged:
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


class _Prober:
    """Runs and judges probes of one session (thread-safe: controller threads call ``judge``)."""

    def __init__(self, cfg: RunsConfig, repo: Path, subdir: str, executor: Executor, cache: ResultCache, tolerance: Any) -> None:
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
        self._counter = 0
        self._lock = threading.Lock()
        self.runs = 0
        self.stopping = False

    def key(self, commit: str, full_steps: tuple[int, ...] | None = None) -> str:
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
        )

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
        )

    def _run_once(self, commit: str, full_steps: tuple[int, ...] | None = None) -> ProbeResult:
        """One probe with infrastructure retries (timeout / infra re-run ``retries`` times)."""
        spec = self._spec(commit, full_steps)
        attempt = 0
        while True:
            if self.stopping:
                raise KeyboardInterrupt
            with self._lock:
                self.runs += 1
            res = self.executor.submit(spec).result()
            if res.outcome.status not in ("timeout", "infra") or attempt >= self.cfg.retries:
                return res
            attempt += 1
            spec = replace(spec, attempt=spec.attempt + 1)

    def _classify_one(self, commit: str, full_steps: tuple[int, ...] | None = None) -> tuple[str, str, ProbeResult, str | None]:
        """(verdict, reason, result, place of the first divergence the verdict rests on or None)."""
        v, reason, res = self._classify_raw(commit, full_steps)
        if isinstance(v, str):  # decided without a comparison
            return v, reason, res, None
        return v.verdict, _short_reason(v), res, _place(getattr(v, "comparison", None))

    def _classify_raw(self, commit: str, full_steps: tuple[int, ...] | None = None) -> tuple[Any, str, ProbeResult]:
        """(a ``Verdict``, or a verdict string with its reason, and the result)."""
        from reprobisect.core.probe import classify

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

    def judge(self, commit: str, *, use_cache: bool = True, full_steps: tuple[int, ...] | None = None) -> _Judged:
        t0 = time.monotonic()
        key = self.key(commit, full_steps)
        if use_cache:
            hit = self.cache.get(key)
            if hit is not None:
                return _Judged(commit, hit.verdict, hit.reason, hit.outcome, str(hit.trace) if hit.trace else None, 0, True, 0.0,
                               place=hit.data.get("place") if isinstance(hit.data.get("place"), str) else None)
        runs0 = self.runs
        n = max(1, self.cfg.repeat)
        if n == 1:
            results = [self._classify_one(commit, full_steps)]
        else:  # the repeats run side by side (the executor bounds how many really run at once)
            with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="repeat") as rp:
                results = list(rp.map(lambda _: self._classify_one(commit, full_steps), range(n)))
        verdicts = [r[0] for r in results]
        tested = [v for v in verdicts if v != "skip"]
        # for 'match', where a commit diverges from the reference is a fact about its code;
        # for 'repro', a bad verdict *is* nondeterminism, whose place may move
        places = sorted({r[3] for r in results if r[0] == "bad" and r[3]}) if self.cfg.check == "match" else []
        if not tested:
            verdict, reason, res, place = results[0]
        elif len(set(tested)) > 1:
            counts = ", ".join(f"{v} {tested.count(v)}" for v in sorted(set(tested)))
            verdict, reason, res, place = "skip", f"flaky: {counts} of {len(results)} runs", results[0][2], None
        elif len(places) > 1:
            # every run differs, but each at another place: the verdict rests on noise
            verdict, reason, res, place = ("skip", f"flaky: all {len(results)} runs differ, but the first divergence moves "
                                           f"between them ({'; '.join(places)})", results[0][2], None)
        else:
            verdict, reason, res, place = next(r for r in results if r[0] != "skip")
        trace = res.trace_dir if res.trace_dir and Path(res.trace_dir, "manifest.json").is_file() else None
        outcome = res.outcome.to_json()
        entry = None
        # timeouts / infra are not facts about the code: never cached
        if verdict != "skip" or res.outcome.status not in ("timeout", "infra"):
            entry = self.cache.put(key, verdict=verdict, reason=reason, outcome=outcome, trace=trace,
                                   extra={"commit": commit, "place": place})
        kept = str(entry.trace) if entry is not None and entry.trace else trace
        return _Judged(commit, verdict, reason, outcome, kept, self.runs - runs0, False, round(time.monotonic() - t0, 3),
                       place=place, output_tail=res.last_lines(8) if res.outcome.status == "crashed" else "")


# --------------------------------------------------------------------------- the driver


def _short_reason(v: Any) -> str:
    """A verdict's reason on one line (a comparison becomes its first divergence)."""
    comp = getattr(v, "comparison", None)
    if comp is not None and not bool(comp) and getattr(comp, "first", None) is not None:
        d = comp.first
        where = f"step {d.step} · {d.kind} · {d.name}" + (f" ({d.module})" if d.module else "")
        return f"differs from the good commit's trace at {where}"
    if comp is not None and not bool(comp) and getattr(comp, "structure", ""):
        return f"differs from the good commit's trace: {comp.structure}"
    lines = [ln for ln in str(v.reason).splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def _moved(commit: str, seen: list[tuple[str, str | None]]) -> str:
    """'disagreed: ...' when runs of ``commit`` put the first divergence in different places
    (a verdict resting on nondeterminism), else ''."""
    known = [(who, where) for who, where in seen if where]
    if len({where for _, where in known}) < 2:
        return ""
    runs = "; ".join(f"{where} in {who}" for who, where in known)
    return (f"disagreed: the first divergence of {_short(commit)} moves between runs ({runs}): its command is "
            "nondeterministic there, so this verdict cannot be trusted; re-run with --repeat 3 "
            "(or find the nondeterminism first with bisect repro)")


def _place(comp: Any) -> str | None:
    """``step S · kind · name`` of a comparison's first divergence (None when it agrees or has none)."""
    if comp is None or bool(comp):
        return None
    d = getattr(comp, "first", None)
    if d is None:
        return None
    return f"step {d.step} · {d.kind} · {d.name}"


def _place_of(data: dict[str, Any] | None) -> str | None:
    """The same from ``_divergence``'s data."""
    first = (data or {}).get("first")
    if not isinstance(first, dict) or first.get("step") is None:
        return None
    return f"step {first.get('step')} · {first.get('kind')} · {first.get('name')}"


def _short(c: str) -> str:
    return c[:10]


def _say(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def _named(commit: str, typed: str) -> str:
    """A commit as the user named it, with the hash beside it (``HEAD~2 (1a2b3c4d5e)``)."""
    if not typed or commit.startswith(typed.lower()):
        return _short(commit)
    return f"{typed} ({_short(commit)})"


def _clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, with an ellipsis when something was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _divergence(last_good_trace: str | None, bad_trace: str | None, tolerance: Any) -> tuple[dict[str, Any] | None, str]:
    """The first divergence of ``bad_trace`` against ``last_good_trace`` (data + one line)."""
    if not last_good_trace or not bad_trace:
        return None, "no trace on one side to compare (the culprit did not record a trace)"
    try:
        from reprobisect.core.probe import compare_traces

        comp = compare_traces(last_good_trace, bad_trace, tolerance)
    except ReproError as e:
        return None, f"traces could not be compared: {e}"
    except Exception as e:  # compare is another module's: never lose the answer over it
        return None, f"traces could not be compared: {type(e).__name__}: {e}"
    if bool(comp):
        return None, "the traces agree under the tolerance (the change is not in the recorded steps)"
    from reprobisect.render import render_divergence

    first = comp.first
    if first is None:
        return {"structure": comp.structure}, f"structure changed: {comp.structure}"
    data = {"first": first.to_json(), "origin": comp.origin.to_json() if comp.origin else None,
            "environment": [d.to_json() for d in comp.env], "tolerance": comp.tolerance.describe()}
    text = render_divergence(first, with_localization=True)
    if getattr(comp, "explanation", ""):
        text += f"\n    ↳ likely explanation: {comp.explanation}"
        data["explanation"] = comp.explanation
    hints = list(getattr(comp, "hints", None) or ())
    for h in hints:
        text += f"\n    hint: {h}"
    if hints:
        data["hints"] = hints
    origin = comp.origin
    if origin is not None and origin is not first:
        text += "\n  origin (inputs agree, output differs): " + render_divergence(origin)
    return data, text


_HEADER_KEYS = ("good", "bad", "command", "subdir", "check", "steps", "first_parent", "terms", "repeat", "points")


def _load_for_resume(log_path: Path, header: dict[str, Any], points: list[str], terms: tuple[str, ...],
                     parents: Any) -> SessionLog:
    """The session log to resume, checked whole before anything runs: readable
    (``SessionLog.load``), this search's (``_check_resumable``) and replayable. Every
    problem is one ``UsageError`` that says to start afresh."""
    from reprobisect.core.search import Bisection

    log = SessionLog.load(log_path)
    _check_resumable(log, header, points)
    try:
        Bisection.replay(points, log.search_rounds(), terms=terms, parents=parents)  # type: ignore[arg-type]
    except ReproError as e:
        raise UsageError(f"the session log {log_path} cannot be replayed ({e}); "
                         "start afresh without --resume (or delete the log)") from None
    return log


def _check_resumable(log: SessionLog, header: dict[str, Any], points: list[str]) -> None:
    """Refuse (one line) a log that is not this search's: another search's header, or
    probes of commits that are not in this range (the history was rewritten)."""
    differ = [k for k in _HEADER_KEYS if k in header and log.header.get(k) != header[k]]
    if differ:
        raise UsageError(
            f"the session log {log.path} is for another search (its {', '.join(differ)} differ from this one's); "
            "start afresh without --resume (or delete the log)"
        )
    on_axis = set(points)
    for e in log.events:
        if e.point not in on_axis and e.role in ("endpoint", "search"):
            raise UsageError(
                f"the session log {log.path} names commit {e.point[:12]}, which is not in this range "
                "(the history changed?); start afresh without --resume (or delete the log)"
            )


def _unfinished(log_path: Path) -> int:
    """Probes in an earlier log at ``log_path`` that never reached its answer (0: none)."""
    try:
        old = SessionLog.load(log_path)
    except ReproError:
        return 0
    if any(e.role in ("recheck", "parent") for e in old):
        return 0
    return len(old)


def _cached_trace(cache: ResultCache, prober: "_Prober", commit: str) -> str | None:
    hit = cache.get(prober.key(commit))
    return str(hit.trace) if hit and hit.trace else None


def _parent_on_axis(commit: str, points: list[str], parents: dict[str, tuple[str, ...]] | None) -> str:
    """The culprit's parent to re-check and compare against: its first parent on the axis."""
    if parents:
        on_axis = set(points)
        for p in parents.get(commit, ()):
            if p in on_axis:
                return p
    return points[points.index(commit) - 1]


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
    from reprobisect.core.probe import CHECKS
    from reprobisect.core.search import Bisection

    t0 = time.monotonic()
    cfg = config
    if not cfg.command:
        raise UsageError("give the training command after --, e.g. bisect runs --good G --bad B -- python train.py")
    if cfg.check not in CHECKS:
        raise UsageError(f"unknown check '{cfg.check}'; use --check match, repro or finite")
    if cfg.repeat < 1:
        raise UsageError(f"--repeat must be at least 1 (got {cfg.repeat})")
    terms = tuple(cfg.terms)
    if len(terms) != 2 or terms[0] == terms[1]:
        raise UsageError(f"--terms takes two different names, e.g. old,new (got {','.join(terms)})")

    from reprobisect.vcs import git as _g

    cwd = Path(cfg.cwd or os.getcwd()).resolve()
    info = _g.open_repo(cfg.repo if cfg.repo else cwd)
    top, common = info.root, info.common_dir
    subdir = info.subdir
    if cfg.repo is not None:
        # the command runs from the user's folder when it lies inside the repository
        try:
            subdir = os.path.relpath(cwd, top) if cwd.is_relative_to(top) else "."
        except ValueError:
            subdir = "."
    links = _g.check_links(info, cfg.options.link)
    good = _g.resolve(info, cfg.good)
    bad = _g.resolve(info, cfg.bad)
    # the revisions as the user typed them: git's messages name what was typed (HEAD), not a hash
    points, parents = _g.bisect_axis(info, cfg.good, cfg.bad, first_parent=cfg.first_parent)
    commits = points[1:]

    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else common / "reprobisect"
    opts = cfg.options
    tolerance = opts.tolerance_spec("bitwise")
    session_id = cache_key(
        good=good, bad=bad, command=list(cfg.command), subdir=subdir, check=cfg.check, steps=opts.steps,
        first_parent=cfg.first_parent, terms=list(terms), repeat=cfg.repeat, tolerance=tolerance,
    )[:16]
    log_path = session_path(cache_dir, session_id)
    header = {
        "good": good, "bad": bad, "command": list(cfg.command), "subdir": subdir, "check": cfg.check,
        "steps": opts.steps, "first_parent": cfg.first_parent, "terms": list(terms), "repeat": cfg.repeat,
        "points": len(points), "repo": str(top),
    }
    if cfg.resume:  # fail early, before any executor starts; loaded again under the lock
        _load_for_resume(log_path, header, points, terms, parents)
    cache = ResultCache(cache_dir / "cache")

    own_executor = executor is None
    if executor is None:
        executor = opts.make_executor()
    own_progress = progress is None
    if progress is None:
        from reprobisect.support.progress import Progress

        progress = Progress(f"bisect runs ({cfg.check})", total=None, quiet=opts.quiet)

    lock_cm = _g.session_lock(info, timeout=cfg.lock_timeout, what=f"bisect runs --good {cfg.good} --bad {cfg.bad}",
                              option="--lock-timeout", on_wait=None if opts.quiet else _say)
    prober = _Prober(cfg, top, subdir, executor, cache, tolerance)
    prober.links = links
    cached = 0
    replaced = 0
    replayed = 0
    pool = cf.ThreadPoolExecutor(max_workers=max(1, opts.jobs), thread_name_prefix="runs")
    try:
        with lock_cm:
            # leftovers of SIGKILL'd sessions (worktrees of dead pids): cleaned on start,
            # also when every probe of this session comes from the cache
            try:
                _g.prune_stale_worktrees(info)
            except (OSError, ReproError):
                pass
            # the log is only read or replaced while this session holds the repository's lock
            if cfg.resume:
                log = _load_for_resume(log_path, header, points, terms, parents)
            else:
                replaced = _unfinished(log_path)
                log = SessionLog.create(log_path, header)
            if own_progress:
                progress.__enter__()
            if not cfg.resume and replaced:
                progress.note(f"note: an unfinished session with these arguments ({replaced} probes) was replaced; "
                              "--resume continues one instead (its verdicts stay cached)")
            logged = {(e.role, e.point): e for e in log.events}

            def record(j: _Judged, role: str, verdict: str, rnd: int | None = None) -> None:
                ev = SessionEvent(point=j.commit, verdict=verdict, reason=j.reason, outcome=j.outcome,
                                  attempts=max(1, j.runs), cached=j.cached, wall_s=j.wall_s, role=role, round=rnd)
                log.append(ev)
                if on_event is not None:
                    on_event(ev)

            # ---- endpoints: good first (it is the reference for 'match'), then bad
            progress.update(f"verifying --good {_named(good, cfg.good)} and --bad {_named(bad, cfg.bad)}")
            prev_g = logged.get(("endpoint", good))
            jg = prober.judge(good)
            cached += jg.cached
            if jg.verdict == "skip" or (terms == _DEFAULT_TERMS and jg.verdict != "good"):
                if jg.output_tail:  # a crash: what the command printed last
                    progress.note("\n".join(f"      | {ln}" for ln in jg.output_tail.splitlines()))
                fix = "" if "--link" in jg.reason else "; pick a good revision where the command runs"
                raise ProbeError(f"--good {cfg.good} does not probe {terms[0]}: {jg.reason}{fix}")
            invert = jg.verdict == "bad"  # custom terms: the good end's behaviour is "old"
            if prev_g is None:
                record(jg, "endpoint", "good")
            if cfg.check == "match":
                prober.reference = jg.trace
                prober.reference_commit = good
                if not jg.trace:
                    raise ProbeError(f"--good {cfg.good} left no trace to compare against: {jg.reason}")

            def as_term(v: str) -> str:
                if v == "skip" or not invert:
                    return v
                return "good" if v == "bad" else "bad"

            prev_b = logged.get(("endpoint", bad))
            jb = prober.judge(bad)
            cached += jb.cached
            vb = as_term(jb.verdict)
            if vb != "bad":
                what = "could not be tested" if vb == "skip" else f"probes {terms[0]} like --good"
                raise ProbeError(
                    f"--bad {cfg.bad} does not probe {terms[1]}: it {what} ({jb.reason}); "
                    "the change is not in this range, or the check/tolerance does not see it"
                )
            if prev_b is None:
                record(jb, "endpoint", "bad")
            traces: dict[str, str | None] = {good: jg.trace, bad: jb.trace}
            places: dict[str, str | None] = {bad: jb.place}
            reasons: dict[str, str] = {good: jg.reason, bad: jb.reason}

            # ---- the search
            if cfg.resume:
                try:
                    bis = Bisection.replay(points, log.search_rounds(), terms=terms, parents=parents)  # type: ignore[arg-type]
                except ReproError as e:
                    raise UsageError(f"the session log {log_path} cannot be replayed: {e}; "
                                     "start afresh without --resume (or delete the log)") from None
                replayed = len(log.search_events())
                cached += replayed
                for e in log.events:
                    if e.role == "search":
                        reasons[e.point] = e.reason
            else:
                bis = Bisection(points, terms=terms, parents=parents)  # type: ignore[arg-type]
            skipped: dict[str, str] = {e.point: e.reason for e in log.events if e.role == "search" and e.verdict == "skip"}
            running: dict[cf.Future, str] = {}
            progress.update(f"{len(bis.remaining())} commits left", total=None)
            while not bis.done:
                free = opts.jobs - len(running)
                if free > 0:
                    for p in bis.next(free):
                        running[pool.submit(prober.judge, p)] = p
                if not running:
                    break
                left = len(bis.remaining())
                progress.update(
                    f"round {bis.result().rounds} · {left} commits left · probing "
                    + ", ".join(_short(p) for p in running.values())
                )
                done, _ = cf.wait(list(running), timeout=0.5, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    p = running.pop(fut)
                    j = fut.result()
                    cached += j.cached
                    v = as_term(j.verdict)
                    if p in bis.obsolete() or p not in bis.in_flight:
                        bis.cancel(p)
                        continue
                    bis.mark(p, v)
                    traces[p] = j.trace
                    reasons[p] = j.reason
                    places[p] = j.place
                    if v == "skip":
                        skipped[p] = j.reason
                    rnd = bis.log[-1].get("round") if bis.log and bis.log[-1].get("point") == p else None
                    record(j, "search", v, rnd if isinstance(rnd, int) else None)
                    progress.note(_clip(f"  {_short(p)}  {terms[0] if v == 'good' else terms[1] if v == 'bad' else 'skip'}  {j.reason}", 200))
                    if j.output_tail:  # a crash: what the command printed last
                        progress.note("\n".join(f"      | {ln}" for ln in j.output_tail.splitlines()))
                for p in bis.obsolete():
                    bis.cancel(p)
            res = bis.result()

            # ---- re-check the culprit and its parent, uncached
            recheck = "skipped"
            if res.first_bad is not None and cfg.recheck:
                fb = res.first_bad
                parent = _parent_on_axis(fb, points, parents)
                progress.update(f"re-checking {_short(fb)} and its parent {_short(parent)}")
                # keep full tensors at the step where the cached traces first differ, so the
                # answer can give real magnitudes (max abs / rel, mismatches, ULPs)
                full = tuple(cfg.options.full_steps)
                pre, _ = _divergence(traces.get(parent) or _cached_trace(cache, prober, parent), traces.get(fb), tolerance)
                if pre and pre.get("first") and isinstance(pre["first"].get("step"), int):
                    full = tuple(sorted(set(full) | {pre["first"]["step"]}))
                futs = {pool.submit(prober.judge, c, use_cache=False, full_steps=full): c for c in (parent, fb)}
                again: dict[str, _Judged] = {}
                for fut in cf.as_completed(futs):
                    again[futs[fut]] = fut.result()
                for c, j in again.items():
                    record(j, "recheck", as_term(j.verdict))
                vp, vf = as_term(again[parent].verdict), as_term(again[fb].verdict)
                moved = _moved(fb, [("the search", places.get(fb)), ("the re-check", again[fb].place)]) \
                    if cfg.check == "match" else ""
                if vp == "good" and vf == "bad" and moved:
                    recheck = moved
                elif vp == "good" and vf == "bad":
                    recheck = "agreed"
                    traces[fb] = again[fb].trace or traces.get(fb)
                    traces[parent] = again[parent].trace or traces.get(parent)
                    places[fb] = again[fb].place or places.get(fb)
                else:
                    recheck = (
                        f"disagreed: on re-run {_short(parent)} probed {vp} and {_short(fb)} probed {vf}; "
                        "the command is flaky or the environment changed; re-run with --repeat 3"
                    )

            # ---- the answer
            first = _commit_summary(top, res.first_bad) if res.first_bad else None
            last_good = _commit_summary(top, res.last_good) if res.last_good else None
            cands = tuple(_commit_summary(top, c) for c in res.candidates)
            div, div_text = (None, "")
            if res.first_bad is not None:
                lg = _parent_on_axis(res.first_bad, points, parents)
                last_good = _commit_summary(top, lg)
                lg_trace = traces.get(lg) if lg else None
                if lg_trace is None and lg is not None:
                    lg_trace = _cached_trace(cache, prober, lg)
                if lg_trace is None and lg is not None:
                    # the culprit's parent was never probed (a merge history, or no re-check):
                    # probe it once, so the answer can name the first divergence inside the culprit
                    progress.update(f"probing the culprit's parent {_short(lg)} for the divergence")
                    jp = prober.judge(lg)
                    record(jp, "parent", as_term(jp.verdict))
                    lg_trace = jp.trace
                div, div_text = _divergence(lg_trace, traces.get(res.first_bad), tolerance)
                if recheck == "agreed" and cfg.check == "match":
                    # the culprit against its parent must diverge where it diverged against --good
                    moved = _moved(res.first_bad, [("the re-check against --good", places.get(res.first_bad)),
                                                   ("the comparison with its parent", _place_of(div))])
                    if moved:
                        recheck = moved
            return RunsResult(
                first_bad=first,
                last_good=last_good,
                candidates=cands,
                skipped=tuple((c, skipped.get(c, "")) for c in res.skipped),
                divergence=div,
                divergence_text=div_text,
                reason=reasons.get(res.first_bad, "") if res.first_bad else "",
                check=cfg.check,
                terms=terms,  # type: ignore[arg-type]
                command=tuple(cfg.command),
                range_size=len(commits),
                probes=res.probes,
                runs=prober.runs,
                cached=cached,
                rounds=res.rounds,
                wall_s=round(time.monotonic() - t0, 3),
                recheck=recheck,
                session_log=str(log_path),
                resumed=cfg.resume,
                good_rev=cfg.good,
                bad_rev=cfg.bad,
                range_good=good,
                range_bad=bad,
                replayed=replayed,
            )
    except BaseException:
        prober.stopping = True
        raise
    finally:
        if own_progress:
            progress.__exit__(None, None, None)
        if own_executor:
            executor.close()  # kills running probes, removes worktrees
        pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------- text


def render_result(r: RunsResult) -> str:
    """The answer as text: the culprit (or candidates, or why it is inconclusive), the first
    divergence, the cost."""
    old, new = r.terms
    lines: list[str] = []
    if r.first_bad is not None and r.recheck.startswith("disagreed"):
        fb = r.first_bad
        lines.append(f"inconclusive: {r.recheck.split(':', 1)[1].strip()}")
        lines.append(f"    the search pointed at {fb.short} {fb.subject} (not confirmed: no culprit is named)")
    elif r.first_bad is not None:
        fb = r.first_bad
        lines.append(f"first {new} commit: {fb.hash}")
        lines.append(f"    {fb.subject}")
        if fb.author or fb.date:
            lines.append(f"    {fb.author}  {fb.date}".rstrip())
        for ln in fb.diffstat.splitlines():
            lines.append(f"    {ln.strip()}")
        if r.reason:
            lines.append(f"why {new}: {r.reason}")
        if r.last_good is not None:
            lg = _named(r.last_good.hash, r.good_rev) if r.last_good.hash == r.range_good else r.last_good.short
            lines.append(f"first divergence against the last {old} commit {lg}: {r.divergence_text}")
    elif r.candidates:
        lines.append(f"the first {new} commit could be any of ({len(r.candidates)}; skipped commits border it):")
        skipped = dict(r.skipped)
        for c in r.candidates:
            why = f"  [skipped: {skipped[c.hash]}]" if c.hash in skipped else ""
            lines.append(f"    {c.short} {c.subject}{why}")
    else:
        lines.append(f"no first {new} commit found")
    if r.range_good and r.range_bad:
        lines.append(f"searched --good {_named(r.range_good, r.good_rev)} .. --bad {_named(r.range_bad, r.bad_rev)}")
    rounds = f"{r.rounds} rounds"
    if r.resumed:
        rounds += f" (resumed: {r.replayed} replayed from the session log)"
    recheck = "disagreed (inconclusive)" if r.recheck.startswith("disagreed") else r.recheck
    lines.append(
        f"{r.probes} commits judged of {r.range_size} in range, {rounds}, {r.runs} probe runs"
        f" ({r.cached} from cache), {r.wall_s:.1f} s; re-check {recheck}"
    )
    return "\n".join(lines)
