"""The launcher (``python -m reprobisect.runners.launch``) and ``bisect capture``.

Real subprocesses running small scripts generated in tmp dirs: Python's own script and
``-m`` semantics, the outcome of every way a run can end (ok, skip, crashed with its step,
nonfinite, no_steps), a sealed trace in each case, no orphaned DataLoader workers, and the
``bisect capture`` exit codes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from reprobisect.cli import main as cli_main
from reprobisect.errors import UsageError
from reprobisect.core.outcome import LAUNCH_EXIT
from reprobisect.runners import launch
from reprobisect.trace import read_trace

PY = sys.executable

TRAIN = """
import sys, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
y = torch.randn(16, 1)
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 100):
    {body}
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
{after}
"""


def train_script(body: str = "pass", after: str = "") -> str:
    return TRAIN.format(body=body, after=after)


def write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))
    return p


def launch_run(tmp: Path, prog: list[str], *opts: str, cwd: Path | None = None, timeout: float = 120):
    trace = tmp / "run.trace"
    cmd = [PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), *opts, "--", *prog]
    r = subprocess.run(cmd, cwd=cwd or tmp, capture_output=True, text=True, timeout=timeout)
    return r, trace


def sealed(trace: Path) -> dict:
    return json.loads((trace / "manifest.json").read_text())


# ------------------------------------------------------------------ script semantics

PROBE = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
                  "file": __file__, "torch": "torch" in sys.modules, "tf": "tensorflow" in sys.modules}))
"""


def test_script_runs_as_python_would_and_without_framework_ends_no_steps(tmp_path: Path) -> None:
    script = write(tmp_path, "sub/show.py", PROBE)
    work = tmp_path / "work"
    work.mkdir()
    plain = subprocess.run([PY, str(script), "a", "--b", "c"], cwd=work, capture_output=True, text=True, check=True)
    r, trace = launch_run(tmp_path, [str(script), "a", "--b", "c"], cwd=work)
    assert json.loads(r.stdout) == json.loads(plain.stdout)
    seen = json.loads(r.stdout)
    assert seen["name"] == "__main__" and seen["path0"] == str(script.parent) and seen["cwd"] == str(work)
    assert not seen["torch"] and not seen["tf"], "the launcher imported a framework itself"
    assert r.returncode == LAUNCH_EXIT["no_steps"]
    m = sealed(trace)
    assert m["status"] == "failed" and m["outcome"]["status"] == "no_steps"
    assert "never imported torch" in m["outcome"]["detail"]
    assert "no_steps" in r.stderr


def test_module_mode_runs_as_python_dash_m(tmp_path: Path) -> None:
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/show.py", PROBE)
    plain = subprocess.run([PY, "-m", "pkg.show", "x"], cwd=tmp_path, capture_output=True, text=True, check=True)
    r, _ = launch_run(tmp_path, ["-m", "pkg.show", "x"])
    assert json.loads(r.stdout) == json.loads(plain.stdout)
    assert json.loads(r.stdout)["argv"][0].endswith("show.py")


@pytest.mark.parametrize(
    "text, expect",
    [
        ("import no_such_package_xyz\n", "ModuleNotFoundError"),
        ("def broken(:\n", "SyntaxError"),
        (None, "can't open file"),
    ],
    ids=["import-error", "syntax-error", "missing-script"],
)
def test_failures_before_training_are_skip(tmp_path: Path, text: str | None, expect: str) -> None:
    script = tmp_path / "train.py"
    if text is not None:
        write(tmp_path, "train.py", text)
    r, trace = launch_run(tmp_path, [str(script)])
    assert r.returncode == LAUNCH_EXIT["skip"], r.stderr
    m = sealed(trace)
    assert m["status"] == "failed" and m["outcome"]["status"] == "skip"
    assert expect in m["outcome"]["detail"]


def test_module_not_found_is_skip(tmp_path: Path) -> None:
    r, trace = launch_run(tmp_path, ["-m", "no_such_pkg_abc.train"])
    assert r.returncode == LAUNCH_EXIT["skip"]
    assert "no_such_pkg_abc" in sealed(trace)["outcome"]["detail"]


# ------------------------------------------------------------------ training outcomes


