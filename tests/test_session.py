"""Session log and result cache: append + fsync, torn tails, replay data, atomic cache entries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reprobisect.errors import UsageError
from reprobisect.core.session import ResultCache, SessionEvent, SessionLog, cache_key, probe_environment


def test_log_round_trip(tmp_path):
    log = SessionLog.create(tmp_path / "s.jsonl", {"good": "a", "bad": "b", "command": ["python", "x.py"]})
    log.append(SessionEvent(point="c1", verdict="good", role="endpoint"))
    log.append(SessionEvent(point="c5", verdict="bad", reason="diverged", outcome={"status": "ok"}))
    log.append(SessionEvent(point="c3", verdict="skip", reason="flaky"))
    back = SessionLog.load(tmp_path / "s.jsonl")
    assert back.header["good"] == "a" and back.header["command"] == ["python", "x.py"]
    assert [e.point for e in back] == ["c1", "c5", "c3"]
    assert back.search_events() == [("c5", "bad"), ("c3", "skip")]
    assert back.events[1].outcome == {"status": "ok"} and back.events[2].reason == "flaky"


def test_torn_last_line_is_ignored_and_repaired(tmp_path):
    p = tmp_path / "s.jsonl"
    log = SessionLog.create(p, {"good": "a"})
    log.append(SessionEvent(point="c1", verdict="bad"))
    with open(p, "a") as f:
        f.write('{"type": "probe", "point": "c2", "ver')  # killed mid-write
    back = SessionLog.load(p)
    assert back.search_events() == [("c1", "bad")]
    back.append(SessionEvent(point="c3", verdict="good"))
    again = SessionLog.load(p)
    assert again.search_events() == [("c1", "bad"), ("c3", "good")]
    assert all(json.loads(line) for line in p.read_text().splitlines())


def test_log_killed_process_leaves_consistent_log(tmp_path):
    p = tmp_path / "s.jsonl"
    code = f"""
import os
from reprobisect.core.session import SessionLog, SessionEvent
log = SessionLog.create({str(p)!r}, {{"good": "a"}})
for i in range(5):
    log.append(SessionEvent(point=f"c{{i}}", verdict="good"))
