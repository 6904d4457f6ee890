"""The command's own output: kept bounded as ``output.log`` in the trace folder, streamed
live by ``bisect capture`` (hidden by ``--quiet``), shown as a tail when a probe crashes,
and never printed by searches otherwise. The trace stays valid with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect.support.outputlog import KEEP_BYTES, OUTPUT_LOG, BoundedOutput
from reprobisect.workflows.capture import OUTCOME_LOG_CHARS

ROOT = Path(__file__).resolve().parents[1]

TRAIN = """import sys
import torch
print("hello from the script", flush=True)
print("a warning on stderr", file=sys.stderr, flush=True)
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(8, 4)
for _ in range(3):
    opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step()
"""

CHATTY = """import sys
sys.stdout.write("FIRST LINE\\n")
line = "x" * 99 + "\\n"
for _ in range(30000):  # ~3 MB
    sys.stdout.write(line)
sys.stdout.write("LAST LINE\\n")
"""

CRASH = """print("loading the data", flush=True)
print("about to divide by zero", flush=True)
1 / 0
"""


def _bisect(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "reprobisect", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def test_bounded_output_keeps_head_and_tail_with_a_marker():
    log = BoundedOutput(head=100, tail=50)
    log.write(b"A" * 60)
    log.write(b"B" * 1000)
    log.write(b"C" * 30)
    data = log.getvalue()
    assert data.startswith(b"A" * 60 + b"B" * 40)
    assert data.endswith(b"B" * 20 + b"C" * 30)
    assert b"940 bytes of output left out" in data and log.omitted == 940
    assert len(data) < 100 + 50 + 200
    small = BoundedOutput(head=100, tail=50)
    small.write(b"hello\n")
    assert small.getvalue() == b"hello\n"  # nothing left out: no marker


@pytest.mark.slow
@pytest.mark.torch
def test_capture_streams_the_output_keeps_it_and_the_trace_stays_valid(tmp_path):
    from reprobisect.trace.reader import read_trace

    (tmp_path / "train.py").write_text(TRAIN)
    r = _bisect("capture", "-o", "t", "--", "python", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "hello from the script" in r.stdout and "a warning on stderr" in r.stderr  # live, as git bisect run
    log = (tmp_path / "t" / OUTPUT_LOG).read_text()
    assert "hello from the script" in log and "a warning on stderr" in log
    tr = read_trace(tmp_path / "t")  # sealed, complete, digests verified: output.log does not break it
    assert tr.complete and len(tr.steps) == 3
    q = _bisect("capture", "-q", "-o", "q", "--", "python", "train.py", cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    assert "hello from the script" not in q.stdout + q.stderr
    assert "hello from the script" in (tmp_path / "q" / OUTPUT_LOG).read_text()
    j = _bisect("capture", "--json", "-o", "j", "--", "python", "train.py", cwd=tmp_path)
    assert json.loads(j.stdout)["output_log"] == str(tmp_path / "j" / OUTPUT_LOG)  # stdout is only the JSON


def test_a_chatty_command_is_kept_bounded_on_disk(tmp_path):
    (tmp_path / "chatty.py").write_text(CHATTY)
    r = _bisect("capture", "-q", "-o", "t", "--", "python", "chatty.py", cwd=tmp_path)
    assert r.returncode == 1  # no optimizer step: nothing to compare (the trace folder is still made)
    data = (tmp_path / "t" / OUTPUT_LOG).read_bytes()
    # the command's own output, bounded; then reprobisect's outcome line (bounded too)
    own, sep, ours = data.rpartition(b"reprobisect: ")
    assert sep and len(own) <= 2 * KEEP_BYTES + 200 and len(ours) <= OUTCOME_LOG_CHARS * 4
    assert own.startswith(b"FIRST LINE\n") and b"LAST LINE\n" in own[-200:]
    assert b"bytes of output left out here" in own


def test_repro_shows_the_tail_of_a_crashed_run_and_keeps_searches_quiet(tmp_path):
    (tmp_path / "crash.py").write_text(CRASH)
    r = _bisect("repro", "--runs", "2", "--", "python", "crash.py", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "| about to divide by zero" in r.stderr, r.stderr  # the tail of what it printed
    assert "Traceback" not in r.stdout



@pytest.mark.slow
@pytest.mark.torch
def test_searches_keep_the_output_in_the_log_not_on_the_terminal(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    r = _bisect("repro", "--runs", "2", "--keep", "-o", "traces", "--", "python", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "hello from the script" not in r.stdout + r.stderr
    logs = sorted((tmp_path / "traces").glob(f"*/{OUTPUT_LOG}"))
    assert len(logs) == 2 and all("hello from the script" in p.read_text() for p in logs)


@pytest.mark.slow
@pytest.mark.torch
def test_runs_shows_the_tail_of_a_crashed_probe(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    git("init", "-q", "-b", "main")
    for i, text in enumerate([TRAIN, TRAIN.replace("for _ in", "print('about to crash', flush=True)\nraise SystemExit(3)\nfor _ in"),
                              TRAIN.replace("for _ in", "raise SystemExit(3)\nfor _ in")]):
        (root / "train.py").write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", f"c{i}")
    r = _bisect("runs", "--check", "finite", "--good", "HEAD~2", "--bad", "HEAD", "--", "python", "train.py", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "| about to crash" in r.stderr, r.stderr  # the crashed search probe's last output
    assert "hello from the script" not in r.stdout  # never on stdout: the answer is
