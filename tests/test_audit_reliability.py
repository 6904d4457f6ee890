"""bisect audit's reliability: goldens never replace the user's files, the noise band is sealed,
the history opens only its own database and never loses a night, and the config is checked
whole before anything runs.

Real parts throughout: traces written with ``TraceWriter`` (NumPy, no framework), real SQLite
files, real git repositories, the real CLI (``reprobisect.cli.main``), real threads and
processes writing one history at once.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from reprobisect.cli import main
from reprobisect.errors import UsageError
from reprobisect.trace import TraceWriter, record_array
from reprobisect.trace.format import shard_name
from reprobisect.workflows.audit import golden as goldens
from reprobisect.workflows.audit import history as hist
from reprobisect.workflows.audit import load_audit_config, run_audit

LEGACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS nights (
    config TEXT NOT NULL,
    started TEXT NOT NULL,
    check_name TEXT NOT NULL,
    kind TEXT NOT NULL,
    revision TEXT,
    verdict TEXT NOT NULL,
    line TEXT NOT NULL,
    wall_s REAL NOT NULL,
    PRIMARY KEY (config, started, check_name)
)
"""
"""The history schema of earlier versions, verbatim: months of nights live in files like this."""


def write_trace(path: Path, shift: float = 0.0) -> str:
    """A small real trace: two steps, one parameter kept in full, moved by ``shift`` (the "noise")."""
    rng = np.random.default_rng(0)
    with TraceWriter(path, command=["python", "train.py"], environment={"device": "cpu"}, seed=0) as w:
        for k in range(2):
            w.begin_step(k)
            x = (rng.standard_normal((3, 4)) + shift).astype(np.float32)
            w.record(record_array("w", "param", x), x)
            w.end_step({"loss": 0.5, "lr": 0.1})
    return str(path)


@pytest.fixture
def golden(tmp_path) -> Path:
    """A golden recorded from two runs 1e-6 apart (a non-empty band), as --update-golden writes it."""
    runs = [write_trace(tmp_path / f"run{i}", shift=i * 1e-6) for i in range(2)]
    g = tmp_path / "proj" / "goldens" / "g"
    goldens.save_golden(g, runs)
    return g


def _reseal(g: Path) -> None:
    """Rewrite golden.json to match the files as they are now (a deliberate, consistent edit)."""
    if not (g / "golden.json").exists():
        return  # a golden without a seal (as earlier versions wrote them)
    seal = json.loads((g / "golden.json").read_text())
    seal["noise_sha256"] = hashlib.sha256((g / "noise.json").read_bytes()).hexdigest()
    seal["manifest_sha256"] = hashlib.sha256((g / "trace" / "manifest.json").read_bytes()).hexdigest()
    (g / "golden.json").write_text(json.dumps(seal))


def _widen(g: Path, to: float = 1e9) -> None:
    band = json.loads((g / "noise.json").read_text())
    for v in band["tensors"].values():
        v["max_abs"] = v["max_rel"] = to
    (g / "noise.json").write_text(json.dumps(band))


def _cli(capsys, *args: str) -> tuple[int, list[str]]:
    rc = main(["audit", *args])
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if ln.strip()]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


# --------------------------------------------------------------------------- 1. golden paths


@pytest.mark.parametrize("where", ["../user", ".", "..", "ABS_USER", "ABS_PARENT", "sub/../../user"])
def test_update_golden_never_replaces_a_folder_it_did_not_write(tmp_path, capsys, where):
    proj, user = tmp_path / "proj", tmp_path / "user"
    proj.mkdir()
    user.mkdir()
    (user / "thesis.tex").write_text("months of work\n")
    g = {"ABS_USER": str(user), "ABS_PARENT": str(tmp_path)}.get(where, where)
    (proj / "a.yaml").write_text(f"command: python nothing.py\nchecks:\n  - {{name: g, check: golden, golden: '{g}'}}\n")
    before = _tree(tmp_path)
    rc, lines = _cli(capsys, str(proj / "a.yaml"), "--update-golden")
    assert rc == 2 and len(lines) == 1 and "'golden'" in lines[0], lines
    assert "nothing was touched" in lines[0] or "inside the config's folder" in lines[0] or "holds" in lines[0]
    assert _tree(tmp_path) == before  # the user's files, and nothing new: no results folder, no history
    assert sorted(p.name for p in proj.iterdir()) == ["a.yaml"]