os._exit(9)
"""
    r = subprocess.run([sys.executable, "-c", code])
    assert r.returncode == 9
    assert [e.point for e in SessionLog.load(p)] == [f"c{i}" for i in range(5)]


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="nothing to resume"):
        SessionLog.load(tmp_path / "absent.jsonl")
    bad = tmp_path / "foreign.jsonl"
    bad.write_text('{"hello": 1}\n')
    with pytest.raises(UsageError, match="not a reprobisect session log"):
        SessionLog.load(bad)
    newer = tmp_path / "newer.jsonl"
    newer.write_text('{"type": "session", "version": 99}\n')
    with pytest.raises(UsageError, match="newer"):
        SessionLog.load(newer)
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"type": "session", "version": 1}\nnot json\n{"type": "probe"}\n')
    with pytest.raises(UsageError, match=":2: session log line is not JSON"):
        SessionLog.load(garbage)


def test_cache_key_is_stable_and_sensitive():
    base = dict(commit="abc", command=["python", "t.py"], env={"x": 1}, steps=3, check="match")
    assert cache_key(**base) == cache_key(**dict(reversed(list(base.items()))))
    for k, v in [("commit", "abd"), ("command", ["python", "t.py", "--lr", "1"]), ("steps", 4), ("check", "finite"), ("env", {"x": 2})]:
        assert cache_key(**{**base, k: v}) != cache_key(**base), k


def test_probe_environment_sees_relevant_env(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = probe_environment(env={"OMP_NUM_THREADS": "1"})
    assert env["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["env"]["OMP_NUM_THREADS"] == "1"
    assert env["python"] == sys.executable and "numpy" in env["packages"]
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert probe_environment() != env


def test_probe_environment_imports_no_framework():
    code = "import sys; from reprobisect.core.session import probe_environment; probe_environment(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_cache_put_get_with_trace(tmp_path):
    cache = ResultCache(tmp_path / "cache")
    trace = tmp_path / "t"
    trace.mkdir()
    (trace / "manifest.json").write_text("{}")
    (trace / "steps.jsonl").write_text("x\n")
    key = cache_key(commit="abc")
    assert cache.get(key) is None and key not in cache
    cache.put(key, verdict="bad", reason="diverged at step 0", outcome={"status": "ok"}, trace=trace)
    e = cache.get(key)
    assert e.verdict == "bad" and e.reason == "diverged at step 0" and e.outcome == {"status": "ok"}
    assert (e.trace / "steps.jsonl").read_text() == "x\n"
    # the original trace can go away: the cache holds its own copy
    (trace / "steps.jsonl").unlink()
    assert (cache.get(key).trace / "steps.jsonl").is_file()
    # overwrite replaces the entry whole
    cache.put(key, verdict="good")
    assert cache.get(key).verdict == "good" and cache.get(key).trace is None
    # an entry whose trace was deleted is a miss, not a broken hit
    k2 = cache_key(commit="def")
    (trace / "steps.jsonl").write_text("y\n")
    cache.put(k2, verdict="good", trace=trace)
    import shutil

    shutil.rmtree(cache.trace_path(k2))
    assert cache.get(k2) is None
    assert not [p for p in (tmp_path / "cache" / "results").iterdir() if p.name.startswith(".")]


# every corruption is one UsageError that says to start afresh; only a torn LAST line is forgiven
HEAD = '{"type": "session", "version": 1, "good": "a", "bad": "b"}\n'
PROBE = '{"type": "probe", "point": "c1", "verdict": "good", "role": "search"}\n'
CORRUPTIONS = {
    "bad JSON mid-file": (HEAD + "{oops\n" + PROBE, ":2: session log line is not JSON"),
    "header is a list": ("[1, 2]\n" + PROBE, "JSON list, not an object"),
    "probe line is a number": (HEAD + "42\n", ":2: session log line is a JSON int"),
    "header version is text": ('{"type": "session", "version": "one"}\n', "no valid version"),
    "header version is zero": ('{"type": "session", "version": 0}\n', "no valid version"),
    "point is a number": (HEAD + '{"type": "probe", "point": 123, "verdict": "good"}\n', "'point' is int 123, not str"),
    "verdict unknown": (HEAD + '{"type": "probe", "point": "c1", "verdict": "maybe"}\n', "verdict 'maybe' is not one of"),
    "role unknown": (HEAD + '{"type": "probe", "point": "c1", "verdict": "bad", "role": "x"}\n', "role 'x' is not one of"),
    "attempts wrong type": (HEAD + '{"type": "probe", "point": "c1", "verdict": "bad", "attempts": "2"}\n', "'attempts' is str"),
    "outcome wrong type": (HEAD + '{"type": "probe", "point": "c1", "verdict": "bad", "outcome": [1]}\n', "'outcome' is list"),
    "point missing": (HEAD + '{"type": "probe", "verdict": "bad"}\n', "no 'point'"),
    "line of another version": (HEAD + '{"type": "probe-v2", "point": "c1"}\n', "unknown line type 'probe-v2'"),
    "two headers": (HEAD + HEAD, "a second session header"),
    "not UTF-8": (HEAD.encode() + b"\xff\xfe\x00garbage\n", "not text"),
    "only a torn header": ('{"type": "session", "vers', "empty session log"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupted_log_is_one_line_saying_start_afresh(tmp_path, name):
    content, message = CORRUPTIONS[name]
    p = tmp_path / "s.jsonl"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UsageError, match=message) as info:
        SessionLog.load(p)
    text = str(info.value)
    assert "\n" not in text and ("without --resume" in text or "upgrade" in text), text


def test_only_a_torn_last_line_is_forgiven(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(HEAD + PROBE + '{"type": "probe", "point": "c2", "ver')
    assert [e.point for e in SessionLog.load(p)] == ["c1"]


def test_round_is_logged_and_read_back(tmp_path):
    log = SessionLog.create(tmp_path / "s.jsonl", {"good": "a"})
    log.append(SessionEvent(point="c1", verdict="bad", round=2))
    back = SessionLog.load(tmp_path / "s.jsonl")
    assert back.search_rounds() == [{"point": "c1", "verdict": "bad", "round": 2}]
