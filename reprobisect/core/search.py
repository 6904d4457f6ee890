"""A pure search over an ordered axis: told good / bad / skip, it says what to probe next.

``Bisection`` is a state machine in the manner of Polygraphy's ``BisectMarker`` with
``git bisect`` semantics. It knows nothing of git, Ray, torch or files: the points are
any hashable values in order, oldest first (commit hashes, step numbers), and a driver
(``bisect runs``, a step zoom) does the probing, then reports each verdict with
``mark``. With K probes in flight the open range is split K+1 ways.

The model, as in ``git bisect``: there is one boundary on the axis; every point before
it is *good* (the "old" behaviour) and every point from it on is *bad* (the "new"
behaviour). The search keeps ``lo`` (the newest known-good index) and ``hi`` (the oldest
known-bad index); the answer lies in ``lo+1 .. hi``. Points that could not be tested
(``skip``) are stepped around; when only skipped points are left between ``lo`` and
``hi`` the answer is *ambiguous* and the result lists every point it could be
("could be any of"), never a guess.

Histories with merges: given ``parents``, the search works on the graph as ``git
bisect`` does — the candidates are the ancestors of every bad point that are not
ancestors of a good one, each probe is chosen so that the candidates left split evenly,
and the answer is a bad point whose parents on the axis are all good. Without
``parents`` the axis is a line (steps, a first-parent history).

Terms: ``terms=("good", "bad")`` (default) or ``("old", "new")`` or any pair; the first
term means "before the change", the second "after it". ``good``/``bad`` and
``old``/``new`` are accepted as aliases with any terms, so hunting the commit that
*fixed* something is ``terms=("broken", "fixed")`` — the first "fixed" point is the
answer.

Contradictions (a point marked good that lies after a point marked bad, or one point
given two different verdicts) raise ``ContradictionError`` naming both points: a flaky
command gives them, and a guess on top of flaky evidence is worse than stopping. The
driver may catch it and re-probe (``--repeat``). Endpoints: with ``assume_ends=True``
(default) ``points[0]`` is taken as good and ``points[-1]`` as bad without probing;
with ``assume_ends=False`` ``next`` proposes the two ends first and ``mark`` raises
``EndpointError`` when the good end is not good or the bad end not bad.

Replay: every ``mark`` appends an event ``{"point", "verdict", "round"}`` to ``log``;
``Bisection.replay(points, events)`` rebuilds the same state from such a log (a driver
appends one JSON line per probe to its session log and resumes from it).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from reprobisect.core.outcome import VerdictKind
from reprobisect.errors import ReproError, UsageError

__all__ = [
    "VerdictKind",
    "Bisection",
    "SearchResult",
    "SearchError",
    "ContradictionError",
    "EndpointError",
    "max_probes",
    "max_rounds",
]

P = TypeVar("P", bound=Hashable)

GOOD, BAD, SKIP = VerdictKind.GOOD, VerdictKind.BAD, VerdictKind.SKIP
# the canonical verdicts (``VerdictKind``) by every name they take; the session's own terms join these
_ALIASES = {"good": GOOD, "old": GOOD, "bad": BAD, "new": BAD, "skip": SKIP}


class SearchError(ReproError):
    """The evidence given to a search cannot be reconciled (the search stops)."""


class ContradictionError(SearchError):
    """A verdict contradicts an earlier one (a good point after a bad one, or a re-mark)."""

    def __init__(self, message: str, *, point: Any, verdict: str, other: Any, other_verdict: str) -> None:
        super().__init__(message)
        self.point = point
        self.verdict = verdict
        self.other = other
        self.other_verdict = other_verdict


class EndpointError(SearchError):
    """An endpoint probed the wrong way: the good end is not good or the bad end not bad."""

    def __init__(self, message: str, *, point: Any, verdict: str, end: str) -> None:
        super().__init__(message)
        self.point = point
        self.verdict = verdict
        self.end = end


def max_probes(n: int) -> int:
    """Probes a one-at-a-time search needs at most over ``n`` points with known ends and no skips."""
    return math.ceil(math.log2(n - 1)) if n > 2 else 0


def max_rounds(n: int, k: int) -> int:
    """Rounds of ``k`` parallel probes needed at most over ``n`` points with known ends, no skips."""
    m = n - 1  # candidates for the first bad point
    rounds = 0
    while m > 1:
        m = math.ceil(m / (k + 1))
        rounds += 1
    return rounds


@dataclass(frozen=True)
class SearchResult(Generic[P]):
    """Where a finished (or stopped) search put the boundary; truthy when it names one point.

    ``first_bad`` is None when the answer is ambiguous (skipped points border it) or the
    search is not done; ``candidates`` then lists every point the answer could be, oldest
    first (the known-bad one last), as ``git bisect`` does.
    """

    first_bad: P | None
    """The first point with the second term's behaviour ("bad"/"new"); None if ambiguous."""
    last_good: P | None
    """The newest point known to have the first term's behaviour ("good"/"old")."""
    candidates: tuple[P, ...]
    """Every point the first bad one could be: one when exact, more when skips border it."""
    done: bool
    """True when nothing is left to probe (exact or ambiguous)."""
    ambiguous: bool
    """True when skipped points border the answer ("could be any of" ``candidates``)."""
    probes: int
    """Verdicts received (endpoint checks included, implicit endpoints not)."""
    rounds: int
    """Batches of probes handed out by ``next`` (one per call that returned points)."""
    skipped: tuple[P, ...] = ()
    """Points marked skip, in axis order."""
    terms: tuple[str, str] = ("good", "bad")
    """The session's names for good and bad."""
    size: int = 0
    """Number of points on the axis (both ends included)."""

    def __bool__(self) -> bool:
        return self.done and not self.ambiguous and self.first_bad is not None

    def __str__(self) -> str:
        old, new = self.terms
        if not self.done:
            return f"search not finished: {len(self.candidates)} candidates left after {self.probes} probes"
        if self.ambiguous:
            listed = ", ".join(str(c) for c in self.candidates)
            return (
                f"only skipped points are left to test; the first {new} point could be any of: {listed} "
                f"({self.probes} probes, {self.rounds} rounds)"
            )
        return f"first {new} point: {self.first_bad} (last {old}: {self.last_good}; {self.probes} probes, {self.rounds} rounds)"

    def to_json(self) -> dict[str, Any]:
        return {
            "first_bad": self.first_bad,
            "last_good": self.last_good,
            "candidates": list(self.candidates),
            "done": self.done,
            "ambiguous": self.ambiguous,
            "probes": self.probes,
            "rounds": self.rounds,
            "skipped": list(self.skipped),
            "terms": list(self.terms),
            "size": self.size,
        }