def test_update_golden_refuses_a_golden_holding_the_history_or_the_repo(tmp_path):
    proj = tmp_path / "proj"
    (proj / "state").mkdir(parents=True)
    _git(proj, "init", "-q")
    (proj / "h.yaml").write_text("history: state/h.sqlite\ncommand: x\nchecks:\n  - {name: g, check: golden, golden: state}\n")
    with pytest.raises(UsageError, match=r"'golden' is .*state', which holds the history"):
        load_audit_config(proj / "h.yaml")
    (proj / "sub").mkdir()
    (proj / "sub" / "r.yaml").write_text(f"repo: ..\ncommand: x\nchecks:\n  - {{name: g, check: golden, golden: '{proj}'}}\n")
    with pytest.raises(UsageError, match="which holds the config's folder"):
        load_audit_config(proj / "sub" / "r.yaml")


def test_a_golden_of_ours_an_old_golden_and_an_empty_folder_are_replaced(golden, tmp_path):
    runs = [write_trace(tmp_path / f"r{i}", shift=i * 2e-6) for i in range(2)]
    goldens.save_golden(golden, runs)  # our own, sealed
    assert sorted(p.name for p in golden.iterdir()) == ["golden.json", "noise.json", "trace"]
    (golden / "golden.json").unlink()  # as an earlier version wrote it: trace/ + noise.json only
    assert goldens.foreign_reason(golden) is None
    goldens.save_golden(golden, runs)
    assert (golden / "golden.json").is_file()
    empty = tmp_path / "proj" / "goldens" / "empty"
    empty.mkdir()
    goldens.save_golden(empty, runs)
    assert goldens.load_golden(empty)[1].tensors
    (golden / "notes.txt").write_text("mine\n")  # a file of the user's inside a golden: refused, kept
    with pytest.raises(UsageError, match=r"holding files a golden does not \(notes.txt\).*nothing was touched"):
        goldens.save_golden(golden, runs)
    assert (golden / "notes.txt").read_text() == "mine\n"
    assert not list(golden.parent.glob(".g.*"))  # no temporary or old copies left beside it


# --------------------------------------------------------------------------- 2. history: only our own database


def _user_db(p: Path) -> bytes:
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE experiments (id INTEGER PRIMARY KEY, lr REAL)")
    con.execute("INSERT INTO experiments (lr) VALUES (0.1)")
    con.commit()
    con.close()
    return p.read_bytes()


def test_history_refuses_a_database_it_did_not_create(tmp_path):
    db = tmp_path / "mine.sqlite"
    before = _user_db(db)
    (tmp_path / "a.yaml").write_text("history: mine.sqlite\ncommand: x\nchecks:\n  - {name: r, check: repro}\n")
    with pytest.raises(UsageError, match=r"history '.*mine.sqlite' is an SQLite database reprobisect did not create"):
        load_audit_config(tmp_path / "a.yaml")
    with pytest.raises(UsageError, match="did not create"):
        hist.record_night(db, "c", "2026-01-01", [hist.Night("2026-01-01", "r", "repro", None, "bitwise", "ok", 1.0)])
    assert db.read_bytes() == before  # no table added, nothing changed


@pytest.mark.parametrize("kind", ["folder", "text", "random", "sqlite-header-then-garbage"])
def test_history_that_is_not_a_database_is_one_line_exit_2(tmp_path, capsys, kind):
    db = tmp_path / "h.sqlite"
    if kind == "folder":
        db.mkdir()
    elif kind == "text":
        db.write_text("name,verdict\nnightly,ok\n")
    elif kind == "random":
        db.write_bytes(np.random.default_rng(1).bytes(4096))
    else:
        db.write_bytes(b"SQLite format 3\x00" + np.random.default_rng(2).bytes(4096))
    before = _tree(tmp_path)
    (tmp_path / "a.yaml").write_text("history: h.sqlite\ncommand: python nothing.py\nchecks:\n  - {name: r, check: repro}\n")
    rc, lines = _cli(capsys, str(tmp_path / "a.yaml"))
    assert rc == 2 and len(lines) == 1, lines
    assert "history" in lines[0] and "h.sqlite" in lines[0] and "give 'history:' a new file path" in lines[0]
    assert {k: v for k, v in _tree(tmp_path).items() if k != "a.yaml"} == before
    assert not (tmp_path / ".bisect-audit").exists()


