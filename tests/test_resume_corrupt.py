"""``bisect runs --resume`` over corrupted, foreign and truncated session logs: one line, never a traceback.

A tiny real git repository whose command records no step (no torch): the first session
stops at its --good endpoint, but its log exists; each test corrupts that log and resumes.
Everything is refused before any probe runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect.errors import ProbeError, UsageError
from reprobisect.core.options import ProbeOptions
from reprobisect.workflows.runs import RunsConfig, find_first_bad

ROOT = Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume") / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    commits = []
    for i in range(4):
        (root / "fast.py").write_text(f"print('commit {i}')\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"c{i}")
        commits.append(_git(root, "rev-parse", "HEAD").strip())
    cfg = RunsConfig(cwd=str(root), good=commits[0], bad=commits[-1], command=("python", "fast.py"),
                     options=ProbeOptions(quiet=True))
    with pytest.raises(ProbeError):
        find_first_bad(cfg)
    (log,) = (root / ".git" / "reprobisect" / "sessions").glob("*.jsonl")
    return root, commits, cfg, log, log.read_text()


def _probe(point: str, verdict: str, role: str = "search", **kw) -> str:
    return json.dumps({"type": "probe", "point": point, "verdict": verdict, "role": role, **kw}) + "\n"


def _header(text: str, **changes) -> str:
    head = json.loads(text.splitlines()[0])
    head.update(changes)
    return json.dumps(head) + "\n"


def _corruptions(commits, original):
    good, bad = commits[0], commits[-1]
    ends = _probe(good, "good", "endpoint") + _probe(bad, "bad", "endpoint")
    return {
        "bad JSON mid-file": (original + "{torn\n" + ends, "not JSON"),
        "wrong types": (original + _probe(good, "good", "endpoint", attempts="two"), "'attempts' is str"),
        "header for another search": (_header(original, command=["python", "other.py"]) + ends, "for another search"),
        "header with other endpoints": (_header(original, good=commits[1]) + ends, "its good differ"),
        "lines of another version": (original + json.dumps({"type": "verdict", "commit": good}) + "\n", "unknown line type"),
        "newer version": (_header(original, version=99), "newer than this reprobisect"),
        "truncated to nothing": ("", "empty session log"),
        "a commit not in the range": (original + _probe("f" * 40, "bad"), "not in this range"),
        "contradicting verdicts": (original + ends + _probe(commits[1], "bad") + _probe(commits[2], "good"), "cannot be replayed"),
    }


@pytest.mark.parametrize("name", ["bad JSON mid-file", "wrong types", "header for another search",
                                  "header with other endpoints", "lines of another version", "newer version",
                                  "truncated to nothing", "a commit not in the range", "contradicting verdicts"])
def test_corrupted_log_refuses_resume_in_one_line(session, name):
    root, commits, cfg, log, original = session
    content, message = _corruptions(commits, original)[name]
    try:
        log.write_text(content)
        with pytest.raises(UsageError, match=message) as info:
            find_first_bad(RunsConfig(**{**cfg.__dict__, "resume": True}))
        assert "\n" not in str(info.value)
        assert "without --resume" in str(info.value)
    finally:
        log.write_text(original)


def test_cli_resume_over_a_corrupted_log_is_one_line_exit_2(session):
    root, commits, cfg, log, original = session
    try:
        log.write_text(original + '{"type": "probe", "point": 7, "verdict": "good"}\n')
        r = subprocess.run([sys.executable, "-m", "reprobisect", "runs", "--good", commits[0], "--bad", commits[-1],
                            "--resume", "-q", "--", "python", "fast.py"], cwd=root, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        log.write_text(original)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "start afresh without --resume" in r.stderr


def test_a_torn_last_line_still_resumes(session):
    root, commits, cfg, log, original = session
    try:
        log.write_text(original + '{"type": "probe", "point": "' + commits[0][:8])
        # the log is accepted: the resumed session gets as far as probing --good again
        with pytest.raises(ProbeError, match="does not probe good"):
            find_first_bad(RunsConfig(**{**cfg.__dict__, "resume": True}))
    finally:
        log.write_text(original)
