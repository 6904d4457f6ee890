"""Shared probe options + config files, and the commands repro, seeds and envs.

End-to-end tests run the real CLI in a subprocess on tiny torch scripts (CPU); the seed
map's logic is also tested on hand-built steps so that every flag is pinned.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from reprobisect.workflows.envs import apply_template, parse_env_spec
from reprobisect.errors import UsageError
from reprobisect.cli.options import build_options, load_config, parse_steps, probe_options, split_command
from reprobisect.core.compare import Tolerance
from reprobisect.core.options import ProbeOptions
from reprobisect.executors.ray import RayConfig
from reprobisect.workflows.seeds import noise_floor, parse_seeds, seed_map, substitute_seed
from reprobisect.trace.format import Record, Step

PY = sys.executable

TRAIN = """
import argparse, os, torch
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=0)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--data-seed", type=int, default=None)
p.add_argument("--hash-init", action="store_true")
a = p.parse_args()
torch.manual_seed(hash("reprobisect") % 2**31 if a.hash_init else a.seed)
X = torch.randn(32, 4, generator=torch.Generator().manual_seed(1)); y = X.sum(1, keepdim=True)
g = torch.Generator().manual_seed(a.seed if a.data_seed is None else a.data_seed)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=8, shuffle=True, generator=g)
m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=a.lr)
for epoch in range(5):
    for xb, yb in dl:
        opt.zero_grad(); torch.nn.functional.mse_loss(m(xb), yb).backward(); opt.step()
