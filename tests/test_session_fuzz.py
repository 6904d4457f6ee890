"""Fuzzing ``bisect runs --resume``: seeded mutants of a real session log, each either resumes or is refused in one line.

The log is a real one: a real session on a tiny real git repository (its command records
no step, so it stops at --good, leaving a log), with real events appended the way a
session appends them (``SessionLog.append``). Each mutant (truncated, flipped bytes,
fields of the wrong type, duplicated or dropped lines, unknown kinds, huge numbers, NaN,
deep nesting) goes through the function ``--resume`` calls first,
``reprobisect.workflows.runs.resume.load_for_resume``, with the session's own header,
range and parents: it must come back as a log to resume, or as one ``UsageError`` /
``TraceError`` line (exit 2 at the CLI), never another exception.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.core.session import SessionEvent, SessionLog
from reprobisect.errors import ProbeError, TraceError, UsageError
from reprobisect.workflows.runs import RunsConfig, find_first_bad
from reprobisect.workflows.runs.driver import RunsSession
from reprobisect.workflows.runs.resume import load_for_resume

MUTANTS = 400
SEED = 34


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """(the session, resolved as --resume resolves it; its log's path; the log's text)."""
    root = tmp_path_factory.mktemp("fuzz") / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for i in range(8):
        (root / "fast.py").write_text(f"print('commit {i}')\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"c{i}")
    commits = _git(root, "rev-list", "--reverse", "HEAD").split()
    cfg = RunsConfig(cwd=str(root), good=commits[0], bad=commits[-1], command=("python", "fast.py"),
                     options=ProbeOptions(quiet=True))
    with pytest.raises(ProbeError):
        find_first_bad(cfg)  # no step recorded: --good does not probe good, but the log exists
    s = RunsSession(RunsConfig(**{**cfg.__dict__, "resume": True}))
    s._resolve()
    log = SessionLog.load(s.log_path)
    outcome = {"status": "ok", "detail": "recorded 3 step(s)", "step": None, "wall_s": 1.5}
    for point, verdict, role, rnd in [(commits[0], "good", "endpoint", None), (commits[-1], "bad", "endpoint", None),
                                      (commits[4], "bad", "search", 1), (commits[2], "good", "search", 2)]:
        log.append(SessionEvent(point=point, verdict=verdict, reason="matches the reference", outcome=outcome,
                                attempts=1, wall_s=2.25, role=role, round=rnd))
    resumed = load_for_resume(s.log_path, s.header, s.points, s.terms, s.parents)
    assert len(resumed) == 4  # the unmutated log resumes
    return s, s.log_path, s.log_path.read_text()


_WEIRD = [None, True, 0, -1, 10**30, 1.5, "", "x" * 5000, [], [1, [2]], {}, {"a": {"b": None}},
          "good", "bad", "skip", "search", "endpoint", "recheck", "session", "probe"]
_RAW = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" + "0" * 5000, "[" * 3000 + "]" * 3000,
        '"\\ud800"', "null", "true", "0.0000000000000000000001", "-0"]


def _mutate(text: str, rng: random.Random) -> str | bytes:
    lines = text.splitlines(keepends=True)
    kind = rng.randrange(11)
    if kind == 0:  # truncated anywhere
        return text[: rng.randrange(len(text) + 1)]
    if kind == 1:  # flipped bytes
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    i = rng.randrange(len(lines))
    if kind == 2:  # a duplicated line
        return "".join(lines[: i + 1] + [lines[i]] + lines[i + 1 :])
    if kind == 3:  # a dropped line
        return "".join(lines[:i] + lines[i + 1 :])
    if kind == 4:  # two lines swapped
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "".join(lines)
    d = json.loads(lines[i])
    if kind in (5, 6):  # a field of the wrong type (or a value of the right type that makes no sense)
        key = rng.choice(sorted(d) + ["type", "version", "point", "verdict", "round", "attempts", "extra"])
        d[key] = rng.choice(_WEIRD)
        lines[i] = json.dumps(d) + "\n"
        return "".join(lines)
    if kind == 7:  # a raw value JSON parsers disagree on (NaN, huge numbers, lone surrogates, deep nesting)
        key = rng.choice(sorted(d))
        d[key] = "@@RAW@@"
        lines[i] = json.dumps(d).replace('"@@RAW@@"', rng.choice(_RAW)) + "\n"
        return "".join(lines)
    if kind == 8:  # an unknown kind of line
        extra = {"type": rng.choice(["verdict", "probe2", "", None, 7, "Session"]), "point": d.get("point", "x")}
        return "".join(lines[: i + 1] + [json.dumps(extra) + "\n"] + lines[i + 1 :])
    if kind == 9:  # a line that is not an object, or not JSON
        return "".join(lines[:i] + [rng.choice(['[1, 2]\n', '"probe"\n', '42\n', '{"type": "probe"\n', "\x00\n",
                                                  "\r\n", " \n"])] + lines[i + 1 :])
    return text.replace(rng.choice(["\n", '"', ":", ","]), rng.choice(["", "\r\n", "'", ";"]), rng.randint(1, 3))


def test_every_mutant_resumes_or_is_refused_in_one_line(session):
    s, path, original = session
    rng = random.Random(SEED)
    seen = {"resumed": 0, "refused": 0}
    try:
        for n in range(MUTANTS):
            mutant = _mutate(original, rng)
            if isinstance(mutant, bytes):
                path.write_bytes(mutant)
            else:
                path.write_text(mutant)
            try:
                log = load_for_resume(path, s.header, s.points, s.terms, s.parents)
            except (UsageError, TraceError) as e:
                assert "\n" not in str(e) and str(e).strip(), (n, mutant, str(e))
                seen["refused"] += 1
                continue
            except Exception as e:  # noqa: BLE001 -- the point of the test
                pytest.fail(f"mutant {n} raised {type(e).__name__}: {e}\n{mutant!r}"[:3000])
            assert isinstance(log, SessionLog) and log.header.get("type") == "session"
            seen["resumed"] += 1
    finally:
        path.write_text(original)
    assert seen["resumed"] > 10 and seen["refused"] > 100, seen  # the mutants exercise both ways


def test_a_mutant_at_the_cli_is_one_line_exit_2(session, capsys, monkeypatch):
    from reprobisect.cli import main

    s, path, original = session
    monkeypatch.chdir(s.top)
    try:
        path.write_text(original.replace('"round": 1', '"round": ' + "1" * 5000))
        argv = ["runs", "--good", s.good, "--bad", s.bad, "--resume", "-q", "--", "python", "fast.py"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "start afresh without --resume" in err
    finally:
        path.write_text(original)