def test_new_path_and_empty_file_are_marked_as_ours(tmp_path):
    night = [hist.Night("2026-01-01T02:00:00+00:00", "r", "repro", None, "bitwise", "ok", 1.0)]
    for db in (tmp_path / "new" / "h.sqlite", tmp_path / "empty.sqlite"):
        if db.name == "empty.sqlite":
            db.write_bytes(b"")  # touch: an empty SQLite database, adopted
        hist.record_night(db, "c", night[0].started, night)
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA application_id").fetchone()[0] == hist.APPLICATION_ID
        assert con.execute("PRAGMA user_version").fetchone()[0] == hist.VERSION
        assert con.execute("SELECT format FROM reprobisect_history").fetchone()[0] == "reprobisect-audit-history"
        con.close()
        assert [n.verdict for n in hist.nights(db, "c")] == ["bitwise"]


def test_a_history_an_earlier_version_wrote_is_adopted_with_every_night(tmp_path):
    db = tmp_path / ".bisect-audit.sqlite"
    con = sqlite3.connect(db)
    con.execute(LEGACY_SCHEMA)
    rows = [("c", f"2026-01-0{d}T02:00:00+00:00", chk, "repro", "abc", v, "line", 1.5)
            for d in (1, 2, 3) for chk, v in (("r", "bitwise"), ("g", "diverged"))]
    con.executemany("INSERT OR REPLACE INTO nights VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    assert len(hist.nights(db, "c")) == 6  # read as it is
    started = "2026-01-04T02:00:00+00:00"
    hist.record_night(db, "c", started, [hist.Night(started, "r", "repro", "def", "bitwise", "ok", 1.0)])
    got = hist.nights(db, "c")
    assert [(n.started, n.check, n.verdict) for n in got[:6]] == [(r[1], r[2], r[5]) for r in rows]
    assert got[6].started == started and len(got) == 7
    ids = [n.night_id for n in got]
    assert all(ids) and len(set(ids)) == 4 and ids[0] == ids[1] != ids[2]  # one id per night, both checks share it
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA application_id").fetchone()[0] == hist.APPLICATION_ID
    con.close()
    assert hist.trend(got, "r").last_pass == started and hist.trend(got, "g").failing_nights == 3


# --------------------------------------------------------------------------- 3. never lose a night


def test_concurrent_nights_with_the_same_started_are_all_kept(tmp_path):
    db = tmp_path / "h.sqlite"
    started = "2026-01-01T02:00:00+00:00"
    go = threading.Barrier(5)  # four threads and this one
    ids: list[str] = []

    def night(i: int) -> None:
        rows = [hist.Night(started, c, "repro", None, "bitwise", f"writer {i}", 1.0) for c in ("a", "b")]
        go.wait()
        ids.append(hist.record_night(db, "c", started, rows))

    threads = [threading.Thread(target=night, args=(i,)) for i in range(4)]
    code = ("import sys; from pathlib import Path; from reprobisect.workflows.audit import history as h; "
            f"rows = [h.Night({started!r}, c, 'repro', None, 'bitwise', 'process', 1.0) for c in ('a', 'b')]; "
            f"print(h.record_night(Path({str(db)!r}), 'c', {started!r}, rows))")
    procs = []
    for t in threads:
        t.start()
    for _ in range(2):
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True))
    go.wait()
    for t in threads:
        t.join()
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        ids.append(out.strip())
    got = hist.nights(db, "c")
    assert len(got) == 12 and len(set(ids)) == 6  # six nights, two rows each: none replaced another
    assert sorted({n.night_id for n in got}) == sorted(ids)
    assert sorted(n.line for n in got).count("process") == 4


