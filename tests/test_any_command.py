"""Any command, recorded (issue 13 items 1-2): job scripts, torchrun, mp.spawn, one shard per rank.

Real processes throughout: ``bash`` job scripts, the real ``torchrun`` (gloo on CPU, 2
ranks, a tiny DDP model, 3 steps), ``torch.multiprocessing.spawn``. The expensive runs are
shared by module-scoped fixtures; the torchrun ones are ``slow`` (each takes a few seconds of
``import torch`` per process). After every probe no process of it is left running
(``anycommand.tree_pids`` finds them by the probe's token; the tests look by command line too).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reprobisect.core.probe import ProbeSpec
from reprobisect.executors import anycommand
from reprobisect.executors.process import launch_argv, run_in_dir

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "examples" / "corpus"
PY = sys.executable
BIN = os.path.dirname(PY)
TORCHRUN = os.path.join(BIN, "torchrun")

TRAIN = '''
import argparse, torch
from torch import nn
p = argparse.ArgumentParser(); p.add_argument("--steps", type=int, default=6); p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
torch.manual_seed(a.seed)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 4); y = x.sum(1, keepdim=True)
for step in range(a.steps):
    opt.zero_grad(); loss = ((model(x[step % 4 * 8:][:8]) - y[step % 4 * 8:][:8]) ** 2).mean(); loss.backward(); opt.step()
    print("step", step, float(loss), flush=True)
'''

JOB = '''#!/usr/bin/env bash
set -euo pipefail
echo "job: start"
python train.py "$@"
echo "job: end"
'''

SPAWN = '''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def worker(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(5):
        opt.zero_grad(); model(torch.randn(8, 4, generator=g)).pow(2).mean().backward(); opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, int(sys.argv[1])), nprocs=2)
'''

HANG = '''
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
open(f"started-{dist.get_rank()}", "w").write(str(os.getpid()))
time.sleep(600)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spec(folder: Path, *argv: str, steps: int = 3, timeout: float | None = 300, env: dict | None = None) -> ProbeSpec:
    return ProbeSpec(key="k", argv=tuple(argv), steps=steps, timeout=timeout,
                     env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})})


def _alive_with(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (a test's own folder) or run in it."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        if (text in cmd or cwd.startswith(text)) and state != "Z":
            out.append(f"{name}: {cmd}")
    return out


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _bisect(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([PY, "-m", "reprobisect", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


# --------------------------------------------------------------------------- argv (no process)


def test_launch_argv_keeps_python_and_passes_any_other_command(tmp_path):
    assert launch_argv(ProbeSpec(key="k", argv=("bash", "train.sh", "--x")), tmp_path / "T") == ["bash", "train.sh", "--x"]
    argv = ("torchrun", "--nproc_per_node", "2", "train.py")
    assert launch_argv(ProbeSpec(key="k", argv=argv), tmp_path / "T") == list(argv)
    cmd = launch_argv(ProbeSpec(key="k", argv=("python", "-m", "torch.distributed.run", "t.py")), tmp_path / "T")
    assert cmd == [PY, "-m", "torch.distributed.run", "t.py"]  # torchrun's agent runs as given, our interpreter
    cmd = launch_argv(ProbeSpec(key="k", argv=("python", "t.py")), tmp_path / "T")
    assert cmd[:3] == [PY, "-m", "reprobisect.runners.launch"] and cmd[-2:] == ["--", "t.py"]  # the fast path
    # the torchrun console script is a #! Python script, but only an agent: it runs as given (were it run by the
    # launcher, the agent's own empty recording would print a no_steps line beside the ranks' traces)
    assert launch_argv(ProbeSpec(key="k", argv=(TORCHRUN, "t.py")), tmp_path / "T") == [TORCHRUN, "t.py"]
    assert launch_argv(ProbeSpec(key="k", argv=("python", TORCHRUN, "t.py")), tmp_path / "T")[1:] == [TORCHRUN, "t.py"]


# --------------------------------------------------------------------------- a job script around one process


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    (d / "train.py").write_text(TRAIN)
    (d / "job.sh").write_text(JOB)
    (d / "job.sh").chmod(0o755)
    user = d / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text(
        "import os\nopen(os.path.join(os.environ['USER_SITE_MARKS'], f'site-{os.getpid()}'), 'w').close()\n")
    (d / "marks").mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(user)]), "USER_SITE_MARKS": str(d / "marks")}
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side: each mostly waits on its import of torch
        direct = pool.submit(run_in_dir, _spec(d, "python", "train.py", env=env), d, d / "direct.trace")
        wrapped = pool.submit(run_in_dir, _spec(d, "bash", "job.sh", env=env), d, d / "job.trace")
        return d, direct.result(), wrapped.result()


def test_a_job_script_records_the_flat_trace_the_direct_command_records(job):
    d, direct, wrapped = job
    assert direct.outcome.status == "ok", direct.outcome
    assert wrapped.outcome.status == "ok", (wrapped.outcome, wrapped.output_tail)
    m = _manifest(d / "job.trace")
    assert m["status"] == "complete" and m["steps"] == 3 and m["command"] == ["bash", "job.sh"]
    assert not (d / "job.trace" / "ranks").exists()
    assert "job: start" in (d / "job.trace" / "output.log").read_text()
    p = _bisect("compare", "--tolerance", "bitwise", str(d / "direct.trace"), str(d / "job.trace"), cwd=d)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_launcher_records_once_with_the_bootstrap_on_its_path(job):
    d, direct, wrapped = job
    for r in (direct, wrapped):  # a second recorder in one process would find the flat trace taken
        assert "steps an optimizer too" not in r.output_tail and "not recorded" not in r.outcome.detail
    assert _manifest(d / "direct.trace")["recorder"]["launcher"] == "reprobisect.runners.launch"


def test_the_users_sitecustomize_keeps_running(job):
    d, direct, wrapped = job
    marks = list((d / "marks").iterdir())
    # the fast path's launcher and the job script's python: each ran the user's sitecustomize
    assert len(marks) >= 2, marks


@pytest.mark.slow
def test_the_corpus_job_script_records_its_training_process_and_not_its_data_workers(tmp_path):
    for f in ("job.sh", "mingpt_trainer.py"):
        shutil.copy(CORPUS / f, tmp_path)
    r = run_in_dir(_spec(tmp_path, "bash", "job.sh", "--seed", "3"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "ok", (r.outcome, r.output_tail)
    m = _manifest(tmp_path / "T")
    assert m["steps"] == 3 and m["recorder"]["launcher"] == "reprobisect.runners.bootstrap"
    assert sorted(p.name for p in (tmp_path / "T").iterdir()) == ["manifest.json", "output.log", "steps.jsonl"]
    assert "job: done" in r.output_tail  # the job script went on after the recording ended
    assert not _alive_with(str(tmp_path))


@pytest.mark.slow
def test_the_rest_of_a_job_script_is_stopped_after_the_recording_ended(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "long.sh").write_text("python train.py\necho evaluating\nsleep 300\nexit 4\n")
    r = run_in_dir(_spec(tmp_path, "bash", "long.sh", steps=2, timeout=200), tmp_path, tmp_path / "T")
    assert r.outcome.status == "ok", (r.outcome, r.output_tail)
    assert "the rest of the command was stopped 5 s after the recording ended" in r.outcome.detail
    assert r.outcome.wall_s < 100 and "evaluating" in r.output_tail
    assert not _alive_with(str(tmp_path))


@pytest.mark.slow
def test_two_training_processes_under_one_script_the_first_is_the_trace(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    # side by side (one after the other, the second would be cut with the rest of the script)
    (tmp_path / "twice.sh").write_text("python train.py --seed 1 &\npython train.py --seed 2 &\nwait\n")
    r = run_in_dir(_spec(tmp_path, "bash", "twice.sh", steps=2), tmp_path, tmp_path / "T")
    assert r.outcome.status == "ok", (r.outcome, r.output_tail)
    assert "1 other process(es) stepped an optimizer and were not recorded" in r.outcome.detail
    m = _manifest(tmp_path / "T")
    assert m["steps"] == 2 and m["recorder"]["process"]["argv"] in (["train.py", "--seed", s] for s in "12")
    assert "steps an optimizer too" in r.output_tail


@pytest.mark.slow
def test_a_launched_script_whose_child_trains_says_which_process_to_give(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "main.py").write_text("import subprocess, sys\nsubprocess.run([sys.executable, 'train.py'], check=True)\n")
    r = run_in_dir(_spec(tmp_path, "python", "main.py"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "no_steps", r.outcome
    assert "a process it started trained instead (train.py" in r.outcome.detail


def test_any_command_without_training_is_no_steps_and_a_missing_script_skip(tmp_path):
    r = run_in_dir(_spec(tmp_path, "ls", "-l"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "no_steps" and not (tmp_path / "T" / "manifest.json").exists()
    r = run_in_dir(_spec(tmp_path, "bash", "nothere.sh"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "skip", r.outcome
    (tmp_path / "job.sh").write_text("#!/bin/sh\nexit 0\n")
    r = run_in_dir(_spec(tmp_path, "./job.sh"), tmp_path, tmp_path / "T")
    assert r.outcome.status == "skip" and "not found or not executable" in r.outcome.detail


# --------------------------------------------------------------------------- torchrun


def _torchrun(d: Path, *args: str, agent: tuple[str, ...] = (TORCHRUN,)) -> tuple[str, ...]:
    return (*agent, "--nproc_per_node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{_free_port()}", "ddp_torchrun.py", *args)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp")
    shutil.copy(CORPUS / "ddp_torchrun.py", d)
    # the agent as a module of the interpreter (a bare "python": reprobisect's); torchrun itself below
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side, each on its own rendezvous port
        ok = pool.submit(run_in_dir, _spec(d, *_torchrun(d, agent=("python", "-m", "torch.distributed.run"))), d,
                         d / "ok.trace")
        crash = pool.submit(run_in_dir, _spec(d, *_torchrun(d, "--crash_rank", "1", "--crash_step", "1"), steps=4), d,
                            d / "crash.trace")
        return d, ok.result(), crash.result()


@pytest.mark.slow
def test_torchrun_writes_one_shard_per_rank_and_none_for_the_agent(ddp):
    d, ok, _ = ddp
    assert ok.outcome.status == "ok", (ok.outcome, ok.output_tail)
    t = d / "ok.trace"
    assert sorted(p.name for p in (t / "ranks").iterdir()) == ["rank-0", "rank-1"]
    assert not (t / "steps.jsonl").exists()
    top = _manifest(t)
    assert top["world_size"] == 2 and [r["rank"] for r in top["ranks"]] == [0, 1]
    assert top["outcome"]["status"] == "ok"
    for r in (0, 1):
        m = _manifest(t / "ranks" / f"rank-{r}")
        assert m["status"] == "complete" and m["steps"] == 3
        assert len((t / "ranks" / f"rank-{r}" / "steps.jsonl").read_text().splitlines()) == 3
        dist = m["extra"]["distributed"]
        assert dist == {"rank": r, "local_rank": r, "world_size": 2, "backend": "gloo", "device": "cpu"}
    assert not _alive_with(str(d))


@pytest.mark.slow
def test_a_rank_that_crashes_ends_the_probe_crashed_naming_it(ddp):
    d, _, crash = ddp
    assert crash.outcome.status == "crashed", (crash.outcome, crash.output_tail)
    assert crash.outcome.detail.startswith("rank 1 crashed at step 1"), crash.outcome.detail
    assert "--crash_rank" in crash.outcome.detail
    m = _manifest(d / "crash.trace" / "ranks" / "rank-1")
    assert m["status"] == "failed" and m["steps"] == 1
    assert _manifest(d / "crash.trace")["outcome"]["status"] == "crashed"
    assert not _alive_with(str(d))


@pytest.mark.slow
def test_capture_of_torchrun_through_the_cli(ddp):
    d, _, _ = ddp
    port = _free_port()
    p = _bisect("capture", "-o", "cli.trace", "--steps", "2", "--json", "--", "torchrun", "--standalone",
                "--nproc_per_node", "2", "ddp_torchrun.py", "--seed", str(port % 7), cwd=d)
    res = json.loads(p.stdout)
    assert p.returncode == 0 and res["outcome"]["status"] == "ok", p.stdout + p.stderr[-3000:]
    assert [_manifest(d / "cli.trace" / "ranks" / f"rank-{r}")["steps"] for r in (0, 1)] == [2, 2]


@pytest.mark.slow
def test_a_timeout_kills_the_whole_tree_and_frees_the_port(tmp_path):
    (tmp_path / "hang.py").write_text(HANG)
    port = _free_port()
    argv = (TORCHRUN, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port), "hang.py")
    seen: list[int] = []

    def watch() -> None:  # the ranks' pids, from the files they write once started
        while len(seen) < 2:
            seen[:] = [int(p.read_text()) for p in tmp_path.glob("started-*") if p.read_text()]
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    r = run_in_dir(_spec(tmp_path, *argv, timeout=15), tmp_path, tmp_path / "T")
    assert r.outcome.status == "timeout", (r.outcome, r.output_tail)
    assert len(seen) == 2, "the ranks never started; the timeout killed nothing worth checking"
    for pid in seen:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    assert not _alive_with(str(tmp_path))
    with socket.socket() as s:  # the rendezvous port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


# --------------------------------------------------------------------------- mp.spawn


@pytest.mark.slow
def test_mp_spawn_children_are_recorded_as_ranks(tmp_path):
    (tmp_path / "spawn_train.py").write_text(SPAWN)
    r = run_in_dir(_spec(tmp_path, "python", "spawn_train.py", str(_free_port())), tmp_path, tmp_path / "T")
    assert r.outcome.status == "ok", (r.outcome, r.output_tail)
    t = tmp_path / "T"
    assert sorted(p.name for p in (t / "ranks").iterdir()) == ["rank-0", "rank-1"]
    for rank in (0, 1):
        m = _manifest(t / "ranks" / f"rank-{rank}")
        assert m["steps"] == 3 and m["extra"]["distributed"]["world_size"] == 2
        assert m["extra"]["distributed"]["rank"] == rank and m["extra"]["distributed"]["backend"] == "gloo"
    assert not (t / "steps.jsonl").exists()  # the launcher's own empty trace gave way to the ranks
    assert not _alive_with(str(tmp_path))


@pytest.mark.slow
def test_an_mp_spawn_rank_that_crashes_is_named(tmp_path):
    crash = SPAWN.replace("opt.step()\n", "opt.step()\n        if rank == 1 and step == 1: raise ValueError('rank 1 broke')\n")
    assert crash != SPAWN
    (tmp_path / "spawn_crash.py").write_text(crash)
    r = run_in_dir(_spec(tmp_path, "python", "spawn_crash.py", str(_free_port()), steps=4), tmp_path, tmp_path / "T")
    assert r.outcome.status == "crashed" and r.outcome.detail.startswith("rank 1 crashed at step 2"), r.outcome
    m = _manifest(tmp_path / "T" / "ranks" / "rank-1")  # mp.spawn's worker caught it and exited 1
    assert m["status"] == "failed" and m["outcome"]["status"] == "crashed" and m["steps"] == 2
    assert not _alive_with(str(tmp_path))


def test_tree_pids_finds_processes_by_token(tmp_path):
    env = {**os.environ, "REPROBISECT_BOOT_TOKEN": "tok-" + tmp_path.name}
    p = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10  # a loaded machine: the child's /proc entry may lag its start
        while p.pid not in anycommand.tree_pids("tok-" + tmp_path.name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.pid in anycommand.tree_pids("tok-" + tmp_path.name)
        anycommand.kill_tree("tok-" + tmp_path.name)
        assert p.wait(timeout=5) == -9
    finally:
        p.kill()


def _shard(rank: int, status: str, detail: str = "", step: int | None = None, steps: int = 3) -> dict:
    return {"status": "complete" if status == "ok" else "failed", "steps": steps,
            "outcome": {"status": status, "detail": detail, "step": step},
            "extra": {"distributed": {"rank": rank, "local_rank": rank, "world_size": 2}}}


def test_judge_ranks_names_the_rank_that_failed_first_and_never_blames_a_peer():
    peer = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
    shards = {0: _shard(0, "crashed", peer, 1, 1), 1: _shard(1, "crashed", "ValueError: boom", 1, 1)}
    o = anycommand.judge_ranks(shards, 1, "")
    assert o.status == "crashed" and o.detail.startswith("rank 1 crashed at step 1: ValueError: boom"), o.detail
    assert "rank(s) 0 failed after it" in o.detail
    both = {0: _shard(0, "crashed", "A", 1, 1), 1: _shard(1, "crashed", "B", 1, 1)}
    assert anycommand.judge_ranks(both, 1, "", {0: 20.0, 1: 10.0}).detail.startswith("rank 1 crashed")
    killed = {0: {"status": "incomplete"}, 1: _shard(1, "ok")}
    o = anycommand.judge_ranks(killed, 1, "  rank      : 0 (local_rank: 0)\n")
    assert o.status == "crashed" and "rank 0 failed" in o.detail and "never sealed" in o.detail
    ok = {0: _shard(0, "ok"), 1: _shard(1, "ok")}
    assert anycommand.judge_ranks(ok, 0, "").detail == "recorded 3 step(s) on each of 2 rank(s)"
    later = anycommand.judge_ranks(ok, 2, "")  # a job script that failed after its torchrun recorded
    assert later.status == "ok" and "then exited with status 2" in later.detail


def test_launchers_are_not_recorded_and_programs_are():
    from reprobisect.runners.bootstrap import _is_launcher

    assert _is_launcher([PY, "-m", "reprobisect.runners.launch", "--trace", "T", "--", "t.py"])  # records by itself
    assert _is_launcher([PY, TORCHRUN, "--nproc_per_node", "2", "t.py"])
    assert _is_launcher([PY, "-X", "importtime", "-m", "torch.distributed.run", "t.py"])
    assert not _is_launcher([PY, "-u", "train.py", "-m", "torch.distributed.run"])  # the script's own arguments
    assert not _is_launcher([PY, "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"])  # mp.spawn