"""


@pytest.fixture
def work(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def _bisect(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    import os

    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([PY, "-m", "reprobisect", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e)


# --------------------------------------------------------------------------- options


def test_defaults_and_validation():
    o = ProbeOptions()
    assert (o.steps, o.executor, o.jobs, o.keep, o.quiet) == (3, "local", 1, False, False)
    assert o.tolerance_for("bitwise") == Tolerance(mode="bitwise") and o.tolerance_for("default") == Tolerance(mode="default")
    explicit = build_options({"atol": 1e-5}).tolerance_for()
    assert explicit.canonical() == {"atol": 1e-5, "rtol": 0.0} and explicit.rule("param", "w", "float32") == (1e-5, 0.0)
    for bad, match in [({"steps": 0}, "--steps"), ({"jobs": 0}, "--jobs"), ({"timeout": -1}, "--timeout")]:
        with pytest.raises(UsageError, match=match):
            ProbeOptions(**bad)
    for bad, match in [({"executor": "k8s"}, "unknown executor"), ({"tolerance": "loose"}, "unknown tolerance")]:
        with pytest.raises(UsageError, match=match):
            build_options(bad)


def test_config_file_gives_options_and_flags_win(tmp_path):
    cfg = tmp_path / "probe.yaml"
    cfg.write_text("steps: 7\njobs: 2\nfull-steps: [0, 2]\ntimeout: 30\ntolerance: default\nkeep: true\n")
    o = build_options({"steps": None, "jobs": 4}, cfg)
    assert (o.steps, o.jobs, o.full_steps, o.timeout, o.tolerance, o.keep) == (7, 4, (0, 2), 30.0, Tolerance(mode="default"), True)
    assert o.config == cfg
    (tmp_path / "p.json").write_text(json.dumps({"probe": {"executor": "ray", "ray_address": "auto", "gpus-per-probe": 1}}))
    o = build_options({}, tmp_path / "p.json")
    assert o.executor_config == RayConfig(address="auto", gpus_per_probe=1.0)


@pytest.mark.parametrize(
    "text, match",
    [
        ("stepz: 3\n", "unknown key 'stepz'"),
        ("steps: many\n", "'steps' has a bad value"),
        ("- 1\n- 2\n", "mapping"),
        ("steps: [\n", "not valid YAML"),
        ("keep: 3\n", "'keep' has a bad value"),
    ],
)
def test_config_file_errors_are_one_clear_line(tmp_path, text, match):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(UsageError, match=match) as e:
        build_options({}, cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_probe_options_decorator_and_split_command(tmp_path):
    seen = {}

    @click.command()
    @probe_options
    @click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
    def cmd(options, cmd):
        seen["o"], seen["argv"] = options, split_command(cmd)

    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 9\nquiet: true\n")
    r = CliRunner().invoke(cmd, ["--config", str(cfg), "-j", "2", "--full-steps", "0,1", "--keep", "--", "python", "t.py", "--steps", "1"])
    assert r.exit_code == 0, r.output
    o = seen["o"]
    assert (o.steps, o.jobs, o.full_steps, o.keep, o.quiet) == (9, 2, (0, 1), True, True)
    assert seen["argv"] == ["python", "t.py", "--steps", "1"]  # flags after -- belong to CMD
    with pytest.raises(UsageError, match="give the training command after --"):
        split_command(())
    assert parse_steps("0, 3") == (0, 3)
    with pytest.raises(UsageError, match="--full-steps"):
        parse_steps("a,b")


# --------------------------------------------------------------------------- help + bad input


@pytest.mark.parametrize("name", ["probe", "repro", "seeds", "envs"])
def test_help(name):
    from reprobisect.cli import cli

    r = CliRunner().invoke(cli, [name, "--help"])
    assert r.exit_code == 0 and "--steps" in r.output and "--config" in r.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["repro"], "give the training command after --"),
        (["repro", "--runs", "1", "--", "python", "train.py"], "--runs must be at least 2"),
        (["seeds", "--seeds", "0,1", "--", "python", "train.py"], "no {seed} placeholder"),
        (["seeds", "--seeds", "3", "--", "python", "train.py", "{seed}"], "at least two different seeds"),
        (["seeds", "--seeds", "0,1", "--noise-floor", "--", "python", "t.py", "{seed}"], "at least 3 seeds"),
        (["envs", "--a", "lr=1", "--b", "lr=2", "--", "python", "train.py", "--dtype", "{dtype}"], "does not set it"),
        (["envs", "--a", "oops", "--b", "x=1", "--", "python", "train.py"], "is not KEY=VALUE"),
        (["repro", "--config", "nope.yaml", "--", "python", "train.py"], "does not exist"),
        (["repro", "--steps", "0", "--", "python", "train.py"], "--steps must be at least 1"),
    ],
)
def test_bad_input_is_one_line_exit_2(work, args, message):
    p = _bisect(*args, cwd=work)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- repro


@pytest.mark.slow
def test_repro_deterministic_then_hashseed_differ_exposes_hash_order(work):
    fixed = {"PYTHONHASHSEED": "0"}
    p = _bisect("repro", "--runs", "2", "-j", "2", "--", "python", "train.py", "--hash-init", cwd=work, env=fixed)
    assert p.returncode == 0, p.stderr
    assert "deterministic: 2 runs identical" in p.stdout
    assert "PYTHONHASHSEED=0" in p.stdout  # the environment record shows what was set
    p = _bisect("repro", "--runs", "2", "-j", "2", "--hashseed-differ", "--json", "--", "python", "train.py", "--hash-init", cwd=work, env=fixed)
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    assert data["deterministic"] is False and data["hashseeds"] == ["0", "1"]
    first = data["comparisons"][0]["first"]
    assert first["step"] == 0 and first["kind"] == "init" and first["name"] == "0.weight"  # init of the first Linear


def test_repro_library_reports_a_crash_as_probe_error(work):
    from reprobisect.errors import ProbeError
    from reprobisect.workflows.repro import run_repro

    (work / "bad.py").write_text("raise RuntimeError('broken')\n")
    with pytest.raises(ProbeError, match="crashed"):
        run_repro(["python", "bad.py"], ProbeOptions(jobs=2), cwd=work)


# --------------------------------------------------------------------------- seeds


@pytest.mark.slow
def test_seeds_end_to_end_flags_a_data_order_ignoring_the_seed(work):
    p = _bisect("seeds", "--seeds", "0,1", "-j", "2", "--json", "--", "python", "train.py", "--seed", "{seed}", "--data-seed", "7", cwd=work)
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    comps = data["components"]
    assert comps["data_order"]["status"] == "unchanged"
    assert comps["init"]["status"] == "changed"
    assert comps["loss"]["status"] == "changed"
    assert any("data order ignores the seed" in f for f in data["flags"])
    assert [r["outcome"]["status"] for r in data["runs"]] == ["ok", "ok"]


@pytest.mark.slow
def test_seeds_isolates_init_on_shared_samples_with_full_step_0(work):
    """Data order and init both follow the seed: step-0 tensors still separate them."""
    p = _bisect("seeds", "--seeds", "0,1", "-j", "2", "--full-steps", "0", "--json", "--", "python", "train.py", "--seed", "{seed}", cwd=work)
    assert p.returncode == 0, p.stderr
    comps = json.loads(p.stdout)["components"]
    assert comps["data_order"]["status"] == "changed"
    assert comps["init"]["status"] == "changed" and "both batches share" in comps["init"]["evidence"]
    assert comps["augmentation"]["status"] == "unchanged"


def _rec(kind, name, fp, module=None, inputs=None, **stats):
    return Record(name=name, kind=kind, dtype="float32", shape=(2,), fingerprint=fp, module=module,
                  inputs=tuple(inputs) if inputs is not None else None, stats=stats or None)


class _T:
    def __init__(self, steps):
        self.steps = steps

    def step(self, k):
        return next(s for s in self.steps if s.step == k)


def _trace(ids, x, lin, drop, loss, grad_norm=1.0, extra=()):
    recs = [
        _rec("batch", "data[0]", x),
        _rec("activation", "0", lin, module="Linear", inputs=[x]),
        _rec("activation", "1", drop, module="Dropout", inputs=[lin]),
        *extra,
        _rec("loss", "loss", loss, mean=float(ord(loss[0]))),
    ]
    return _T([Step(step=0, records=tuple(recs), batch_ids=ids, scalars={"loss": float(ord(loss[0])), "grad_norm": grad_norm})])


def test_seed_map_components_and_flags():
    # everything changes with the seed: no flags (init unknown: the data differs from the first layer on)
    m = seed_map([_trace([3, 1], "a", "b", "c", "d"), _trace([0, 2], "e", "f", "g", "h")], ("0", "1"))
    st = {c.component: c.status for c in m}
    assert st == {"init": "unknown", "data_order": "changed", "augmentation": "unknown", "dropout": "unknown", "loss": "changed"}
    assert not [c.flag for c in m if c.flag]
    # same data, init and dropout change
    m = seed_map([_trace([3, 1], "a", "b", "c", "d"), _trace([3, 1], "a", "f", "g", "h")], ("0", "1"))
    st = {c.component: (c.status, bool(c.flag)) for c in m}
    assert st["init"] == ("changed", False) and st["augmentation"] == ("unchanged", False)
    assert st["data_order"] == ("unchanged", True)  # shuffled order that ignores the seed
    # same init, same shuffled data: dropout identical under both seeds -> flagged; init flagged
    m = seed_map([_trace([3, 1], "a", "b", "c", "d"), _trace([3, 1], "a", "b", "c", "d")], ("0", "1"))
    flags = " ".join(c.flag for c in m if c.flag)
    assert "init ignores the seed" in flags and "dropout ignores the seed" in flags and "data order ignores" in flags
    # sequential order is no shuffling: not flagged
    m = seed_map([_trace([0, 1], "a", "b", "c", "d"), _trace([0, 1], "a", "f", "g", "h")], ("0", "1"))
    dat = next(c for c in m if c.component == "data_order")
    assert dat.status == "unchanged" and dat.flag is None and "sequential" in dat.evidence
    # the reverse: the loss changes although nothing recorded upstream does
    m = seed_map([_trace([0, 1], "a", "b", "c", "d"), _trace([0, 1], "a", "b", "c", "z")], ("0", "1"))
    loss = next(c for c in m if c.component == "loss")
    assert loss.status == "changed" and "nothing recorded upstream" in loss.flag
    # augmentation: same samples, different content
    m = seed_map([_trace([3, 1], "a", "b", "c", "d"), _trace([3, 1], "x", "y", "g", "h")], ("0", "1"))
    assert next(c for c in m if c.component == "augmentation").status == "changed"


def test_noise_floor_and_seed_helpers():
    traces = [_trace([0], "a", "b", "c", chr(ord("a") + i), grad_norm=float(i)) for i in (1, 2, 3)]
    nf = noise_floor(traces)
    assert [s.step for s in nf] == [0]
    assert nf[0].grad_norm == (1.0, 2.0, 3.0) and nf[0].grad_norm_spread["std"] == pytest.approx(1.0)
    assert nf[0].loss_spread["range"] == pytest.approx(2.0)
    assert substitute_seed(["python", "t.py", "--seed={seed}"], "5") == ["python", "t.py", "--seed=5"]
    assert parse_seeds("0, 1,2") == ("0", "1", "2")
    with pytest.raises(UsageError, match="twice"):
        parse_seeds("1,1,2")


# --------------------------------------------------------------------------- envs


def test_env_spec_parsing():
    s = parse_env_spec("python=/opt/py/bin/python,env.CUBLAS_WORKSPACE_CONFIG=:4096:8,device=cuda,note=a\\,b")
    assert s.python == "/opt/py/bin/python"
    assert s.env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert s.variables == {"device": "cuda", "note": "a,b"}
    assert apply_template(["python", "t.py", "--device", "{device}"], s) == ["python", "t.py", "--device", "cuda"]
    with pytest.raises(UsageError, match="env.NAME"):
        parse_env_spec("env.1BAD=x")
    with pytest.raises(UsageError, match=r"--b does not set it"):
        apply_template(["{dtype}"], parse_env_spec("x=1", "b"), "b")


@pytest.mark.slow
def test_envs_end_to_end(work):
    p = _bisect(
        "envs", "-j", "2",
        "--a", "env.OMP_NUM_THREADS=1,lr=0.01",
        "--b", "env.OMP_NUM_THREADS=2,lr=0.02",
        "--", "python", "train.py", "--lr", "{lr}",
        cwd=work,
    )
    assert p.returncode == 1, p.stderr
    out = p.stdout
    assert "OMP_NUM_THREADS" in out
    # the environment diff comes before the first divergence
    assert out.index("OMP_NUM_THREADS") < out.index("first divergence")
    assert "default" in out  # envs compares under the default tolerance


def test_ctrl_c_kills_the_probes_and_exits_130(work):
    """SIGINT to `bisect repro` reaches probes in their own sessions through the executor."""
    import os
    import signal
    import time

    (work / "hang.py").write_text(
        "import subprocess, sys, time, pathlib, os\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "pathlib.Path(f'child-{os.getpid()}.pid').write_text(str(c.pid))\n"
        "time.sleep(300)\n"
    )
    p = subprocess.Popen([PY, "-m", "reprobisect", "repro", "-j", "2", "--", "python", "hang.py"], cwd=work,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while len(list(work.glob("child-*.pid"))) < 2 and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    pids = [int(f.read_text()) for f in work.glob("child-*.pid")]
    assert len(pids) == 2
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert ("interrupted" in err or "aborted" in err) and "Traceback" not in err
    time.sleep(0.3)
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            alive = False
        assert not alive, f"probe child {pid} survived Ctrl-C"


def test_progress_quiet_and_notes(capsys):
    from reprobisect.support.progress import progress

    with progress("x", total=2, quiet=True) as p:
        p.update("probing a")
        p.advance()
        p.note("hidden")
    assert p.completed == 1 and p.status == "probing a"
    with progress("x", total=2) as p:
        p.note("shown line")
    captured = capsys.readouterr()
    assert "hidden" not in captured.err and "shown line" in captured.err and captured.out == ""


def test_example_config_file_loads():
    cfg = Path(__file__).resolve().parents[1] / "configs" / "probe.yaml"
    o = build_options({}, cfg)
    assert (o.steps, o.timeout, o.jobs, o.tolerance, o.full_steps) == (3, 900.0, 2, Tolerance(mode="bitwise"), (0,))