@pytest.mark.parametrize("exc", ["RuntimeError('boom')", "ImportError('late import')"])
def test_crash_at_step_two_is_crashed_with_that_step(tmp_path: Path, exc: str) -> None:
    script = write(tmp_path, "train.py", train_script(body=f"if step == 2: raise {exc}"))
    r, trace = launch_run(tmp_path, [str(script)], "--steps", "5")
    assert r.returncode == LAUNCH_EXIT["crashed"], r.stderr
    m = sealed(trace)
    assert m["status"] == "failed"
    out = m["outcome"]
    assert out["status"] == "crashed" and out["step"] == 2
    assert exc.split("(")[0] in out["traceback"] and "train.py" in out["traceback"]
    t = read_trace(trace, allow_incomplete=True)
    assert [s.step for s in t.steps] == [0, 1]
    with pytest.raises(Exception, match="failed run"):
        read_trace(trace)


def test_stops_after_n_steps_and_seals_complete(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", train_script(after="print('loop ended')"))
    r, trace = launch_run(tmp_path, [str(script)], "--steps", "2")
    assert r.returncode == 0, r.stderr
    assert "loop ended" not in r.stdout, "the run went on after --steps"
    t = read_trace(trace)
    assert t.manifest.outcome["status"] == "ok" and len(t.steps) == 2
    assert t.manifest.environment.get("torch"), "the environment record lacks torch"


def test_script_exit_zero_after_steps_is_ok_nonzero_before_is_crash(tmp_path: Path) -> None:
    ok = write(tmp_path, "ok.py", train_script(after="raise SystemExit(0)"))
    r, trace = launch_run(tmp_path, [str(ok), "2"], "--steps", "5")
    assert r.returncode == 0, r.stderr
    t = read_trace(trace)
    assert len(t.steps) == 2 and "before --steps 5" in t.manifest.outcome["detail"]
    bad = write(tmp_path, "bad.py", "import torch, sys\nsys.exit(3)\n")
    r, trace = launch_run(tmp_path, [str(bad)])
    assert r.returncode == LAUNCH_EXIT["crashed"]
    out = sealed(trace)["outcome"]
    assert out["status"] == "crashed" and "status 3 before the first optimizer step" in out["detail"]


def test_script_that_never_steps_is_no_steps(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", "import torch\nm = torch.nn.Linear(2, 2)\nm(torch.ones(1, 2)).sum().backward()\n")
    r, trace = launch_run(tmp_path, [str(script)])
    assert r.returncode == LAUNCH_EXIT["no_steps"]
    assert "never called optimizer.step()" in sealed(trace)["outcome"]["detail"]


def test_importing_torch_activates_recorder_without_tensorflow(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "train.py",
        train_script(
            body="if step == 0: print('MODS', 'tensorflow' in sys.modules, 'reprobisect.runners.torch' in sys.modules)"
        ),
    )
    r, _ = launch_run(tmp_path, [str(script)], "--steps", "1")
    assert r.returncode == 0, r.stderr
    assert "MODS False True" in r.stdout


def test_stop_on_nonfinite(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", train_script(body="if step == 1: x[0, 0] = float('nan')"))
    r, trace = launch_run(tmp_path, [str(script)], "--steps", "5", "--stop-on-nonfinite")
    assert r.returncode == LAUNCH_EXIT["nonfinite"], r.stderr
    t = read_trace(trace)
    assert t.manifest.outcome["status"] == "nonfinite" and t.manifest.outcome["step"] == 1
    assert len(t.steps) == 2
    assert t.steps[1].scalars["first_nonfinite"] == "input 'input'"
    assert t.manifest.extra["first_nonfinite"] == {"step": 1, "record": "input 'input'"}


def test_max_disk_drops_full_tensors_with_a_message(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", train_script())
    r, trace = launch_run(tmp_path, [str(script)], "--steps", "2", "--full-steps", "0,1", "--max-disk", "3000")
    assert r.returncode == 0, r.stderr
    assert "--max-disk 3000" in r.stderr
    t = read_trace(trace)
    dropped = [s for s in t.steps if f"full tensors of step {s.step} not kept" in " ".join(t.manifest.extra["notes"])]
    assert dropped, t.manifest.extra["notes"]
    assert all(not r.stored for s in dropped for r in s.records)
    kept = sum(p.stat().st_size for p in (trace / "tensors").glob("*")) if (trace / "tensors").exists() else 0
    assert kept <= 3000


WORKERS = """
import os, sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
PIDS = sys.argv[1]
def note(_):
    with open(os.path.join(PIDS, str(os.getpid())), "w"):
        pass
if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 4), torch.randn(512, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=2, worker_init_fn=note,
                        generator=torch.Generator().manual_seed(0))
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_dataloader_workers_do_not_survive_the_stop(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    script = write(tmp_path, "train.py", WORKERS)
    r, trace = launch_run(tmp_path, [str(script), str(pids)], "--steps", "2")
    assert r.returncode == 0, r.stderr
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in workers if _alive(p)], "DataLoader workers outlived the launcher"
    t = read_trace(trace)
    assert len(t.steps) == 2 and len(t.steps[0].batch_ids) == 8


# ------------------------------------------------------------------ arguments


def test_launcher_usage_errors_name_the_fix() -> None:
    with pytest.raises(UsageError, match="after '--'"):
        launch.parse_args(["--trace", "x", "train.py"])
    with pytest.raises(UsageError, match="no script after"):
        launch.parse_args(["--trace", "x", "--"])
    with pytest.raises(UsageError, match="--zoom-step go together"):
        launch.parse_args(["--trace", "x", "--zoom-module", "fc", "--", "t.py"])
    ns, prog = launch.parse_args(["--trace", "x", "--full-steps", "1,0", "--", "-m", "pkg", "--steps", "9"])
    assert ns.full_steps == (0, 1) and ns.steps == 3 and prog == ["-m", "pkg", "--steps", "9"]


# ------------------------------------------------------------------ bisect capture


def test_capture_command_exit_codes(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train.py", train_script())
    write(tmp_path, "broken.py", "import no_such_package_xyz\n")
    write(tmp_path, "crash.py", train_script(body="if step == 1: raise ValueError('bad batch')"))

    assert cli_main(["capture", "-o", "ok.trace", "--steps", "2", "--seed", "7", "--", "python", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "trace: ok.trace" in out.splitlines()  # under the current folder: shown relative
    t = read_trace(tmp_path / "ok.trace")
    assert len(t.steps) == 2 and t.manifest.seed == "7" and t.manifest.command == ["train.py"]

    assert cli_main(["capture", "-o", "skip.trace", "--", "python", "broken.py"]) == 125
    assert "skip" in capsys.readouterr().out
    assert cli_main(["capture", "-o", "crash.trace", "--steps", "4", "--json", "--", "python", "crash.py"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["outcome"]["status"] == "crashed" and res["outcome"]["step"] == 1 and res["exit_code"] == 1
    assert cli_main(["capture", "-o", "x.trace", "--", "python", "-c", "print(1)"]) == 2
    assert "python -c" in capsys.readouterr().err
    assert cli_main(["capture", "-o", "x.trace", "--steps", "0", "--", "python", "train.py"]) == 2


def test_capture_rewrites_python_to_the_launcher(tmp_path: Path) -> None:
    from reprobisect.workflows.capture import CaptureConfig, launch_command

    cmd = launch_command(["python", "-u", "train.py", "--lr", "1"], tmp_path / "t", CaptureConfig(steps=2, seed=3))
    assert cmd[:4] == [sys.executable, "-u", "-m", "reprobisect.runners.launch"]
    assert cmd[cmd.index("--") + 1 :] == ["train.py", "--lr", "1"]
    assert "--seed" in cmd and cmd[cmd.index("--steps") + 1] == "2"
    other = launch_command(["/opt/py/bin/python3.11", "train.py"], tmp_path / "t")
    assert other[0] == "/opt/py/bin/python3.11"


def test_capture_help() -> None:
    r = subprocess.run([PY, "-m", "reprobisect", "capture", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--full-steps" in r.stdout and "--timeout" in r.stdout


def test_zoom_options_record_ops_of_that_module_at_that_step(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", train_script())
    r, trace = launch_run(tmp_path, [str(script)], "--steps", "2", "--zoom-module", "2", "--zoom-step", "1")
    assert r.returncode == 0, r.stderr
    t = read_trace(trace)
    assert not [x for x in t.steps[0].records if "::" in x.name]
    ops = [x.name for x in t.steps[1].records if "::" in x.name]
    assert ops and all(n.startswith("2::aten.") for n in ops)
