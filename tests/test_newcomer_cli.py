"""What a newcomer meets first (issue 37, "Options and mistakes" and "Output"): a mistyped
option is an option error with the right spelling, a forgotten ``--`` names the fix, ``-q``/
``-v`` mean the same on every command, help and docs agree with the code, an outcome is said
once with a normalised path and one step numbering, the user's frames only, ``bisect runs``
says its phases, environment keys are classified by what can change numbers, ``doctor`` says
which check its run was too short for, and ``bisect report`` says which session it picked.

Real parts throughout: the CLI through ``reprobisect.cli.main``, real traces and session logs
in tmp folders, real captures (marked slow) through the installed ``bisect``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from reprobisect.cli import COMMANDS, main
from reprobisect.core.envdiff import category_of, diff_environments
from reprobisect.core.outcome import Outcome
from reprobisect.core.session import SessionEvent, SessionLog
from reprobisect.trace import TraceWriter, record_array

ROOT = Path(__file__).resolve().parents[1]
BISECT = str(Path(sys.executable).parent / "bisect")
_CMD_TAKERS = ["capture", "probe", "runs", "repro", "resume", "seeds", "envs", "doctor"]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# --------------------------------------------------------------------------- 1. a typo before --


@pytest.mark.parametrize("argv,code", [
    (["runs", "--good", "A", "--bad", "B", "--step", "2", "--", "python", "train.py"], 2),
    (["capture", "-o", "t", "--step", "2", "--", "python", "train.py"], 2),
    (["probe", "--step", "2", "--", "python", "train.py"], 128),
    (["repro", "--step", "2", "--", "python", "train.py"], 2),
    (["doctor", "--step", "2", "--", "python", "train.py"], 2),
])
def test_a_mistyped_option_before_the_separator_is_an_option_error_with_the_right_spelling(
        tmp_path, monkeypatch, capsys, argv, code):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == code
    name = argv[0]
    assert _one_line(capsys.readouterr().err) == (
        f"error: no such option '--step' for bisect {name} (did you mean --steps?); see bisect {name} --help")


def test_after_the_separator_everything_is_the_users(tmp_path, monkeypatch, capsys):
    """``--step`` after ``--`` is the training command's own: no option error (the runs fails
    later, on the revisions of a folder that is no repository)."""
    monkeypatch.chdir(tmp_path)
    assert main(["runs", "--good", "A", "--bad", "B", "--", "python", "train.py", "--step", "2"]) == 2
    assert "no such option" not in capsys.readouterr().err


# --------------------------------------------------------------------------- 2. a forgotten --


def test_a_forgotten_separator_names_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "-o", "x", "--steps", "3", "python", "train.py", "--lr", "1e-3"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        "error: no such option '--lr' for bisect capture: put -- before the command: "
        "bisect capture -o x --steps 3 -- python train.py --lr 1e-3")
    assert main(["probe", "--reference", "r", "python", "train.py", "--lr=1"]) == 128
    assert _one_line(capsys.readouterr().err) == (
        "error: no such option '--lr' for bisect probe: put -- before the command: "
        "bisect probe --reference r -- python train.py --lr=1")
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- 3. -q/-v, help and docs


@pytest.mark.parametrize("name", list(COMMANDS))
def test_quiet_and_verbose_are_on_every_command(capsys, name):
    assert main([name, "--help"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"-q, --quiet\s+Print only the result and errors", text), text
    assert re.search(r"-v, --verbose\s+More detail", text), text


def test_quiet_and_verbose_reach_commands_that_had_neither(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "-q", "missing.yaml"]) == 2
    assert _one_line(capsys.readouterr().err) == "error: audit config 'missing.yaml' does not exist; check the path"
    assert main(["compare", "-q", "-v", "a", "b"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        "error: -q/--quiet and -v/--verbose contradict each other; give one of them")


def _trace(path: Path, env: dict) -> Path:
    with TraceWriter(path, command=["python", "train.py"], environment=env) as wr:
        wr.begin_step(0)
        x = np.arange(4, dtype=np.float32)
        wr.record(record_array("fc.weight", "param", x), x)
        wr.end_step({"loss": 1.0})
    return path


def test_compare_verbose_lists_every_environment_difference(tmp_path, capsys):
    env_a = {"env_vars": {f"TORCH_K{i:02d}": "1" for i in range(30)}}
    env_b = {"env_vars": {f"TORCH_K{i:02d}": "2" for i in range(30)}}
    a, b = _trace(tmp_path / "a", env_a), _trace(tmp_path / "b", env_b)
    main(["compare", str(a), str(b)])
    short = capsys.readouterr().out
    assert "TORCH_K29" not in short and "… and 10 more (-v or --json lists all)" in short
    main(["compare", "-v", str(a), str(b)])
    full = capsys.readouterr().out
    assert all(f"env_vars.TORCH_K{i:02d}" in full for i in range(30)) and "more (-v" not in full


def test_help_and_docs_say_what_the_code_does(capsys):
    assert main(["--help"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("repro "))
    assert "twice" not in line and "3 times" in line
    assert main(["repro", "--help"]) == 0
    assert re.search(r"--runs INTEGER\s+How many runs to compare.*\[default:\s+3\]", capsys.readouterr().out, re.S)
    assert main(["audit", "--help"]) == 0
    assert re.search(r"Checks run at once.*\[default:\s+2\]", capsys.readouterr().out, re.S)
    docs = (ROOT / "docs" / "audit.md").read_text()
    assert "`--jobs 2`" in docs and "`--jobs 1`, runs them one after another)" not in docs
    from reprobisect.cli.options import executor_options

    got = {}
    import click

    @click.command()
    @executor_options
    def probe_jobs(options):
        got["jobs"] = options.jobs

    probe_jobs.main([], standalone_mode=False)
    assert got["jobs"] == 2  # the truth the help and docs now say


def test_junit_suite_time_is_the_audits_wall_time_not_the_sum_of_its_checks(tmp_path):
    from reprobisect.workflows.audit.reports import write_junit

    check = {"verdict": "bitwise", "line": "bitwise", "wall_s": 30.0, "traces": {}, "envdiff": []}
    doc = {"kind": "reprobisect.audit", "version": 1, "name": "nightly", "wall_s": 31.5, "passed": True,
           "checks": [{**check, "name": "a"}, {**check, "name": "b"}]}
    root = ET.parse(write_junit(doc, tmp_path / "audit.xml")).getroot()
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    assert float(suite.get("time")) == 31.5
    assert [float(c.get("time")) for c in suite.iter("testcase")] == [30.0, 30.0]


# --------------------------------------------------------------------------- 4./5. once, one numbering


def test_paths_are_shown_normalised_and_relative_under_the_current_folder(tmp_path, monkeypatch):
    from reprobisect.workflows.capture import display_path

    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    assert display_path(tmp_path / "proj" / ".." / "traces" / "a.trace") == str(tmp_path / "traces" / "a.trace")
    assert display_path("sub/../a.trace") == "a.trace"
    assert display_path(tmp_path / "proj" / "t" / "b.trace") == os.path.join("t", "b.trace")


_TB = """Traceback (most recent call last):
  File "{pkg}/runners/launch.py", line 276, in execute
    runpy.run_path(script, run_name="__main__")
  File "<frozen runpy>", line 291, in run_path
  File "<frozen runpy>", line 98, in _run_module_code
  File "/usr/lib/python3.11/runpy.py", line 88, in _run_code
    exec(code, run_globals)
  File "train.py", line 10, in <module>
    train()
  File "train.py", line 7, in train
    raise RuntimeError(f"boom at step {{i}}")
