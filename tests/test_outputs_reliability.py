"""Issue 34 (reliability round 3, outputs): report files never replace a user's file, and
documents of an unknown version are refused.

``bisect report --html`` and ``bisect audit --junit/--json/--html`` write only a new path,
an empty file, or a report of their kind that reprobisect wrote (``trace.outfile``).
Anything else -- a user's file, a symlink, a folder, a FIFO -- is one line naming the path
and the fix, exit 2, the path byte-identical afterwards; the audit asks before any check
runs. Real files, the real CLI (``reprobisect.cli.main``), a real audit whose command
leaves a mark when it runs.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.errors import UsageError
from reprobisect.report import write_report
from reprobisect.trace.outfile import JUNIT_MARKER, atomic_write, check_output_file, is_ours

from test_report import audit_doc, build

MINE = b"<html><body>my own notes, not a report</body></html>\n"
RAN = "ran.txt"
CONFIG = ("name: nightly\ncommand: python t.py\nchecks:\n  - {name: r1, check: repro}\n")
"""An audit whose command writes ran.txt when it runs (and then fails: inconclusive, exit 1)."""


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("traces")
    build(root / "a", steps=3)
    build(root / "b", steps=3, diverge_at=1)
    return root


@pytest.fixture
def audit_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text(f"open({RAN!r}, 'w').close()\nraise SystemExit(1)\n")
    (tmp_path / "a.yaml").write_text(CONFIG)
    return tmp_path


# ------------------------------------------------------------------------------ bisect report --html


def test_report_html_refuses_a_file_it_did_not_write(traces, tmp_path, capsys):
    out = tmp_path / "notes.html"
    out.write_bytes(MINE)
    assert main(["report", str(traces / "a"), str(traces / "b"), "--html", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--html '{out}' exists and is not an HTML report reprobisect wrote; it is left untouched" in line
    assert "pass another --html, or delete the file yourself" in line
    assert out.read_bytes() == MINE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.html"]  # no temp file left


def test_report_html_replaces_its_own_page_and_an_empty_file(traces, tmp_path, capsys):
    out = tmp_path / "r.html"
    out.touch()
    assert main(["report", str(traces / "a"), str(traces / "a"), "--html", str(out)]) == 0
    first = out.read_text()
    assert "<meta name='generator' content='reprobisect " in first[:400] and "AGREE" in first
    assert main(["report", str(traces / "a"), str(traces / "b"), "--html", str(out)]) == 0
    assert "DIVERGED" in out.read_text() and out.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("make, said", [
    (lambda p: os.symlink(p / "target.html", p / "out.html"), "is a symbolic link"),
    (lambda p: (p / "out.html").mkdir(), "is a (folder|directory)"),  # click's check for the CLI, ours below it
    (lambda p: os.mkfifo(p / "out.html"), r"is not a regular file \(a FIFO, socket or device\)"),
])
def test_report_html_refuses_a_link_a_folder_or_a_fifo(traces, tmp_path, capsys, make, said):
    target = tmp_path / "target.html"
    write_report((str(traces / "a"), str(traces / "a")), target)  # even a link to a page of ours
    before = target.read_bytes()
    make(tmp_path)
    mode = (tmp_path / "out.html").lstat().st_mode
    assert main(["report", str(traces / "a"), str(traces / "b"), "--html", str(tmp_path / "out.html")]) == 2
    assert re.search(said, _one_line(capsys.readouterr().err))
    with pytest.raises(UsageError, match=said.replace("(folder|directory)", "folder")):
        write_report((str(traces / "a"), str(traces / "b")), tmp_path / "out.html")
    assert (tmp_path / "out.html").lstat().st_mode == mode and target.read_bytes() == before


def test_report_html_to_a_missing_folder_is_one_line(traces, tmp_path, capsys):
    assert main(["report", str(traces / "a"), str(traces / "b"), "--html", str(tmp_path / "no" / "r.html")]) == 2
    assert "no folder" in _one_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------ bisect audit


@pytest.mark.parametrize("option, name", [("--junit", "a.xml"), ("--json", "a.json"), ("--html", "a.html")])
def test_audit_refuses_a_foreign_report_path_before_any_check_runs(audit_dir, capsys, option, name):
    (audit_dir / name).write_bytes(MINE)
    assert main(["audit", "a.yaml", option, name]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{option} '{name}' exists and is not" in line and f"pass another {option}" in line
    assert (audit_dir / name).read_bytes() == MINE
    assert not (audit_dir / RAN).exists() and not (audit_dir / ".bisect-audit").exists()  # nothing ran


def test_audit_refuses_a_symlink_and_a_repeated_path_before_any_check_runs(audit_dir, capsys):
    (audit_dir / "elsewhere.xml").write_text("x")
    os.symlink(audit_dir / "elsewhere.xml", audit_dir / "a.xml")
    assert main(["audit", "a.yaml", "--junit", "a.xml"]) == 2
    assert "--junit 'a.xml' is a symbolic link" in _one_line(capsys.readouterr().err)
    assert main(["audit", "a.yaml", "--json", "r.out", "--html", "r.out"]) == 2
    assert "--json and --html both name 'r.out'" in _one_line(capsys.readouterr().err)
    assert (audit_dir / "elsewhere.xml").read_text() == "x" and not (audit_dir / RAN).exists()


def test_audit_replaces_its_own_reports_night_after_night(audit_dir, capsys):
    args = ["audit", "a.yaml", "--junit", "a.xml", "--json", "a.json", "--html", "a.html"]
    assert main(args) == 1  # the check is inconclusive (its command fails): exit 1, reports written
    first = {n: (audit_dir / n).read_bytes() for n in ("a.xml", "a.json", "a.html")}
    assert first["a.xml"].split(b"\n")[1] == JUNIT_MARKER.encode()
    assert json.loads(first["a.json"])["generator"] == "reprobisect"
    (audit_dir / RAN).unlink()
    assert main(args) == 1 and (audit_dir / RAN).exists()
    assert all((audit_dir / n).read_bytes() != b for n, b in first.items())  # the second night's
    assert not list(audit_dir.glob(".*.tmp"))


# ------------------------------------------------------------------------------ the rule itself


def test_what_counts_as_ours(tmp_path):
    cases = {
        ("html", "<!DOCTYPE html><html><head><meta name='generator' content='reprobisect 0.9'>"): True,
        ("html", '<html><head><meta name="generator" content="reprobisect">'): True,
        ("html", "<html><head><meta name='generator' content='hugo'>"): False,
        ("junit", f'<?xml version="1.0"?>\n{JUNIT_MARKER}\n<testsuites/>'): True,
        ("junit", '<?xml version="1.0"?>\n<testsuites name="pytest"/>'): False,
        ("json", '{"kind": "reprobisect.audit", "version": 1}'): True,
        ("json", '{"generator": "reprobisect"}'): True,
        ("json", '{"kind": "reprobisect.audit"}'): False,
        ("json", '{"name": "my-app", "version": 1}'): False,
        ("json", "[" * 100000): False,
        ("json", "not json"): False,
    }
    for (kind, text), ours in cases.items():
        p = tmp_path / f"f.{kind}"
        p.write_text(text)
        assert is_ours(p, kind) is ours, (kind, text)
        if not ours:
            with pytest.raises(UsageError, match="is not .* reprobisect wrote; it is left untouched"):
                atomic_write(p, lambda t: t.write_text("replaced"), kind=kind)
            assert p.read_text() == text
    assert check_output_file(tmp_path / "new.json", "json") == tmp_path / "new.json"


def test_a_failed_write_leaves_the_old_report_and_no_temp_file(tmp_path):
    p = tmp_path / "a.json"
    atomic_write(p, lambda t: t.write_text('{"generator": "reprobisect", "n": 1}'), kind="json")

    def broken(t: Path) -> None:
        t.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(p, broken, kind="json")
    assert json.loads(p.read_text())["n"] == 1 and [f.name for f in tmp_path.iterdir()] == ["a.json"]


# ------------------------------------------------------------------------------ unknown versions


def test_report_refuses_an_audit_document_of_an_unknown_version(tmp_path, capsys):
    doc = {**audit_doc(tmp_path), "version": 7}
    (tmp_path / "audit.json").write_text(json.dumps(doc))
    assert main(["report", str(tmp_path / "audit.json"), "--html", str(tmp_path / "r.html")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "an audit document of version 7, and this reprobisect reads version 1" in line
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(UsageError, match="version '1', and this reprobisect reads version 1"):
        write_report({**doc, "version": "1"}, tmp_path / "r.html")


def test_report_refuses_a_compare_document_of_an_unknown_schema_version(traces, tmp_path, capsys):
    assert main(["compare", str(traces / "a"), str(traces / "b"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    for key, v in (("schema_version", 2), ("version", 3)):
        (tmp_path / "c.json").write_text(json.dumps({**doc, key: v}))
        assert main(["report", str(tmp_path / "c.json"), "--html", str(tmp_path / "r.html")]) == 2
        assert f"a compare document of {key} {v}, and this reprobisect reads {key} 1" in \
            _one_line(capsys.readouterr().err)
    (tmp_path / "c.json").write_text(json.dumps(doc))  # today's documents carry no version: read
    assert main(["report", str(tmp_path / "c.json"), "--html", str(tmp_path / "r.html")]) == 0


def test_report_refuses_a_session_log_of_a_newer_version(tmp_path, capsys):
    log = tmp_path / "sessions" / "s.jsonl"
    log.parent.mkdir()
    log.write_text(json.dumps({"type": "session", "version": 9, "good": "a", "bad": "b"}) + "\n")
    assert main(["report", str(log), "--html", str(tmp_path / "r.html")]) == 2
    assert "session log version 9 is newer than this reprobisect (reads 1)" in _one_line(capsys.readouterr().err)
