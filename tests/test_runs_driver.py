"""The ``bisect runs`` driver with a fake executor: its logic in milliseconds, no framework.

A real git repository (commits of a text file) in a tmp folder gives the driver a real
history, lock, session log and cache; the executor is a fake whose results come from a
table commit -> behaviour. Behaviours that record write real tiny traces with
``reprobisect.trace.writer`` (NumPy arrays), so the real comparison judges them; the
others return the outcome a real probe would (crashed, timeout, infra, skip, no_steps).
The end-to-end tests with real torch probes are ``tests/test_runs.py``.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from reprobisect.core.compare import Comparison, Tolerance
from reprobisect.core.options import ProbeOptions
from reprobisect.core.outcome import Outcome
from reprobisect.core.verdict import compare_results
from reprobisect.errors import ProbeError
from reprobisect.executors.base import Executor, ProbeResult, ProbeSpec
from reprobisect.render.runs import divergence_place
from reprobisect.trace import record_array
from reprobisect.trace.writer import TraceWriter
from reprobisect.workflows.runs import RunsConfig, RunsResult, find_first_bad

STEPS = 3
CMD = ("python", "train.py")

# a behaviour: 'good' (the reference numbers), 'bad' (other numbers from step 0),
# 'bad@S' (other numbers from step S on), 'nan' (a NaN from step 1), or an outcome that
# leaves no usable trace: 'crashed', 'timeout', 'infra', 'skip', 'no_steps'.
# A list is used one entry per probe of that commit, in order, the last one repeated.
Behaviour = str | list[str]


class FakeExecutor:
    """Probes decided by a table commit -> behaviour; runs in the calling thread."""

    name = "fake"

    def __init__(self, traces: Path, table: dict[str, Behaviour], max_parallel: int = 2) -> None:
        self.traces = traces
        self.table = table
        self.max_parallel = max_parallel
        self.calls: list[tuple[str, int]] = []  # (commit, attempt) of every submitted probe
        self.closed = False
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def submit(self, spec: ProbeSpec) -> "Future[ProbeResult]":
        fut: Future[ProbeResult] = Future()
        try:
            fut.set_result(self._run(spec))
        except BaseException as e:  # the real executors hand errors back through the future too
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        self.closed = True

    def probes_of(self, commit: str) -> int:
        return sum(1 for c, _ in self.calls if c == commit)

    def _behaviour(self, spec: ProbeSpec) -> tuple[str, int]:
        """(this probe's behaviour, a number unique to this probe); records the call."""
        commit = str(spec.revision)
        with self._lock:
            n = self.probes_of(commit)
            self.calls.append((commit, spec.attempt))
            i = next(self._ids)
        b = self.table.get(commit, "good")
        return (b[min(n, len(b) - 1)] if isinstance(b, list) else b), i

    def _run(self, spec: ProbeSpec) -> ProbeResult:
        assert spec.revision is not None and spec.steps == STEPS
        behaviour, i = self._behaviour(spec)
        if behaviour in ("timeout", "infra", "skip", "no_steps", "crashed"):
            out = Outcome(behaviour, "the fake said so", step=1 if behaviour == "crashed" else None)
            return ProbeResult(spec=spec, outcome=out, commit_ran=spec.revision,
                               output_tail="Traceback (most recent call last):\nValueError: boom\n")
        trace = self.traces / f"{spec.key}-{spec.attempt}-{i}"
        _write_trace(trace, behaviour)
        return ProbeResult(spec=spec, outcome=Outcome("ok"), trace_dir=str(trace), commit_ran=spec.revision)


def _write_trace(path: Path, behaviour: str) -> None:
    at = 0 if behaviour == "bad" else int(behaviour[4:]) if behaviour.startswith("bad@") else None
    with TraceWriter(path, command=list(CMD), environment={"device": "cpu"}, seed=0) as w:
        for step in range(STEPS):
            w.begin_step(step)
            a = np.full((4,), 1.0 + step, dtype=np.float32)
            if at is not None and step >= at:
                a = a + 0.5
            if behaviour == "nan" and step >= 1:
                a[0] = np.nan
            w.record(record_array("fc.weight", "param", a))
            w.end_step({"loss": float(a[0])})


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, list[str]]:
    """A repository of 8 commits of one text file (no Python code: the fake runs nothing)."""
    root = tmp_path_factory.mktemp("driver") / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "T")
    commits = []
    for i in range(8):
        (root / "value.txt").write_text(f"{i}\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"commit {i}")
        commits.append(_git(root, "rev-parse", "HEAD"))
    return root, commits


def _run(history, tmp_path, table: dict[int, Behaviour], **kw) -> tuple[RunsResult, FakeExecutor]:
    ex = _fake(history, tmp_path, table)
    return find_first_bad(_cfg(history, tmp_path, **kw), executor=ex), ex


def _fake(history, tmp_path, table: dict[int, Behaviour]) -> FakeExecutor:
    _, commits = history
    (tmp_path / "traces").mkdir(parents=True, exist_ok=True)
    return FakeExecutor(tmp_path / "traces", {commits[i]: b for i, b in table.items()})


def _cfg(history, tmp_path, **kw) -> RunsConfig:
    root, commits = history
    return RunsConfig(cwd=str(root), good=kw.pop("good", commits[0]), bad=kw.pop("bad", commits[-1]), command=CMD,
                      cache_dir=str(tmp_path / "cache"), options=ProbeOptions(jobs=kw.pop("jobs", 2), quiet=True,
                                                                              steps=STEPS), **kw)


def _bad_from(i: int, n: int = 8, bad: str = "bad") -> dict[int, Behaviour]:
    return {k: ("good" if k < i else bad) for k in range(n)}


def test_the_fake_is_an_executor(history, tmp_path):
    assert isinstance(_fake(history, tmp_path, {}), Executor)


def test_names_the_first_bad_commit_and_where_it_diverges(history, tmp_path):
    _, commits = history
    r, ex = _run(history, tmp_path, _bad_from(5, bad="bad@1"))
    assert r and r.first_bad is not None and r.first_bad.hash == commits[5]
    assert r.first_bad.subject == "commit 5" and r.last_good is not None and r.last_good.hash == commits[4]
    assert r.recheck == "agreed" and r.divergence is not None and r.divergence["first"]["step"] == 1
    text = str(r)
    assert text.startswith(f"first bad commit: {commits[5]}\n    commit 5\n"), text
    assert "why bad: differs from the good commit's trace at step 1 · param · fc.weight" in text
    assert f"searched --good {commits[0][:10]} .. --bad {commits[-1][:10]}" in text
    data = json.loads(json.dumps(r.to_json()))
    assert data["found"] is True and data["first_bad"]["hash"] == commits[5] and data["inconclusive"] is None
    # the culprit and its parent were re-run (uncached) and the executor is the caller's to close
    assert ex.probes_of(commits[5]) == 2 and ex.probes_of(commits[4]) == 2 and not ex.closed
    # a second session is served from the cache: only the re-check runs again
    r2, ex2 = _run(history, tmp_path, _bad_from(5, bad="bad@1"))
    # (how many search probes ran depends on which of two parallel probes answered first:
    # the second search may take another path, but every verdict it needs is cached)
    assert r2.first_bad == r.first_bad and r2.cached > 2
    # (under load the other path may reach a commit the first session never probed: nothing
    # the first session judged runs again but the re-check of the culprit and its parent)
    again = {c for c, _ in ex2.calls}
    assert {commits[4], commits[5]} <= again
    assert not ({c for c, _ in ex.calls} - {commits[4], commits[5]}) & again


def test_skip_next_to_the_culprit_gives_could_be_any_of(history, tmp_path):
    _, commits = history
    table = _bad_from(5)
    table[4] = "skip"
    r, _ = _run(history, tmp_path, table)
    assert not r and r.first_bad is None
    assert [c.hash for c in r.candidates] == [commits[4], commits[5]]
    assert dict(r.skipped)[commits[4]].startswith("probe could not test: skip")
    text = str(r)
    assert text.startswith("the first bad commit could be any of (2; skipped commits border it):"), text
    assert f"    {commits[4][:10]} commit 4  [skipped: probe could not test: skip" in text
    assert r.recheck == "skipped" and r.to_json()["found"] is False


def test_timeout_and_infra_are_retried_once_then_skipped(history, tmp_path):
    _, commits = history
    table = _bad_from(5)
    table[4], table[3] = "timeout", ["infra", "good"]
    r, ex = _run(history, tmp_path, table, jobs=1)
    assert [a for c, a in ex.calls if c == commits[4]][:2] == [0, 1]  # the retry is attempt 1
    assert ex.probes_of(commits[3]) >= 2 and commits[3] not in dict(r.skipped)  # the retry was good
    assert dict(r.skipped)[commits[4]].startswith("probe could not test: timeout")
    assert [c.hash for c in r.candidates] == [commits[4], commits[5]]
    # a timeout is not a fact about the code: never cached, so a later session probes it again
    _, ex2 = _run(history, tmp_path, table, jobs=1)
    assert ex2.probes_of(commits[4]) == 2


@pytest.mark.parametrize("behaviour", ["crashed", "no_steps"])
def test_an_endpoint_that_does_not_probe_as_its_flag_says_is_refused(history, tmp_path, behaviour):
    _, commits = history
    with pytest.raises(ProbeError, match=f"--good {commits[0]} does not probe good: "):
        _run(history, tmp_path, {0: behaviour, **{k: "bad" for k in range(1, 8)}})
    with pytest.raises(ProbeError, match="--bad .* does not probe bad: it probes good like --good"):
        _run(history, tmp_path / "b", {})
    with pytest.raises(ProbeError, match="--bad .* does not probe bad: it could not be tested"):
        _run(history, tmp_path / "c", {7: "skip"})


def test_repeat_turns_a_flaky_commit_into_a_skip(history, tmp_path):
    _, commits = history
    table = _bad_from(5)
    table[5] = ["good", "bad"]  # the two runs of the repeat disagree
    r, ex = _run(history, tmp_path, table, repeat=2)
    assert dict(r.skipped)[commits[5]] == "flaky: bad 1, good 1 of 2 runs"
    assert not r and [c.hash for c in r.candidates] == [commits[5], commits[6]]
    assert ex.probes_of(commits[0]) == 2  # every probe ran twice, the endpoints too


def test_terms_hunt_the_commit_that_fixed_training(history, tmp_path):
    _, commits = history
    table = {k: ("nan" if k < 3 else "good") for k in range(8)}
    r, _ = _run(history, tmp_path, table, check="finite", terms=("broken", "fixed"))
    assert r and r.first_bad is not None and r.first_bad.hash == commits[3]
    text = str(r)
    assert text.startswith(f"first fixed commit: {commits[3]}"), text
    assert "first divergence against the last broken commit" in text
    assert r.to_json()["terms"] == ["broken", "fixed"]
    # with the default terms the same history is refused: --good does not probe good
    with pytest.raises(ProbeError, match="does not probe good"):
        _run(history, tmp_path, table, check="finite")


def test_a_recheck_that_disagrees_names_no_culprit(history, tmp_path):
    _, commits = history
    table = _bad_from(5)
    table[5] = ["bad", "good"]  # bad in the search, good when re-run
    r, _ = _run(history, tmp_path, table)
    assert not r and r.first_bad is not None and r.first_bad.hash == commits[5]
    assert r.recheck.startswith(f"disagreed: on re-run {commits[4][:10]} probed good and {commits[5][:10]} probed good")
    text = str(r)
    assert text.startswith("inconclusive: on re-run"), text
    assert f"the search pointed at {commits[5][:10]} commit 5 (not confirmed: no culprit is named)" in text
    assert "re-check disagreed (inconclusive)" in text
    data = r.to_json()
    assert data["found"] is False and data["inconclusive"].startswith("on re-run")


def test_a_first_divergence_that_moves_between_runs_is_inconclusive(history, tmp_path):
    _, commits = history
    table = _bad_from(5)
    table[5] = ["bad@2", "bad@0"]  # bad both times, but first diverging at another step
    r, _ = _run(history, tmp_path, table)
    assert not r and r.recheck.startswith(f"disagreed: the first divergence of {commits[5][:10]} moves between runs")
    assert "step 2 · param · fc.weight in the search; step 0 · param · fc.weight in the re-check" in r.recheck


def test_resume_after_an_interrupted_session_picks_up_the_log(history, tmp_path):
    _, commits = history
    table = _bad_from(6)
    seen = []

    def interrupt(ev):
        seen.append(ev)
        if sum(e.role == "search" for e in seen) == 2:
            raise KeyboardInterrupt

    ex = _fake(history, tmp_path, table)
    with pytest.raises(KeyboardInterrupt):
        find_first_bad(_cfg(history, tmp_path, jobs=1), executor=ex, on_event=interrupt)
    log = Path(_cfg_log(tmp_path))
    assert sum('"role": "search"' in ln for ln in log.read_text().splitlines()) == 2
    # the cache is gone: every verdict of the first session comes back from its log
    shutil.rmtree(tmp_path / "cache" / "cache")
    r, ex2 = _run(history, tmp_path, table, jobs=1, resume=True)
    assert r and r.first_bad is not None and r.first_bad.hash == commits[6]
    assert r.resumed and r.replayed == 2
    assert "(resumed: 2 replayed from the session log)" in str(r)
    fresh, _ = _run(history, tmp_path / "fresh", table, jobs=1)
    assert fresh.first_bad == r.first_bad and r.probes == fresh.probes
    searched = {c for c, _ in ex.calls} - {commits[0], commits[7]}
    assert not searched & ({c for c, _ in ex2.calls} - {commits[5], commits[6]})  # nothing judged twice


def _cfg_log(tmp_path: Path) -> str:
    logs = list((tmp_path / "cache" / "sessions").glob("*.jsonl"))
    assert len(logs) == 1, logs
    return str(logs[0])


def test_the_session_log_holds_every_judged_probe_by_role(history, tmp_path):
    _, commits = history
    r, _ = _run(history, tmp_path, _bad_from(5), jobs=1)
    lines = [json.loads(ln) for ln in Path(r.session_log).read_text().splitlines()]
    events = [(e["role"], e["point"], e["verdict"]) for e in lines[1:]]
    assert events[:2] == [("endpoint", commits[0], "good"), ("endpoint", commits[7], "bad")]
    assert {e[1] for e in events if e[0] == "recheck"} == {commits[4], commits[5]}
    assert len([e for e in events if e[0] == "search"]) == r.probes


def test_divergence_place_says_what_a_structure_only_difference_is(tmp_path):
    for name, at in (("a", None), ("b", "bad@1")):
        _write_trace(tmp_path / name, at or "good")
    comp = compare_results(tmp_path / "a", tmp_path / "b", "bitwise")
    assert divergence_place(comp, structure_only=None) == "step 1 · param · fc.weight"
    assert divergence_place(compare_results(tmp_path / "a", tmp_path / "a"), structure_only="structure") is None
    # traces that differ in structure only (no tensor diverges): no place for runs, "structure" for repro
    only = Comparison(a="a", b="b", tolerance=Tolerance(), tolerance_reason="", env=(), steps_a=(0,), steps_b=(0, 1),
                      steps_compared=1, records_compared=1, first=None, structure="A has 1 step(s), B has 2")
    assert not only
    assert divergence_place(only, structure_only=None) is None
    assert divergence_place(only, structure_only="structure") == "structure"