RuntimeError: boom at step 1
"""


def test_a_crash_shows_the_users_frames_and_says_how_steps_count():
    import reprobisect
    from reprobisect.workflows.capture import CaptureResult, outcome_lines, user_traceback

    tb = _TB.format(pkg=os.path.dirname(reprobisect.__file__))
    assert user_traceback(tb) == [
        "Traceback (most recent call last):",
        '  File "train.py", line 10, in <module>', "    train()",
        '  File "train.py", line 7, in train', '    raise RuntimeError(f"boom at step {i}")',
        "RuntimeError: boom at step 1"]
    o = Outcome("crashed", detail="RuntimeError: boom at step 1", step=2, traceback=tb)
    lines = outcome_lines(CaptureResult(outcome=o, trace=os.path.abspath("t/../b.trace"), command=()))
    assert lines == ["crashed at step 2: RuntimeError: boom at step 1",
                     "  (steps count from 0, as in the trace: steps 0-1 completed; it ended during step 2)",
                     "trace: b.trace"]


TRAIN = """import sys, torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(5):
    loss = m(torch.ones(3, 4)).pow(2).sum()
    opt.zero_grad(); loss.backward(); opt.step()
    if "--crash" in sys.argv and i == 1:
        raise RuntimeError(f"boom at step {i}")
