"""capture and zoom run as probes through an executor (issue 11 item 1), on the local one here.

Cheap: the scripts import no framework (the launcher ends them ``no_steps``, with a failed
trace that still records the command, its folder and its output).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import Future

import pytest

from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.errors import ProbeError
from reprobisect.executors.base import Executor
from reprobisect.executors.local import LocalExecutor
from reprobisect.support.outputlog import OUTPUT_LOG
from reprobisect.trace import read_trace
from reprobisect.workflows.capture import CaptureConfig, capture
from reprobisect.workflows.zoom import run_zoom


class Recording:
    """An executor that hands every probe to a real ``LocalExecutor`` and keeps the specs."""

    def __init__(self, inner: LocalExecutor) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_parallel = inner.max_parallel
        self.live_output = inner.live_output
        self.specs: list[ProbeSpec] = []

    def submit(self, spec: ProbeSpec) -> "Future[ProbeResult]":
        self.specs.append(spec)
        return self.inner.submit(spec)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("work")
    (d / "hello.py").write_text("import sys\nprint('hello from the command')\nprint('to stderr', file=sys.stderr)\n")
    return d


def test_capture_runs_on_the_given_executor_into_the_o_folder_and_streams_live(work, tmp_path, capfd):
    with LocalExecutor(jobs=1, out_dir=tmp_path / "executor-out") as local:
        ex = Recording(local)
        assert isinstance(ex, Executor)
        r = capture(["python", "hello.py"], tmp_path / "run.trace", CaptureConfig(steps=1), cwd=work, executor=ex)
    assert [s.key for s in ex.specs] == ["capture"] and ex.specs[0].echo
    assert ex.specs[0].trace_dir == str(tmp_path / "run.trace")
    assert r.outcome.status == "no_steps" and r.trace == str(tmp_path / "run.trace")
    assert (tmp_path / "run.trace" / "manifest.json").is_file()
    assert "hello from the command" in (tmp_path / "run.trace" / OUTPUT_LOG).read_text()
    seen = capfd.readouterr()
    assert seen.out.count("hello from the command") == 1 and "to stderr" in seen.err  # live, once
    assert list((tmp_path / "executor-out").iterdir()) == []  # the executor's own folder: unused


def test_capture_replaces_an_earlier_trace_and_quiet_streams_nothing(work, tmp_path, capfd):
    out = tmp_path / "again.trace"
    (tmp_path / "other.py").write_text("print('the other command')\n")
    capture(["python", "hello.py"], out, CaptureConfig(steps=1, quiet=True), cwd=work)
    assert read_trace(out, allow_incomplete=True).manifest.command == ["hello.py"]
    capture(["python", "other.py"], out, CaptureConfig(steps=1, quiet=True), cwd=tmp_path)
    assert read_trace(out, allow_incomplete=True).manifest.command == ["other.py"]  # replaced, not refused
    seen = capfd.readouterr().out
    assert "hello from the command" not in seen and "the other command" not in seen


def _launch(work, trace):
    r = subprocess.run([sys.executable, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "1",
                        "--", "hello.py"], cwd=work, capture_output=True, text=True, timeout=120)
    assert r.returncode == 6, r.stderr  # no_steps: nothing trained, the trace still names the command
    return read_trace(trace, allow_incomplete=True)


def test_zoom_reruns_both_sides_on_the_given_executor(work, tmp_path):
    a, b = _launch(work, tmp_path / "a"), _launch(work, tmp_path / "b")
    with LocalExecutor(jobs=2, out_dir=tmp_path / "executor-out") as local:
        ex = Recording(local)
        with pytest.raises(ProbeError, match="zoom re-run of side A did not record a trace: no_steps"):
            run_zoom(a, b, module="m", step=0, trust=True, executor=ex, out_dir=str(tmp_path / "zoom"))
    assert [s.key for s in ex.specs] == ["zoom-a", "zoom-b"]
    assert [s.trace_dir for s in ex.specs] == [str(tmp_path / "zoom" / "a.trace"), str(tmp_path / "zoom" / "b.trace")]
    assert all(s.extra_launch_args == ("--zoom-module", "m", "--zoom-step", "0") for s in ex.specs)
    assert (tmp_path / "zoom" / "a.trace" / "manifest.json").is_file()
    assert (tmp_path / "zoom" / "b.trace" / "manifest.json").is_file()
    assert list((tmp_path / "executor-out").iterdir()) == []
