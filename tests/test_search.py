"""The pure search: every path of ``Bisection`` without a repository.

An oracle marks points from a hidden answer; the tests check the answer, the probe and
round counts against their bounds, skips (everywhere, next to the answer, all of them),
terms, contradictions, endpoints, replay, and the graph mode on generated merge histories.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reprobisect.errors import ReproError, UsageError
from reprobisect.core.search import (
    Bisection,
    ContradictionError,
    EndpointError,
    SearchError,
    SearchResult,
    max_probes,
    max_rounds,
)


def run(b: Bisection, verdict, k: int = 1, *, limit: int = 10_000) -> SearchResult:
    """Drive ``b`` in synchronous rounds of k probes; ``verdict(point) -> str``."""
    for _ in range(limit):
        if b.done:
            return b.result()
        batch = b.next(k)
        assert batch, "not done but nothing to probe"
        assert len(batch) <= k and len(set(batch)) == len(batch)
        for p in batch:
            b.mark(p, verdict(p))
    raise AssertionError("search did not finish")


def line(answer: int, skips=()):
    return lambda p: "skip" if p in skips else ("bad" if p >= answer else "good")


# ----------------------------------------------------------------------------- basics
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 17, 64, 100])
def test_finds_every_answer(n: int, k: int) -> None:
    for answer in range(1, n):
        r = run(Bisection(list(range(n))), line(answer), k)
        assert r and r.done and not r.ambiguous
        assert r.first_bad == answer and r.last_good == answer - 1
        assert r.candidates == (answer,)
        assert r.probes <= max_probes(n) * k + k
        assert r.rounds <= max_rounds(n, k) + 1


def test_length_two_is_done_at_once() -> None:
    b = Bisection(["g", "b"])
    assert b.done and b.next(3) == []
    r = b.result()
    assert r.first_bad == "b" and r.last_good == "g" and r.probes == 0 and r.rounds == 0 and bool(r)


def test_length_three_needs_one_probe() -> None:
    b = Bisection(["g", "m", "b"])
    assert b.next() == ["m"]
    assert b.next() == []  # m in flight, nothing else useful
    assert not b.done
    b.mark("m", "good")
    r = b.result()
    assert r.first_bad == "b" and r.last_good == "m" and r.probes == 1


def test_answer_at_either_end() -> None:
    n = 33
    assert run(Bisection(list(range(n))), line(1)).first_bad == 1
    assert run(Bisection(list(range(n))), line(n - 1)).first_bad == n - 1


def test_k_splits_range_evenly() -> None:
    b = Bisection(list(range(13)))  # candidates 1..12
    assert b.next(1) == [6]
    b = Bisection(list(range(13)))
    assert b.next(2) == [4, 8]
    b = Bisection(list(range(13)))
    assert b.next(3) == [3, 6, 9]


def test_in_flight_points_count_as_splits() -> None:
    b = Bisection(list(range(17)))  # candidates 1..16
    first = b.next(1)
    assert first == [8]
    more = b.next(1)  # 8 in flight: the next probe goes into one half, not at 8 again
    assert more and more[0] != 8 and more[0] in (4, 12)
    assert set(b.in_flight) == {8, more[0]}
    b.mark(8, "bad" if more[0] == 12 else "good")
    # the other half is now outside the open range: its probe is obsolete
    assert b.obsolete() == (more[0],)
    assert more[0] not in b.remaining()
    b.cancel(more[0])
    assert b.in_flight == () and b.obsolete() == ()


def test_pipelined_driver_keeps_k_busy_and_finds_answer() -> None:
    rng = random.Random(3)
    for n in (10, 50, 257):
        for k in (2, 3, 4):
            answer = rng.randrange(1, n)
            b = Bisection(list(range(n)))
            flying: list[int] = []
            steps = 0
            while not b.done:
                flying += b.next(k - len(flying)) if len(flying) < k else []
                assert flying, "nothing in flight and not done"
                p = flying.pop(rng.randrange(len(flying)))  # verdicts arrive out of order
                b.mark(p, line(answer)(p))
                flying = [q for q in flying if q in b.in_flight]
                steps += 1
                assert steps < 10 * n
            assert b.result().first_bad == answer


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=2, max_value=2000), st.data())
def test_probes_bound_k1_property(n: int, data) -> None:
    answer = data.draw(st.integers(min_value=1, max_value=n - 1))
    r = run(Bisection(list(range(n))), line(answer), 1)
    assert r.first_bad == answer
    assert r.probes <= math.ceil(math.log2(n)) + 1
    assert r.probes <= max_probes(n)
    assert r.rounds == r.probes


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=2000), st.integers(min_value=2, max_value=6), st.data())
def test_rounds_bound_parallel_property(n: int, k: int, data) -> None:
    answer = data.draw(st.integers(min_value=1, max_value=n - 1))
    r = run(Bisection(list(range(n))), line(answer), k)
    assert r.first_bad == answer
    assert r.rounds <= max_rounds(n, k) + 1
    assert r.rounds <= math.ceil(math.log(n, k + 1)) + 1


# ----------------------------------------------------------------------------- skips
def test_skips_away_from_answer_do_not_change_it() -> None:
    n = 64
    skips = {p for p in range(1, n) if p % 3 == 0 and abs(p - 40) > 1}
    for k in (1, 2, 4):
        r = run(Bisection(list(range(n))), line(40, skips), k)
        assert r.first_bad == 40 and not r.ambiguous
        assert set(r.skipped) <= skips


def test_skip_next_to_answer_gives_candidate_set() -> None:
    # 39 skipped, 40 is the first bad: it could be 39 or 40
    for k in (1, 2, 3, 4):
        r = run(Bisection(list(range(64))), line(40, {39}), k)
        assert r.done and r.ambiguous and not r
        assert r.first_bad is None
        assert r.candidates == (39, 40)
        assert r.last_good == 38
        assert "could be any of: 39, 40" in str(r)


def test_skipped_answer_itself() -> None:
    # the culprit 40 cannot be tested: 40 or 41 (git bisect says the same)
    r = run(Bisection(list(range(64))), line(40, {40}))
    assert r.ambiguous and r.candidates == (40, 41)


def test_run_of_skips_before_the_answer() -> None:
    r = run(Bisection(list(range(100))), line(50, {46, 47, 48, 49}), 2)
    assert r.ambiguous and r.candidates == (46, 47, 48, 49, 50) and r.last_good == 45


def test_all_inner_points_skipped() -> None:
    n = 9
    for k in (1, 3):
        r = run(Bisection(list(range(n))), lambda p: "skip", k)
        assert r.done and r.ambiguous
        assert r.candidates == tuple(range(1, n)) and r.last_good == 0
        assert r.probes == n - 2


def test_skipped_points_are_never_proposed_again() -> None:
    b = Bisection(list(range(20)))
    seen: list[int] = []
    while not b.done:
        for p in b.next(2):
            assert p not in seen
            seen.append(p)
            b.mark(p, "skip" if p % 2 else line(13)(p))
    # 13 (the answer) is odd, so skipped: it could be 13 or the next testable bad, 14
    assert b.result().candidates == (13, 14) and b.result().last_good == 12


# ----------------------------------------------------------------------------- terms
def test_old_new_terms_find_the_fix() -> None:
    # hunting the commit that FIXED something: "broken" before, "fixed" after
    b = Bisection(list(range(30)), terms=("broken", "fixed"))
    r = run(b, lambda p: "fixed" if p >= 11 else "broken")
    assert r.first_bad == 11 and r.terms == ("broken", "fixed")
    assert "first fixed point: 11" in str(r) and "last broken: 10" in str(r)


def test_old_new_aliases_always_accepted() -> None:
    b = Bisection(list(range(10)), terms=("old", "new"))
    r = run(b, lambda p: "new" if p >= 4 else "old")
    assert r.first_bad == 4
    b = Bisection(list(range(10)))
    r = run(b, lambda p: "new" if p >= 4 else "old")
    assert r.first_bad == 4


def test_bad_terms_and_verdicts_are_refused() -> None:
    with pytest.raises(UsageError, match="term 'bad' already means 'bad'"):
        Bisection([1, 2], terms=("bad", "x"))
    with pytest.raises(UsageError, match="two different names"):
        Bisection([1, 2], terms=("x", "x"))
    b = Bisection([1, 2, 3])
    with pytest.raises(UsageError, match="unknown verdict 'maybe'"):
        b.mark(2, "maybe")
    with pytest.raises(UsageError, match="not a point of this search"):
        b.mark(7, "good")
    with pytest.raises(UsageError, match="k >= 1"):
        b.next(0)


def test_axis_must_be_valid() -> None:
    with pytest.raises(UsageError, match="at least two points"):
        Bisection(["only"])
    with pytest.raises(UsageError, match="appears twice"):
        Bisection(["a", "b", "a"])


# ----------------------------------------------------------------------------- contradictions
def test_good_after_bad_is_a_contradiction() -> None:
    b = Bisection(list(range(20)))
    b.mark(5, "bad")
    with pytest.raises(ContradictionError, match="12 marked good but the earlier 5 is bad") as ei:
        b.mark(12, "good")
    assert ei.value.other == 5 and isinstance(ei.value, SearchError) and isinstance(ei.value, ReproError)
    assert b.verdict(12) is None  # state unchanged
    b.mark(3, "good")
    with pytest.raises(ContradictionError, match="2 marked bad but the later 3 is good"):
        b.mark(2, "bad")


def test_remark_same_verdict_is_harmless_other_is_contradiction() -> None:
    b = Bisection(list(range(20)))
    b.mark(7, "good")
    b.mark(7, "old")
    assert b.result().probes == 1
    with pytest.raises(ContradictionError, match="already marked good, now skip"):
        b.mark(7, "skip")


def test_assumed_end_marked_wrong_is_endpoint_error() -> None:
    b = Bisection(list(range(5)))
    b.mark(0, "good")  # confirming an assumed end is fine
    with pytest.raises(EndpointError, match=r"bad end 4 \(--bad\) probed good"):
        b.mark(4, "good")


# ----------------------------------------------------------------------------- endpoints
def test_unverified_ends_are_probed_first() -> None:
    b = Bisection(list(range(10)), assume_ends=False)
    assert not b.done and not b.ends_known
    assert b.next(1) == [0]
    assert b.next(1) == [9]
    assert b.next(1) == []
    b.mark(0, "good")
    b.mark(9, "bad")
    assert b.ends_known
    r = run(b, line(6))
    assert r.first_bad == 6 and 2 < r.probes <= 2 + max_probes(10)


def test_state_before_the_ends_are_known() -> None:
    b = Bisection(list(range(10)), assume_ends=False)
    assert len(b) == 10 and b.remaining() == tuple(range(1, 10)) and b.obsolete() == ()
    assert b.steps_left() == max_probes(10) + 2
    b.mark(0, "good")
    r = b.result()
    assert not r and not r.done and r.last_good == 0 and r.first_bad is None
    assert b.verdict(0) == "good" and b.verdict(9) is None and b.steps_left() == max_probes(10) + 1


def test_ends_in_parallel() -> None:
    b = Bisection(list(range(10)), assume_ends=False)
    assert b.next(4) == [0, 9]
    b.mark(9, "bad")
    b.mark(0, "good")
    assert len(b.next(4)) == 4


@pytest.mark.parametrize(
    "point,verdict,match",
    [
        (0, "bad", r"good end 0 \(--good\) probed bad: the change is not between the two ends; swap them"),
        (9, "good", r"bad end 9 \(--bad\) probed good"),
        (0, "skip", r"good end 0 \(--good\) probed skip: it could not be tested; pick another endpoint"),
    ],
)
def test_ends_that_probe_wrong_refuse_to_start(point: int, verdict: str, match: str) -> None:
    b = Bisection(list(range(10)), assume_ends=False)
    with pytest.raises(EndpointError, match=match) as ei:
        b.mark(point, verdict)
    assert ei.value.end == ("good" if point == 0 else "bad")


def test_custom_terms_in_endpoint_message() -> None:
    b = Bisection(list(range(10)), assume_ends=False, terms=("slow", "fast"))
    with pytest.raises(EndpointError, match=r"the slow end 0 \(--good\) probed fast"):
        b.mark(0, "fast")


# ----------------------------------------------------------------------------- replay
@pytest.mark.parametrize("k", [1, 3])
def test_replay_equals_live(k: int) -> None:
    n, answer, skips = 200, 117, {100, 116, 150}
    live = Bisection(list(range(n)))
    partial_log = None
    steps = 0
    while not live.done:
        for p in live.next(k):
            live.mark(p, line(answer, skips)(p))
        steps += 1
        if steps == 2:
            partial_log = json.loads(json.dumps(live.log))  # as a session log would hold it
    final = live.result()
    # replaying the whole log gives the same result
    again = Bisection.replay(list(range(n)), json.loads(json.dumps(live.log)))
    assert again.result() == final and again.log == live.log
    assert [again.verdict(p) for p in range(n)] == [live.verdict(p) for p in range(n)]
    # resuming from the middle finishes at the same answer and the same total
    resumed = Bisection.replay(list(range(n)), partial_log)
    assert resumed.result().probes == len(partial_log)
    r = run(resumed, line(answer, skips), k)
    assert (r.first_bad, r.candidates, r.probes, r.rounds) == (final.first_bad, final.candidates, final.probes, final.rounds)


def test_replay_of_tuples_and_in_flight_reissued() -> None:
    pts = list("abcdefghijklmnop")
    b = Bisection(pts)
    b.mark("c", "good")
    first = b.next(2)
    assert len(first) == 2 and set(b.in_flight) == set(first)
    # both were in flight when the session stopped: replay proposes them again
    r = Bisection.replay(pts, [("c", "good")])
    assert r.in_flight == () and r.result().probes == 1
    assert r.next(2) == first


def test_replay_rejects_foreign_points_and_contradictions() -> None:
    with pytest.raises(UsageError, match="the session log names 'zzz'.*history changed"):
        Bisection.replay(list("abc"), [("zzz", "good")])
    with pytest.raises(ContradictionError):
        Bisection.replay(list(range(10)), [(3, "bad"), (6, "good")])
    with pytest.raises(UsageError, match="a search event is"):
        Bisection.replay(list(range(10)), [(3,)])


def test_result_json_round_trip() -> None:
    r = run(Bisection([f"c{i}" for i in range(40)]), lambda p: "bad" if int(p[1:]) >= 21 else "good")
    d = json.loads(json.dumps(r.to_json()))
    assert d["first_bad"] == "c21" and d["last_good"] == "c20" and d["candidates"] == ["c21"] and d["size"] == 40
    assert SearchResult(**{**d, "candidates": tuple(d["candidates"]), "skipped": tuple(d["skipped"]), "terms": tuple(d["terms"])}) == r


def test_bounds_helpers() -> None:
    assert [max_probes(n) for n in (2, 3, 4, 5, 9, 257)] == [0, 1, 2, 2, 3, 8]
    assert max_rounds(257, 1) == 8 and max_rounds(257, 3) == 4 and max_rounds(2, 4) == 0


def test_unfinished_result_is_falsy() -> None:
    b = Bisection(list(range(100)))
    r = b.result()
    assert not r and not r.done and len(r.candidates) == 99
    assert "not finished" in str(r)
    assert b.steps_left() == 7
    assert b.remaining() == tuple(range(1, 100))


# ----------------------------------------------------------------------------- graph mode
def random_dag(rng: random.Random, n: int, merge_p: float = 0.3):
    """A history: points in topological order, parents, point 0 the root (good end)."""
    pts = [f"c{i}" for i in range(n)]
    parents: dict[str, list[str]] = {pts[0]: []}
    for i in range(1, n):
        ps = [pts[rng.randrange(max(0, i - 5), i)]]
        if i > 2 and rng.random() < merge_p:
            q = pts[rng.randrange(0, i)]
            if q not in ps:
                ps.append(q)
        parents[pts[i]] = ps
    # the bad end must descend from everything (like rev-list --ancestry-path good..bad)
    parents[pts[-1]] = [p for p in pts[:-1] if not any(p in parents[c] for c in pts[:-1])] or [pts[-2]]
    return pts, parents


def ancestors(parents, x):
    seen, todo = set(), [x]
    while todo:
        y = todo.pop()
        if y not in seen:
            seen.add(y)
            todo += parents.get(y, [])
    return seen


@pytest.mark.parametrize("k", [1, 2, 3])
def test_graph_mode_finds_culprit_on_any_branch(k: int) -> None:
    rng = random.Random(k)
    for trial in range(30):
        pts, parents = random_dag(rng, rng.randrange(3, 40))
        anc = {p: ancestors(parents, p) for p in pts}
        for culprit in pts[1:]:
            b = Bisection(pts, parents=parents)
            r = run(b, lambda p: "bad" if culprit in anc[p] else "good", k)
            assert r.first_bad == culprit, (trial, culprit)
            assert r.last_good in anc[culprit] and r.last_good != culprit


def side_branch_history():
    # A - B - C - M - D, side branch A - S1 - S2 - M; the order lists the mainline after the side
    parents = {"A": [], "S1": ["A"], "S2": ["S1"], "B": ["A"], "C": ["B"], "M": ["C", "S2"], "D": ["M"]}
    return ["A", "S1", "S2", "B", "C", "M", "D"], parents


def test_graph_mode_side_branch_culprit_where_a_line_fails() -> None:
    pts, parents = side_branch_history()
    anc = {p: ancestors(parents, p) for p in pts}
    verdict = lambda p: "bad" if "S1" in anc[p] else "good"  # noqa: E731
    r = run(Bisection(pts, parents=parents), verdict)
    assert r.first_bad == "S1" and r.last_good == "A"
    # the same order bisected as a line probes B (good), then C (good), M (bad): it names the
    # merge that brought the change in, not the commit that made it
    assert run(Bisection(pts), verdict).first_bad == "M"
    # and when it probes the side branch first, the mainline after it contradicts
    b = Bisection(pts)
    b.mark("S2", "bad")
    with pytest.raises(ContradictionError, match="B marked good but the earlier S2 is bad"):
        b.mark("B", "good")


def test_graph_mode_skips_give_candidates_and_contradictions() -> None:
    pts, parents = side_branch_history()
    anc = {p: ancestors(parents, p) for p in pts}
    r = run(Bisection(pts, parents=parents), lambda p: "skip" if p == "S1" else ("bad" if "S1" in anc[p] else "good"))
    assert r.ambiguous and set(r.candidates) == {"S1", "S2"}
    b = Bisection(pts, parents=parents)
    b.mark("S2", "bad")
    with pytest.raises(ContradictionError, match="S2 is bad"):
        b.mark("M", "good")  # M descends from bad S2
    b2 = Bisection(pts, parents=parents)
    b2.mark("S2", "bad")
    with pytest.raises(ContradictionError):
        b2.mark("C", "bad")  # C shares no candidate with S2: two separate changes


def test_graph_mode_ignores_parents_off_the_axis() -> None:
    # like commit_parents for a range: the oldest commits' parents lie before the good end
    pts = ["G", "x", "y", "B"]
    parents = {"G": ["older"], "x": ["G", "elsewhere"], "y": ["x"], "B": ["y"]}
    r = run(Bisection(pts, parents=parents), lambda p: "bad" if p in ("y", "B") else "good")
    assert r.first_bad == "y" and r.last_good == "x"


def test_graph_mode_refuses_non_topological_order() -> None:
    with pytest.raises(UsageError, match="comes before its parent"):
        Bisection(["A", "C", "B"], parents={"C": ["B"], "B": ["A"]})


def test_graph_mode_on_a_chain_matches_line_mode() -> None:
    n = 50
    pts = list(range(n))
    parents = {i: [i - 1] for i in range(1, n)}
    for answer in range(1, n):
        a = run(Bisection(pts, parents=parents), line(answer))
        b = run(Bisection(pts), line(answer))
        assert a.first_bad == b.first_bad == answer
        assert a.probes == b.probes


def test_steps_axis_generic() -> None:
    steps = list(range(0, 1000, 10))  # any ordered axis of hashable points
    r = run(Bisection(steps, terms=("same", "diverged")), lambda s: "diverged" if s >= 370 else "same", 2)
    assert r.first_bad == 370 and r.last_good == 360


def feature_branch_history(rng: random.Random, n: int):
    """A mainline where some commits start short feature branches that merge back."""
    parents: dict[int, list[int]] = {0: []}
    tip, i = 0, 1
    while i < n - 1:
        if rng.random() < 0.3 and i + 3 < n - 1:
            start = tip
            branch = start
            for _ in range(rng.randint(1, 4)):
                if i >= n - 2:
                    break
                parents[i] = [branch]
                branch = i
                i += 1
            parents[i] = [tip, branch] if branch != tip else [tip]  # the merge
        else:
            parents[i] = [tip]
        tip = i
        i += 1
    parents[n - 1] = [tip]
    return list(range(n)), parents


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=3, max_value=300), st.integers(min_value=0, max_value=10**6), st.data())
def test_graph_mode_probe_bound_on_feature_branch_histories(n: int, seed: int, data) -> None:
    pts, parents = feature_branch_history(random.Random(seed), n)
    anc = {p: ancestors(parents, p) for p in pts}
    culprit = data.draw(st.sampled_from(pts[1:]))
    r = run(Bisection(pts, parents=parents), lambda p: "bad" if culprit in anc[p] else "good")
    assert r.first_bad == culprit
    assert r.probes <= math.ceil(math.log2(n)) + 2