class Bisection(Generic[P]):
    """A bisection over ``points`` (oldest first): ``next`` says what to probe, ``mark`` takes verdicts.

    Args:
        points: the ordered axis, oldest first; distinct hashable values (at least two).
            With ``parents``, a topological order (every parent before its children).
        terms: names for (good, bad) — ``("old", "new")`` or a custom pair; ``good``,
            ``bad``, ``old``, ``new`` and ``skip`` are always accepted too.
        assume_ends: take ``points[0]`` as good and ``points[-1]`` as bad without
            probing them (default). With False, ``next`` proposes the ends first and the
            search refuses (``EndpointError``) if they do not probe as expected.
        parents: for a history with merges, each point's parents (points not on the
            axis are ignored). The search then works on the graph as ``git bisect``
            does: a bad point keeps only its ancestors as candidates, a good point
            removes its ancestors, and the answer is a bad point whose parents on the
            axis are all good. Without it the axis is a line (``parents`` of each point
            is the one before it), which is what a step axis or a first-parent history is.

    The typical loop (K parallel probes)::

        b = Bisection(commits)
        while not b.done:
            for point in b.next(free_slots):
                submit(point)
            point, verdict = wait_for_one()
            b.mark(point, verdict)
        print(b.result())
    """

    def __init__(
        self,
        points: Sequence[P],
        *,
        terms: tuple[str, str] = ("good", "bad"),
        assume_ends: bool = True,
        parents: Mapping[P, Iterable[P]] | None = None,
    ) -> None:
        pts = list(points)
        if len(pts) < 2:
            raise UsageError(
                f"a search needs at least two points (a good and a bad end), got {len(pts)}"
            )
        index: dict[P, int] = {}
        for i, p in enumerate(pts):
            if p in index:
                raise UsageError(f"point {p!r} appears twice on the search axis (positions {index[p]} and {i})")
            index[p] = i
        terms = tuple(terms)  # type: ignore[assignment]
        if len(terms) != 2 or terms[0] == terms[1] or not all(isinstance(t, str) and t for t in terms):
            raise UsageError(f"terms must be two different names for good and bad, got {terms!r}")
        for t, canon in zip(terms, (GOOD, BAD)):
            if t in _ALIASES and _ALIASES[t] != canon:
                raise UsageError(
                    f"term '{t}' already means '{_ALIASES[t]}'; pick another name for '{canon}'"
                )
        self.points: tuple[P, ...] = tuple(pts)
        self.terms: tuple[str, str] = terms  # type: ignore[assignment]
        self.assume_ends = assume_ends
        self._index = index
        self._aliases = dict(_ALIASES, **{terms[0]: GOOD, terms[1]: BAD})
        self._verdict: dict[int, VerdictKind] = {}
        self._goods: set[int] = {0} if assume_ends else set()
        self._bads: set[int] = {len(pts) - 1} if assume_ends else set()
        self._in_flight: dict[int, int] = {}  # index -> round it was handed out in
        self._rounds = 0
        self._probes = 0
        self._anc: list[int] | None = None if parents is None else self._ancestors(parents)
        self.log: list[dict[str, Any]] = []
        """Every verdict received, in order: ``{"point", "verdict", "round"}`` (replayable)."""

    def _ancestors(self, parents: Mapping[P, Iterable[P]]) -> list[int]:
        anc: list[int] = []
        for i, p in enumerate(self.points):
            bits = 1 << i
            for q in parents.get(p, ()):
                j = self._index.get(q)
                if j is None:
                    continue
                if j >= i:
                    raise UsageError(
                        f"point {p!r} comes before its parent {q!r} on the axis: list points in topological order "
                        "(oldest first, e.g. git rev-list --topo-order --reverse)"
                    )
                bits |= anc[j]
            anc.append(bits)
        return anc

    # ---------------------------------------------------------------- the open range
    @property
    def _lo(self) -> int:
        return max(self._goods, default=-1)

    @property
    def _hi(self) -> int:
        return min(self._bads, default=len(self.points))

    def _cand_mask(self) -> int:
        """DAG mode: candidates for the first bad point as a bit set."""
        assert self._anc is not None
        mask = (1 << len(self.points)) - 1
        for b in self._bads:
            mask &= self._anc[b]
        for g in self._goods:
            mask &= ~self._anc[g]
        return mask

    def _candidates(self) -> list[int]:
        """Indices the first bad point can still be, in axis order (the known bad one last)."""
        if self._anc is None:
            return list(range(self._lo + 1, min(self._hi + 1, len(self.points))))
        mask = self._cand_mask()
        return [i for i in range(len(self.points)) if mask >> i & 1]

    def _positions(self, cands: list[int]) -> dict[int, int]:
        """For each candidate: how many candidates remain if it probes bad (1..n)."""
        if self._anc is None:
            lo = self._lo
            return {i: i - lo for i in cands}
        mask = self._cand_mask()
        return {i: (self._anc[i] & mask).bit_count() for i in cands}

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.points)

    @property
    def ends_known(self) -> bool:
        """True once both ends are known (assumed, or probed as expected)."""
        return 0 in self._goods and len(self.points) - 1 in self._bads

    @property
    def in_flight(self) -> tuple[P, ...]:
        """Points handed out by ``next`` and not yet marked or cancelled, in axis order."""
        return tuple(self.points[i] for i in sorted(self._in_flight))

    @property
    def done(self) -> bool:
        """True when no probe could narrow the answer further (exact or ambiguous)."""
        if not self.ends_known:
            return False
        return all(i in self._verdict for i in self._candidates()[:-1])

    def verdict(self, point: P) -> VerdictKind | None:
        """The canonical verdict given to ``point`` (good/bad/skip), or None."""
        i = self._idx(point)
        if i in self._verdict:
            return self._verdict[i]
        return GOOD if i in self._goods else BAD if i in self._bads else None

    def remaining(self) -> tuple[P, ...]:
        """Points the first bad one could still be, oldest first."""
        if not self.ends_known:
            return self.points[1:]
        return tuple(self.points[i] for i in self._candidates())

    def obsolete(self) -> tuple[P, ...]:
        """In-flight points whose verdict can no longer narrow the range (a driver may cancel them)."""
        if not self.ends_known:
            return ()
        cands = set(self._candidates()[:-1])
        return tuple(self.points[i] for i in sorted(self._in_flight) if i not in cands)

    def steps_left(self) -> int:
        """Estimate of one-at-a-time probes still needed (``ceil(log2(candidates))``, skips ignored)."""
        if not self.ends_known:
            return max_probes(len(self.points)) + (0 not in self._goods) + (len(self.points) - 1 not in self._bads)
        n = len(self._candidates())
        return math.ceil(math.log2(n)) if n > 1 else 0

    def result(self) -> SearchResult[P]:
        """Where the boundary is now (final once ``done``)."""
        skipped = tuple(self.points[i] for i in sorted(self._verdict) if self._verdict[i] is SKIP)
        common = dict(probes=self._probes, rounds=self._rounds, skipped=skipped, terms=self.terms, size=len(self.points))
        if not self.ends_known:
            last_good = self.points[self._lo] if self._goods else None
            return SearchResult(first_bad=None, last_good=last_good, candidates=self.remaining(), done=False, ambiguous=False, **common)
        cands = self._candidates()
        done = self.done
        ambiguous = done and len(cands) > 1
        first_bad = self.points[cands[-1]] if done and not ambiguous else None
        return SearchResult(
            first_bad=first_bad, last_good=self._last_good(cands), candidates=tuple(self.points[i] for i in cands),
            done=done, ambiguous=ambiguous, **common,
        )

    def _last_good(self, cands: list[int]) -> P | None:
        if self._anc is None:
            return self.points[self._lo]
        # the newest good point that is an ancestor of the oldest candidate (its parent side)
        top = self._anc[cands[0]] if cands else 0
        best = max((g for g in self._goods if top >> g & 1), default=None)
        if best is None:
            best = max(self._goods, default=None)
        return self.points[best] if best is not None else None

    # ---------------------------------------------------------------- actions
    def next(self, k: int = 1) -> list[P]:
        """Up to ``k`` new points to probe now, and records them as in flight.

        Points already in flight count as split points, so calling ``next(free)`` each
        time a probe finishes keeps K probes busy; with nothing in flight, ``next(k)``
        splits the open range into k+1 nearly equal parts. Skipped, marked and in-flight
        points are never proposed. Returns ``[]`` when done or when every useful point is
        already in flight (wait for a verdict).
        """
        if k < 1:
            raise UsageError(f"next(k) needs k >= 1 parallel probes, got {k}")
        picked: list[int] = []
        if not self.ends_known:
            n = len(self.points)
            for i, want in ((0, 0 not in self._goods), (n - 1, n - 1 not in self._bads)):
                if want and i not in self._in_flight and i not in self._verdict and len(picked) < k:
                    picked.append(i)
        else:
            picked = self._split(k)
        if picked:
            self._rounds += 1
            for i in picked:
                self._in_flight[i] = self._rounds
        return [self.points[i] for i in picked]

    def cancel(self, point: P) -> None:
        """Forget that ``point`` is in flight without a verdict (its probe was abandoned)."""
        self._in_flight.pop(self._idx(point), None)

    def mark(self, point: P, verdict: str, *, round: int | None = None) -> None:
        """Record the verdict (good/bad/skip, old/new, or the session's terms) for ``point``.

        Marking the same verdict twice is harmless. Raises ``ContradictionError`` when the
        verdict cannot be reconciled with earlier ones and ``EndpointError`` when an end
        probes the wrong way; the state is unchanged then.
        """
        canon = self._canon(verdict)
        i = self._idx(point)
        n = len(self.points)
        prev = self._verdict.get(i)
        if prev is not None:
            if prev == canon:
                self._in_flight.pop(i, None)
                return
            raise ContradictionError(
                f"{point} was already marked {self._term(prev)}, now {self._term(canon)}: the command gives "
                "different answers on the same point (flaky?); re-run with --repeat to require agreement",
                point=point, verdict=canon, other=point, other_verdict=prev,
            )
        if i in (0, n - 1):
            expected = GOOD if i == 0 else BAD
            if canon != expected:
                which = "--good" if i == 0 else "--bad"
                hint = (
                    "it could not be tested; pick another endpoint"
                    if canon is SKIP
                    else "the change is not between the two ends; swap them, widen the range, or use other terms"
                )
                raise EndpointError(
                    f"the {self._term(expected)} end {point} ({which}) probed {self._term(canon)}: {hint}",
                    point=point, verdict=canon, end=expected,
                )
        self._check(i, canon)
        rnd = self._in_flight.pop(i, None)
        if rnd is None:
            rnd = round
        self._verdict[i] = canon
        self._probes += 1
        if canon is GOOD:
            self._goods.add(i)
        elif canon is BAD:
            self._bads.add(i)
        self.log.append({"point": point, "verdict": canon, "round": rnd})

    def _check(self, i: int, canon: VerdictKind) -> None:
        point = self.points[i]
        if canon is SKIP:
            return
        if self._anc is None:
            clash = [b for b in self._bads if b < i] if canon is GOOD else [g for g in self._goods if g > i]
        elif canon is GOOD:
            clash = [b for b in self._bads if self._anc[i] >> b & 1]  # a bad ancestor
        else:
            clash = [g for g in self._goods if self._anc[g] >> i & 1]  # a good descendant
        if not clash and self._anc is not None and canon is BAD:
            mask = self._cand_mask() & self._anc[i]
            if not mask:
                # not a descendant of the change every other bad point descends from
                clash = sorted(self._bads)[:1]
        if clash:
            j = min(clash) if canon is GOOD else max(clash)
            other, other_v = self.points[j], self._verdict.get(j, GOOD if j in self._goods else BAD)
            rel = "earlier" if j < i else "later"
            raise ContradictionError(
                f"{point} marked {self._term(canon)} but the {rel} {other} is {self._term(other_v)}: "
                "the behaviour changes more than once or the command is flaky; re-run with --repeat or narrow the range",
                point=point, verdict=canon, other=other, other_verdict=other_v,
            )

    @classmethod
    def replay(
        cls,
        points: Sequence[P],
        events: Iterable[Mapping[str, Any] | Sequence[Any]],
        *,
        terms: tuple[str, str] = ("good", "bad"),
        assume_ends: bool = True,
        parents: Mapping[P, Iterable[P]] | None = None,
    ) -> "Bisection[P]":
        """Rebuild a search from a log of ``(point, verdict)`` / ``{"point", "verdict", "round"}`` events.

        The result has the same verdicts, range, probe count and (when rounds were logged)
        round count as the live search had; nothing is in flight, so probes that were
        running when the session stopped are proposed again by ``next``. An event naming a
        point that is not on the axis raises ``UsageError`` (the history changed).
        """
        b = cls(points, terms=terms, assume_ends=assume_ends, parents=parents)
        max_round = 0
        for ev in events:
            if isinstance(ev, Mapping):
                point, verdict, rnd = ev.get("point"), ev.get("verdict"), ev.get("round")
            else:
                seq = tuple(ev)
                if len(seq) not in (2, 3):
                    raise UsageError(f"a search event is (point, verdict[, round]), got {ev!r}")
                point, verdict, rnd = seq[0], seq[1], (seq[2] if len(seq) == 3 else None)
            if not isinstance(point, Hashable) or point not in b._index:
                raise UsageError(
                    f"the session log names {point!r}, which is not on the search axis; "
                    "the history changed since the session started: start a new session"
                )
            b.mark(point, str(verdict), round=rnd)
            if isinstance(rnd, int):
                max_round = max(max_round, rnd)
        b._rounds = max(b._rounds, max_round)
        return b

    # ---------------------------------------------------------------- helpers
    def _idx(self, point: P) -> int:
        try:
            return self._index[point]
        except (KeyError, TypeError):
            raise UsageError(f"{point!r} is not a point of this search") from None

    def _canon(self, verdict: str) -> VerdictKind:
        canon = self._aliases.get(verdict)
        if canon is None:
            names = sorted(set(self._aliases))
            raise UsageError(f"unknown verdict '{verdict}' (one of {', '.join(names)})")
        return canon

    def _term(self, canon: VerdictKind) -> str:
        return {GOOD: self.terms[0], BAD: self.terms[1]}.get(canon, canon)

    def _split(self, k: int) -> list[int]:
        """Pick up to k testable candidates that split the candidates k+1 ways.

        Each candidate has a position w (how many candidates remain if it is bad); points
        in flight and the two bounds (0, n) cut the positions into gaps; new points go to
        the gaps whose parts would stay largest, spread evenly within each gap, each at
        the testable candidate whose position is nearest its target.
        """
        cands = self._candidates()
        if len(cands) <= 1:
            return []
        pos = self._positions(cands[:-1])
        n = len(cands)
        flying = sorted({pos[i] for i in self._in_flight if i in pos})
        testable = sorted((w, i) for i, w in pos.items() if i not in self._verdict and i not in self._in_flight)
        bounds = [0] + flying + [n]
        gaps = []  # [a, b, testable positions strictly inside, points assigned]
        for a, b in zip(bounds, bounds[1:]):
            gaps.append([a, b, sum(1 for w, _ in testable if a < w < b), 0])
        for _ in range(k):
            best = None
            for g in gaps:
                if g[3] < g[2]:
                    score = (g[1] - g[0]) / (g[3] + 1)
                    if best is None or score > best[0]:
                        best = (score, g)
            if best is None:
                break
            best[1][3] += 1
        picked: list[int] = []
        for a, b, _free, c in gaps:
            if not c:
                continue
            inside = [(w, i) for w, i in testable if a < w < b]
            chosen: set[int] = set()
            for j in range(1, c + 1):
                target = a + ((b - a) * j) // (c + 1)
                best_i = min(
                    ((abs(w - target), w > target, i) for w, i in inside if i not in chosen), default=None
                )
                if best_i is not None:
                    chosen.add(best_i[2])
            picked.extend(sorted(chosen))
        return picked