@pytest.mark.slow
def test_two_audits_of_one_config_at_once_both_keep_their_night(tmp_path):
    (tmp_path / "a.yaml").write_text("command: python missing.py\nchecks:\n  - {name: r, check: repro}\n")
    bisect = Path(sys.executable).with_name("bisect")
    procs = [subprocess.Popen([str(bisect), "audit", str(tmp_path / "a.yaml")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    for p in procs:
        p.communicate(timeout=240)
        assert p.returncode == 1  # the check is inconclusive (no such script): a verdict, not an error
    got = hist.nights(tmp_path / ".bisect-audit.sqlite", str(tmp_path / "a.yaml"))
    assert len(got) == 2 and len({n.night_id for n in got}) == 2


# --------------------------------------------------------------------------- 4. the sealed noise band


def test_a_widened_noise_band_is_refused_not_a_pass(golden, tmp_path):
    regression = write_trace(tmp_path / "regression", shift=1e-2)
    assert goldens.judge(golden, regression)[0] == "diverged"
    _widen(golden)
    with pytest.raises(UsageError, match=r"golden '.*g': noise.json does not match its seal in golden.json.*--update-golden"):
        goldens.judge(golden, regression)
    _reseal(golden)  # a consistent forgery still cannot claim a band wider than the tensor
    with pytest.raises(UsageError, match=r"band of tensor 'param/w' \(max_abs 1e\+09\) is wider than the tensor itself"):
        goldens.judge(golden, regression)


def test_a_tampered_golden_stops_the_audit_before_any_probe(golden, capsys):
    proj = golden.parents[1]
    (proj / "a.yaml").write_text("command: python nothing.py\nchecks:\n  - {name: g, check: golden, golden: goldens/g}\n")
    _widen(golden)
    rc, lines = _cli(capsys, str(proj / "a.yaml"))
    assert rc == 2 and len(lines) == 1 and "does not match its seal" in lines[0] and "--update-golden" in lines[0], lines
    assert sorted(p.name for p in proj.iterdir()) == ["a.yaml", "goldens"]  # nothing ran, nothing written


@pytest.mark.parametrize("text, match", [
    ("not json {", "is not strict JSON"),
    ('{"runs": 2, "tensors": {"param/w": {"max_abs": NaN, "max_rel": 0}}}', "is not strict JSON"),
    ("[1, 2]", "must be an object with runs and tensors"),
    ('{"runs": "two", "tensors": {}}', "'runs' must be an integer"),
    ('{"runs": 2, "tensors": []}', "'tensors' must be an object"),
    ('{"runs": 2, "tensors": {"param/w": {"max_abs": 1e-6}}}', "must be kind/name: {max_abs, max_rel}"),
    ('{"runs": 2, "tensors": {"param/w": {"max_abs": -1, "max_rel": 0}}}', "max_abs of tensor 'param/w' must be a finite number >= 0"),
    ('{"runs": 2, "tensors": {"param/w": {"max_abs": 0, "max_rel": "x"}}}', "max_rel of tensor 'param/w'"),
    ('{"runs": 2, "tensors": {"param/w": {"max_abs": 1e400, "max_rel": 0}}}', "max_abs of tensor 'param/w'"),
    ('{"runs": 2, "tensors": {"grad/nope": {"max_abs": 0, "max_rel": 0}}}', "names tensor 'grad/nope', which the golden's trace does not record"),
])
def test_a_malformed_noise_json_is_one_line_naming_the_file(golden, text, match):
    (golden / "noise.json").write_text(text)
    _reseal(golden)
    with pytest.raises(UsageError, match=r"golden '.*g'.*noise.json") as e:
        goldens.load_golden(golden)
    assert match in str(e.value) and "\n" not in str(e.value)


def test_the_golden_trace_is_verified_when_loaded(golden):
    shard = golden / "trace" / shard_name(0)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # a tensor byte: opening the trace alone does not hash its shards
    shard.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"golden '.*g': its trace is damaged .*re-record it"):
        goldens.load_golden(golden)
    goldens.load_golden(golden, verify=False)  # the cheap path (seal + band) still opens it


def test_a_golden_without_a_seal_is_refused_with_the_fix(golden):
    (golden / "golden.json").unlink(missing_ok=True)
    with pytest.raises(UsageError, match="golden.json is missing .*re-record it with bisect audit CONFIG --update-golden"):
        goldens.load_golden(golden)


# --------------------------------------------------------------------------- 5. the config, up front


@pytest.fixture
def repo(tmp_path) -> Path:
    d = tmp_path / "repo"
    d.mkdir()
    _git(d, "init", "-q")
    _git(d, "commit", "-q", "--allow-empty", "-m", "first")
    return d


@pytest.mark.parametrize("text, key", [
    ("command: [python, 5]\nchecks:\n  - {name: r, check: repro}", "'command' must be a string or a list of strings"),
    ("command: x\nenv: {X: {y: 1}}\nchecks:\n  - {name: r, check: repro}", "'env' value of X must be a string or a number"),
    ("command: x\nchecks:\n  - {name: r, check: repro, env: {X: [1]}}", "'env' value of X"),
    ("repo: /nonexistent\ncommand: x\nchecks:\n  - {name: r, check: repro}", "'repo' is '/nonexistent', which is not a folder"),
    ("repo: ../notgit\ncommand: x\nchecks:\n  - {name: r, check: repro}", "which is not a git repository"),
    ("repo: .\nlast_good: nosuchrev\ncommand: x\nchecks:\n  - {name: r, check: repro}", "'last_good' is 'nosuchrev', which is not a commit"),
    ("command: x\nchecks:\n  - {name: g, check: golden, golden: user}", "'golden' is .*user', which is a folder holding files"),
    ("timeout: .inf\ncommand: x\nchecks:\n  - {name: r, check: repro}", "'timeout' must be a finite number"),
    ("command: x\nchecks:\n  - {name: ../../out, check: repro}", "'name' is '../../out'"),
    ("command: x\nchecks:\n  - {name: e, check: envs, a: 'no equals', b: env.X=1}", "'a' is not a valid spec"),
])
def test_bad_config_is_refused_before_anything_runs(repo, capsys, text, key):
    (repo.parent / "notgit").mkdir(exist_ok=True)
    (repo / "user").mkdir()
    (repo / "user" / "data.csv").write_text("1,2\n")
    (repo / "a.yaml").write_text(text + "\n")
    before = _tree(repo)
    rc, lines = _cli(capsys, str(repo / "a.yaml"))
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: audit config ") and re.search(key, lines[0]), lines
    assert _tree(repo) == before and not (repo / ".bisect-audit").exists()


def test_a_config_that_is_not_utf8_is_one_line(tmp_path, capsys):
    (tmp_path / "a.yaml").write_bytes(b"\xff\xfe name: x\n")
    rc, lines = _cli(capsys, str(tmp_path / "a.yaml"))
    assert rc == 2 and lines == [f"error: audit config '{tmp_path / 'a.yaml'}' is not UTF-8 text (byte 0xff at offset 0); "
                                 "save it as UTF-8"], lines


def test_a_good_config_with_repo_last_good_and_numbers_in_env_still_loads(repo):
    (repo / "a.yaml").write_text("repo: .\nlast_good: HEAD\ncommand: python t.py\nenv: {N: 4, F: 0.5, S: x}\n"
                                 "checks:\n  - {name: g, check: golden, golden: goldens/g}\n")
    cfg = load_audit_config(repo / "a.yaml")
    assert cfg.checks[0].env == {"N": "4", "F": "0.5", "S": "x"} and cfg.checks[0].golden == repo / "goldens" / "g"
    assert not (repo / ".bisect-audit.sqlite").exists()  # checking creates nothing


def test_run_audit_checks_before_writing_for_library_callers(golden):
    from reprobisect.core.options import ProbeOptions

    proj = golden.parents[1]
    (proj / "a.yaml").write_text("command: python nothing.py\nchecks:\n  - {name: g, check: golden, golden: goldens/g}\n")
    cfg = load_audit_config(proj / "a.yaml")
    _widen(golden)  # changed after the config was loaded
    with pytest.raises(UsageError, match="does not match its seal"):
        run_audit(cfg, ProbeOptions(quiet=True))
    assert sorted(p.name for p in proj.iterdir()) == ["a.yaml", "goldens"]