"""


@pytest.mark.slow
def test_capture_says_its_outcome_once_with_a_normalised_path_and_the_users_frames(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    ok = subprocess.run([BISECT, "capture", "-o", "../traces/a.trace", "--steps", "2", "--", "python", "train.py"],
                        cwd=proj, capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == ["ok: recorded 2 step(s)", f"trace: {tmp_path / 'traces' / 'a.trace'}"]
    assert "recorded into" not in ok.stderr and "reprobisect: ok" not in ok.stderr, ok.stderr
    bad = subprocess.run([BISECT, "capture", "-o", "b.trace", "--steps", "4", "--", "python", "train.py", "--crash"],
                         cwd=proj, capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1, bad.stderr
    assert bad.stdout.splitlines() == [
        "crashed at step 2: RuntimeError: boom at step 1",
        "  (steps count from 0, as in the trace: steps 0-1 completed; it ended during step 2)",
        "trace: b.trace"]
    assert "reprobisect: crashed" not in bad.stderr and "runpy" not in bad.stderr and "launch.py" not in bad.stderr
    assert '  File "train.py", line 9, in <module>' in bad.stderr and "RuntimeError: boom at step 1" in bad.stderr
    log = (proj / "b.trace" / "output.log").read_text()  # the whole traceback stays in the log
    assert "reprobisect: crashed at step 2" in log and "runpy" in log and 'File "train.py", line 9' in log


# --------------------------------------------------------------------------- 6. runs progress


def test_runs_progress_says_phase_probes_of_expected_and_an_estimate_without_a_terminal(capsys):
    from reprobisect.support.progress import Progress
    from reprobisect.workflows.runs.driver import _expected_probes

    assert [_expected_probes(n) for n in (1, 2, 3, 8, 9, 1000)] == [1, 1, 2, 3, 4, 10]
    with Progress("bisect runs (match)", lines=True) as p:  # stderr is no terminal under capsys
        p.phase("endpoints", 2)
        p.probed(10.0, "--good abc1234: good")
        p.probed(12.0, "--bad def5678: bad")
        p.phase("search", _expected_probes(8))
        p.probed(11.0)
        p.phase("re-check", 2)
        p.probed(None)
    assert capsys.readouterr().err.splitlines() == [
        "bisect runs (match): endpoints: 2 probe(s) expected",
        "bisect runs (match): endpoints: probe 1 of ~2 · about 10s left · --good abc1234: good",
        "bisect runs (match): endpoints: probe 2 of ~2 · --bad def5678: bad",
        "bisect runs (match): search: 3 probe(s) expected",
        "bisect runs (match): search: probe 1 of ~3 · about 22s left",
        "bisect runs (match): re-check: 2 probe(s) expected",
        "bisect runs (match): re-check: probe 1 of ~2 · about 11s left",
    ]


def test_quiet_silences_progress_lines_and_verbose_turns_them_on_everywhere(capsys):
    from reprobisect.support.progress import Progress, set_verbosity

    with set_verbosity(quiet=True), Progress("bisect runs (match)", lines=True) as p:
        p.phase("endpoints", 2)
        p.note("a note")
    with set_verbosity(verbose=True), Progress("repro") as p:
        p.phase("runs", 3)
    assert capsys.readouterr().err.splitlines() == ["repro: runs: 3 probe(s) expected"]


# --------------------------------------------------------------------------- 7. environment keys


def test_commit_metadata_is_provenance_and_other_arguments_are_a_warning():
    from reprobisect.core.envdiff import command_changes

    a = {"git": {"commit": "a" * 40, "dirty": False, "branch": "main"}, "packages": {"torch": {"version": "2.1"}},
         "python": {"argv": ["train.py", "--lr", "1e-3"]}, "host": {"hostname": "x"}}
    b = {"git": {"commit": "b" * 40, "dirty": True, "branch": "dev"}, "packages": {"torch": {"version": "2.2"}},
         "python": {"argv": ["train.py", "--lr", "2e-3"]}, "host": {"hostname": "y"}}
    changes = {c.path: c.category for c in diff_environments(a, b)}
    assert changes == {"packages.torch.version": "numerics", "git.commit": "info", "git.dirty": "info",
                       "git.branch": "info", "python.argv": "info", "host.hostname": "info"}
    assert category_of("env_vars.OMP_NUM_THREADS") == "numerics" and category_of("torch.dtype") == "numerics"
    assert [c.path for c in command_changes(diff_environments(a, b))] == ["python.argv"]
    from reprobisect.render.comparison import command_warning

    assert command_warning(diff_environments(a, b)) == (
        "warning: the two runs were started with other arguments (['train.py', '--lr', '1e-3'] → "
        "['train.py', '--lr', '2e-3']): the comparison is not like for like")
    assert command_warning(diff_environments({"git": {"commit": "a"}}, {"git": {"commit": "b"}})) is None


# --------------------------------------------------------------------------- 8. doctor, report --session


def test_doctor_says_a_check_was_not_checked_when_the_script_ended_too_early():
    from reprobisect.workflows.doctor.model import Finding
    from reprobisect.workflows.doctor.run import ended_early

    short = Finding("overfit", "warning", "cannot fit one batch: repeated 2 times with dropout ...",
                    {"steps_run": 2, "steps_asked": 20, "wall_s": 1.0}, "inspect ...")
    got = ended_early(short)
    assert (got.check, got.severity, got.cause) == (
        "overfit", "info", "not checked — the script ended after 2 step(s); it needs 20")
    assert "--overfit-steps 2" in got.next and got.evidence == short.evidence
    fit = Finding("overfit", "info", "fits one batch: loss 1 -> 0.01", {"steps_run": 2, "steps_asked": 20})
    whole = Finding("overfit", "warning", "cannot fit one batch", {"steps_run": 20, "steps_asked": 20})
    assert ended_early(fit) is fit and ended_early(whole) is whole
    from reprobisect.render.doctor import render_doctor
    from reprobisect.workflows.doctor.model import Diagnosis

    text = render_doctor(Diagnosis(findings=(got,), checks=("overfit",), command=("python", "t.py"), steps=10,
                                   traces={}, wall_s=1.0))
    assert "not checked — the script ended after 2 step(s); it needs 20" in text


def _sessions(root: Path) -> None:
    for i, name in enumerate(("0001aaaa", "0002bbbb")):
        log = SessionLog.create(root / "sessions" / f"{name}.jsonl",
                                {"good": "a" * 40, "bad": "c" * 40, "command": ["python", f"train{i}.py"]})
        log.append(SessionEvent(point="a" * 40, verdict="good", role="endpoint"))
        os.utime(log.path, (1_000_000 + i, 1_000_000 + i))


def test_report_of_a_sessions_folder_says_which_session_and_session_picks_another(tmp_path, capsys):
    root = tmp_path / "reprobisect"
    _sessions(root)
    assert main(["report", str(root), "--html", str(tmp_path / "new.html")]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ["session 0002bbbb (the newest of 2; --session ID picks another)"]
    assert "0002bbbb.jsonl" in (tmp_path / "new.html").read_text()
    assert main(["report", str(root), "--session", "0001", "--html", str(tmp_path / "old.html")]) == 0
    page = (tmp_path / "old.html").read_text()
    assert "0001aaaa.jsonl" in page and "0002bbbb.jsonl" not in page
    assert main(["report", str(root), "--session", "0003", "--html", str(tmp_path / "x.html")]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"error: --session 0003: no session matches in {root / 'sessions'} (newest first: 0002bbbb, 0001aaaa); "
        "give one of these IDs")
    assert not (tmp_path / "x.html").exists()


@pytest.mark.slow
def test_runs_without_a_terminal_says_every_phase_as_lines(tmp_path, capsys):
    """A real ``bisect runs`` on a generated 4-commit history, stderr no terminal (a CI log):
    a line for each endpoint probe, each search probe of the expected count, each re-check."""
    from reprobisect.core.options import ProbeOptions
    from reprobisect.workflows.demo import build_demo_repo
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    repo = build_demo_repo(tmp_path / "repo", n_commits=4, culprit_at=2, broken_at=None)
    cfg = RunsConfig(repo=None, cwd=str(repo.path), good=repo.good, bad=repo.bad,
                     command=("python", "train.py", "--steps", "20", "--seed", "0"), options=ProbeOptions(jobs=1))
    result = find_first_bad(cfg)
    assert result and result.first_bad.hash == repo.culprit
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("bisect runs (match): ")]
    said = [ln.split(": ", 1)[1] for ln in lines]
    assert said[0].startswith("endpoints: 2 probe(s) expected · verifying --good "), said
    assert re.fullmatch(r"endpoints: probe 1 of ~2 · about \d+s left · --good \w+: good", said[1]), said
    assert re.fullmatch(r"endpoints: probe 2 of ~2 · --bad \w+: bad", said[2]), said
    assert re.fullmatch(r"search: \d probe\(s\) expected · \d+ commits left", said[3]), said
    assert any(re.fullmatch(r"search: probe 1 of ~\d( · about \d+s left)?", s) for s in said), said
    assert any(s.startswith("re-check: 2 probe(s) expected · re-checking ") for s in said), said
    assert any(s.startswith("re-check: probe 2 of ~2 · ") for s in said), said
