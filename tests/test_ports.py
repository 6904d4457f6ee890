"""Rendezvous ports per probe (``reprobisect.executors.ports``): distinct, free, reserved
across processes, never replacing the user's; and two real ``torchrun`` jobs started at
the same instant with the env it gives both rendezvous on their own port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprobisect.executors import ports
from reprobisect.executors.ports import PORT_VARS, free_port, rendezvous_env, rendezvous_vars

ROOT = Path(__file__).resolve().parents[1]


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("0.0.0.0", port))
    s.listen()
    return s


def test_two_calls_give_distinct_free_ports_in_both_variables():
    a, b = rendezvous_env({}), rendezvous_env({})
    for env in (a, b):
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"]  # one port serves torchrun and env:// alike
        port = int(env["MASTER_PORT"])
        assert 20000 <= port < 32768 and port not in (29400, 29500)
        _listen(port).close()  # it is free: a server can bind it
    assert a["MASTER_PORT"] != b["MASTER_PORT"]
    many = {free_port() for _ in range(50)}
    assert len(many) == 50


def test_a_port_the_user_set_is_kept():
    env = rendezvous_env({"MASTER_PORT": "12345", "PATH": "/bin"})
    assert env["MASTER_PORT"] == "12345" and env["PATH"] == "/bin"
    assert env["PET_MASTER_PORT"] != "12345"  # torchrun's own default still gets a free one
    assert rendezvous_vars({"MASTER_PORT": "1", "PET_MASTER_PORT": "2"}) == {}
    only_pet = rendezvous_env({"PET_MASTER_PORT": "23456"})
    assert only_pet["PET_MASTER_PORT"] == "23456" and only_pet["MASTER_PORT"] != "23456"
    assert set(rendezvous_vars({})) == set(PORT_VARS)
    base = {"A": "1"}
    rendezvous_env(base)
    assert base == {"A": "1"}  # the caller's mapping is not changed


def test_a_port_in_use_or_claimed_is_never_handed_out(monkeypatch):
    class Fixed:
        """Offers the same candidates in order (what a busy machine's random draw could give)."""

        def __init__(self, seq):
            self.seq = list(seq)

        def randrange(self, lo, hi):
            return self.seq.pop(0) if self.seq else 29500  # then only ports that are never handed out

    busy = free_port()
    server = _listen(busy)
    try:
        claimed = free_port()
        port = free_port(rng=Fixed([busy, claimed, 29500]))
        # busy (bound), claimed (reserved by another caller) and 29500 skipped: the kernel picked one
        assert port not in (busy, claimed, 29500)
        assert free_port(rng=Fixed([busy, claimed, 23999 if 23999 not in (busy, claimed) else 24001])) in (23999, 24001)
    finally:
        server.close()
    # a claim older than RESERVE_S is stale: the port can be handed out again, and old claims go
    monkeypatch.setattr(ports, "RESERVE_S", 0.0)
    assert free_port(rng=Fixed([claimed])) == claimed
    monkeypatch.setattr(ports, "RESERVE_S", 600.0)
    assert (ports._reservations() / str(claimed)).exists()
    monkeypatch.setattr(ports, "RESERVE_S", 0.0)
    free_port()
    assert not (ports._reservations() / str(claimed)).exists()


def test_two_processes_asking_at_once_get_different_ports(tmp_path):
    code = "from reprobisect.executors.ports import free_port; print(' '.join(str(free_port()) for _ in range(20)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    got = [set(map(int, p.communicate(timeout=60)[0].split())) for p in procs]
    assert len(got[0]) == len(got[1]) == 20 and not got[0] & got[1]


GLOO = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"port": os.environ["MASTER_PORT"], "sum": t.item(), "world": dist.get_world_size()}, f)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_torchrun_jobs_started_at_once_each_rendezvous_on_their_own_port(tmp_path):
    """Two ``torchrun --nproc_per_node 2`` gloo jobs at the same instant, each with the env
    ``rendezvous_env`` gives: both succeed, and each job's ranks met on the port it was given
    (torchrun read PET_MASTER_PORT: static rendezvous on that port, not its default 29500)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    script = tmp_path / "allreduce.py"
    script.write_text(GLOO)
    base = {k: v for k, v in os.environ.items() if k not in PORT_VARS}
    base["OMP_NUM_THREADS"] = "1"
    jobs = []
    for i in range(2):
        out = tmp_path / f"job{i}"
        out.mkdir()
        env = rendezvous_env(base)
        cmd = [str(torchrun), "--nnodes", "1", "--nproc_per_node", "2", str(script), str(out)]
        jobs.append((out, env, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    used = []
    for out, env, proc in jobs:
        log = proc.communicate(timeout=200)[0]
        assert proc.returncode == 0, log[-2000:]
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert all(r["sum"] == 3.0 and r["world"] == 2 for r in ranks)
        assert {r["port"] for r in ranks} == {env["PET_MASTER_PORT"]}
        used.append(env["PET_MASTER_PORT"])
    assert used[0] != used[1]


_SHOW_PORT = textwrap.dedent(
    """
    import json, os, time
    with open(os.path.join(os.environ["RB_SEEN"], os.environ["RB_NAME"] + ".json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in ("MASTER_PORT", "PET_MASTER_PORT")}, f)
    time.sleep(0.5)
    """
)


def test_local_probes_running_at_once_get_their_own_ports_and_a_user_port_is_kept(tmp_path):
    """``--jobs 2`` on this machine: each probe's command sees its own free port; a port set in
    the probe's environment reaches its command unchanged."""
    from reprobisect.executors import ProbeSpec, make_executor

    work = tmp_path / "w"
    work.mkdir()
    (work / "show.py").write_text(_SHOW_PORT)
    seen = tmp_path / "seen"
    seen.mkdir()
    envs = {"a": {}, "b": {}, "mine": {"MASTER_PORT": "23457"}}
    with make_executor("local", jobs=2) as ex:
        futs = [ex.submit(ProbeSpec(key=k, argv=(sys.executable, "show.py"), workdir=str(work), timeout=60,
                                    env={"RB_SEEN": str(seen), "RB_NAME": k, **e})) for k, e in envs.items()]
        for f in futs:
            f.result(timeout=120)
    got = {k: json.loads((seen / f"{k}.json").read_text()) for k in envs}
    assert got["a"]["MASTER_PORT"] and got["a"]["MASTER_PORT"] != got["b"]["MASTER_PORT"]
    assert got["a"]["MASTER_PORT"] == got["a"]["PET_MASTER_PORT"]
    assert got["mine"]["MASTER_PORT"] == "23457" and got["mine"]["PET_MASTER_PORT"] not in (None, "23457")


def test_release_gives_back_the_claims_and_the_folder_goes_with_the_last(tmp_path, monkeypatch):
    """A probe leaves nothing in the temp dir: its port's claim is released when it ends, and the
    claims folder with the last claim; a later probe makes the folder again."""
    import tempfile

    from reprobisect.executors.ports import release

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    a, b = rendezvous_vars({}), rendezvous_vars({})
    (folder,) = tmp_path.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted({a["MASTER_PORT"], b["MASTER_PORT"]})
    release(a)
    assert [p.name for p in folder.iterdir()] == [b["MASTER_PORT"]]  # b's probe still holds its port
    release(b)
    assert list(tmp_path.iterdir()) == []
    release({})  # nothing handed out (the user set the port): nothing to do, no error
    assert rendezvous_vars({})["MASTER_PORT"] and len(list(tmp_path.iterdir())) == 1
