"""The Ray executor on a real local Ray cluster (``ray.cluster_utils.Cluster``, 3 nodes).

One cluster per module: a head (1 CPU), a node with one logical GPU (1 CPU, custom
resource ``gpu_node``) and a CPU node (1 CPU). Most tests use a small probe runner
(``_runner``) that reads ``value.txt`` / ``mode.txt`` from the code it was shipped and
writes a real trace, so that Ray's plumbing (archives, placement, retries, cancellation,
fetching) is tested in seconds; the end-to-end test runs the real launcher through
``bisect runs``'s driver with both executors.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import wait
from pathlib import Path

import pytest

from reprobisect.errors import ProbeError, UsageError
from reprobisect.executors import Executor, ProbeSpec, make_executor, submit_all
from reprobisect.cli.options import build_options
from reprobisect.core.options import ProbeOptions
from reprobisect.core.search import Bisection
from reprobisect.trace import read_trace

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from reprobisect.executors.ray import RayExecutor, RayProbeResult, archive_commit  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CULPRIT = 7  # index in the generated history of the commit that changes value.txt
N_COMMITS = 12


def _make_runner():
    """A probe runner for the workers (defined in a closure so Ray pickles it by value)."""

    def runner(spec, workdir, trace_dir):
        import json as _json
        import os as _os
        import time as _time

        import numpy as np

        from reprobisect.executors.base import ProbeResult
        from reprobisect.core.outcome import Outcome
        from reprobisect.trace import TraceWriter, record_array

        t0 = _time.time()
        cwd = workdir / spec.subdir
        mode = (cwd / "mode.txt").read_text().split() if (cwd / "mode.txt").exists() else []
        pidfile = spec.env.get("PIDFILE")
        if pidfile:
            with open(pidfile, "a") as f:
                f.write(f"{_os.getpid()}\n")
        if mode[:1] == ["sleep"]:
            _time.sleep(float(mode[1]))
        if mode[:1] == ["die"]:
            _os._exit(1)
        if mode[:1] == ["die-once"]:
            marker = spec.env["MARKER"]
            if not _os.path.exists(marker):
                open(marker, "w").close()
                _os._exit(1)
        value = float((cwd / "value.txt").read_text())
        with TraceWriter(trace_dir, command=list(spec.argv)) as w:
            for step in range(2):
                w.begin_step(step)
                a = np.full((4096,), value + step, dtype=np.float32)
                w.record(record_array("w", "param", a), a if step in spec.full_steps else None)
                w.end_step({"loss": value})
        info = {"pid": _os.getpid(), "cuda": _os.environ.get("CUDA_VISIBLE_DEVICES"), "side": _os.environ.get("RB_SIDE"), "t0": t0, "t1": _time.time(),
                "probe_env": {k: v for k, v in spec.env.items() if k.startswith("REPROBISECT_PROBE_")},
                "command_env": {k: spec.env.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MASTER_PORT", "PET_MASTER_PORT")}}
        return ProbeResult(spec=spec, outcome=Outcome("ok"), trace_dir=str(trace_dir), stdout_tail=_json.dumps(info))

    return runner


RUNNER = _make_runner()


def _info(res) -> dict:
    return json.loads(res.stdout_tail)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "_system_config": {
                "health_check_initial_delay_ms": 0,
                "health_check_period_ms": 1000,
                "health_check_failure_threshold": 2,
            },
        },
    )
    gpu = c.add_node(num_cpus=1, num_gpus=1, resources={"gpu_node": 1})
    cpu = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    c.gpu_node, c.cpu_node = gpu, cpu
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, list[str]]:
    """A git repository of N_COMMITS commits; commit CULPRIT changes value.txt from 1.0 to 1.5."""
    repo = tmp_path_factory.mktemp("history")
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    commits = []
    for i in range(N_COMMITS):
        (repo / "value.txt").write_text("1.5\n" if i >= CULPRIT else "1.0\n")
        (repo / "mode.txt").write_text("sleep 0.3\n")
        (repo / "notes.txt").write_text(f"edit {i}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"commit {i}")
        commits.append(git("rev-parse", "HEAD").stdout.strip())
    return repo, commits


def _spec(key: str, repo: Path | None = None, rev: str | None = None, workdir: Path | None = None, **kw) -> ProbeSpec:
    return ProbeSpec(key=key, argv=("python", "train.py"), repo=str(repo) if repo else None, revision=rev,
                     workdir=str(workdir) if workdir else None, **kw)


def _folder(tmp_path: Path, name: str, value: str = "1.0", mode: str = "") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "value.txt").write_text(value)
    if mode:
        (d / "mode.txt").write_text(mode)
    return d


def _w(result, step: int = 0, ex: RayExecutor | None = None):
    trace = ex.open_trace(result) if ex else read_trace(result.trace_dir)
    return next(r for r in trace.step(step).records if r.name == "w")


# --------------------------------------------------------------------------- basics


def test_protocol_and_usage_errors(cluster):
    with RayExecutor(runner=RUNNER) as ex:
        assert isinstance(ex, Executor)
        assert ex.name == "ray"
        assert ex.max_parallel == 3  # three 1-CPU nodes
        # its temporary folder is marked as this process's (a SIGKILL'd session's is cleaned later)
        from reprobisect.support.interrupt import OWNER_FILE

        assert ex.out_dir.name.startswith("reprobisect-ray-traces-") and (ex.out_dir / OWNER_FILE).is_file()
    with pytest.raises(UsageError, match="unknown placement 'diagonal'"):
        RayExecutor(placement="diagonal")
    with pytest.raises(ProbeError, match=r"no node of the Ray cluster can run a probe that needs .*4 GPU.*largest node has .*1 GPU"):
        RayExecutor(gpus_per_probe=4)
    assert ray.is_initialized()  # an executor that joined a running Ray leaves it running


def test_commit_shipped_as_archive_and_checked(cluster, history, tmp_path):
    repo, commits = history
    with RayExecutor(runner=RUNNER, out_dir=tmp_path / "out") as ex:
        res = ex.submit(_spec("c3", repo, commits[3])).result(timeout=120)
        assert isinstance(res, RayProbeResult) and res.outcome.status == "ok", res.outcome
        assert res.commit_ran == commits[3]
        assert Path(res.trace_dir) == tmp_path / "out" / "c3-a0"
        assert read_trace(res.trace_dir).step(0).scalars["loss"] == 1.0
        placed = json.loads((Path(res.trace_dir) / "ray.json").read_text())
        assert placed["node_id"] == res.node_id and placed["device_type"] == "cpu"
        # the commit that ran is the commit the archive carried, not what the spec claims:
        ex._archives[(str(repo), commits[9])] = ray.put(archive_commit(repo, commits[2]))
        stale = ex.submit(_spec("c9", repo, commits[9])).result(timeout=120)
        assert stale.outcome.status == "infra"
        assert f"stale code: the worker ran {commits[2]}, not {commits[9]}" in stale.outcome.detail


def test_linked_paths_are_linked_on_workers_that_see_them_and_refused_elsewhere(cluster, tmp_path):
    """--link: never shipped; a worker symlinks the controller's path (a local cluster sees
    it), a path it cannot see is a skip that says so, and the user's file survives."""
    repo = tmp_path / "linked"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    (repo / ".gitignore").write_text("value.txt\n")
    (repo / "mode.txt").write_text("\n")
    git("add", "-A")
    git("commit", "-q", "-m", "code only; value.txt is ignored data")
    head = git("rev-parse", "HEAD").stdout.strip()
    (repo / "value.txt").write_text("2.5\n")
    with RayExecutor(runner=RUNNER, out_dir=tmp_path / "out") as ex:
        res = ex.submit(_spec("linked", repo, head, links=("value.txt",))).result(timeout=120)
        assert res.outcome.status == "ok", res.outcome
        assert read_trace(res.trace_dir).step(0).scalars["loss"] == 2.5
        gone = ex.submit(_spec("gone", repo, head, links=("gone.txt",))).result(timeout=120)
        assert gone.outcome.status == "skip"
        assert "--link gone.txt" in gone.outcome.detail and "not shipped" in gone.outcome.detail
    assert (repo / "value.txt").read_text() == "2.5\n"


def test_code_that_cannot_be_shipped_is_reported_on_its_probe(cluster, history, tmp_path):
    repo, _ = history
    big = _folder(tmp_path, "big", value="1.0" + " " * 4000)
    with RayExecutor(runner=RUNNER, max_ship_bytes=1024) as ex:
        with pytest.raises(UsageError, match=r"holds more than 0.0009765\d* MiB to ship to the Ray workers.*shared_fs=True"):
            ex.submit(_spec("big", workdir=big)).result(timeout=60)
        with pytest.raises(UsageError, match="f" * 12):
            ex.submit(_spec("nope", repo, "f" * 40)).result(timeout=60)
        # the executor is still usable afterwards
        assert ex.submit(_spec("fine", workdir=_folder(tmp_path, "ok"))).result(timeout=120).outcome.status == "ok"


def test_gpu_probes_land_on_the_gpu_node_one_process_each(cluster, tmp_path):
    work = _folder(tmp_path, "w")
    with RayExecutor(runner=RUNNER, gpus_per_probe=1) as ex:
        assert ex.max_parallel == 1
        futs = [ex.submit(_spec(f"g{i}", workdir=work)) for i in range(2)]
        results = [f.result(timeout=120) for f in futs]
    for r in results:
        assert r.outcome.status == "ok", r.outcome
        assert r.node_id == cluster.gpu_node.node_id
        assert r.gpu_ids == ("0",) and r.device_type == "GPU"
        assert _info(r)["cuda"] == "0"
    assert _info(results[0])["pid"] != _info(results[1])["pid"]  # max_calls=1: a fresh worker per probe


def test_traces_stay_remote_until_fetched(cluster, tmp_path):
    work = _folder(tmp_path, "w", value="2.0")
    with RayExecutor(runner=RUNNER, eager_bytes=0, out_dir=tmp_path / "out") as ex:
        res = ex.submit(_spec("lazy", workdir=work, full_steps=(1,))).result(timeout=120)
        assert res.outcome.status == "ok", res.outcome
        shard = "tensors/step-000001.safetensors"
        assert set(res.remote_files) == {shard}
        local = Path(res.trace_dir)
        assert sorted(p.name for p in local.iterdir()) == ["manifest.json", "ray.json", "steps.jsonl"]
        trace = ex.open_trace(res)  # readable now: steps local, shard still remote
        assert trace.step(0).scalars["loss"] == 2.0
        assert not (local / shard).exists()
        rec = next(r for r in trace.step(1).records if r.name == "w")
        arr = trace.tensor(1, rec)  # pulls the shard from the node that ran the probe
        assert (local / shard).is_file() and arr.shape == (4096,) and float(arr[0]) == 3.0
        assert ex.fetch(res, "manifest.json") == (local / "manifest.json").read_bytes()
        with pytest.raises(UsageError, match="not a path inside a trace"):
            ex.fetch(res, "../etc/passwd")
        read_trace(ex.pull(res))  # every file local: the full validating reader accepts it


def _make_ranks_runner():
    """Writes a trace with one shard per rank (``ranks/rank-R/``, as a torchrun probe leaves it)."""

    def runner(spec, workdir, trace_dir):
        import json as _json

        import numpy as np

        from reprobisect.executors.base import ProbeResult
        from reprobisect.core.outcome import Outcome
        from reprobisect.trace import TraceWriter, record_array

        for rank in range(2):
            with TraceWriter(trace_dir / "ranks" / f"rank-{rank}", command=list(spec.argv)) as w:
                for step in range(2):
                    w.begin_step(step)
                    a = np.full((4096,), float(rank + step), dtype=np.float32)
                    w.record(record_array("w", "param", a), a)
                    w.end_step({"loss": float(rank)})
        (trace_dir / "manifest.json").write_text(_json.dumps({"world_size": 2, "ranks": [0, 1]}))
        return ProbeResult(spec=spec, outcome=Outcome("ok"), trace_dir=str(trace_dir))

    return runner


def test_a_trace_with_one_shard_per_rank_comes_back_with_every_ranks_steps(cluster, tmp_path):
    """No shared file system: each rank's manifest and steps come back with the result (even
    with no byte budget), the tensor shards stay on the worker until pulled."""
    work = _folder(tmp_path, "w")
    with RayExecutor(runner=_make_ranks_runner(), eager_bytes=0, out_dir=tmp_path / "out") as ex:
        res = ex.submit(_spec("ranked", workdir=work)).result(timeout=120)
        assert res.outcome.status == "ok", res.outcome
        local = Path(res.trace_dir)
        assert res.remote_files and all(r.startswith("ranks/rank-") and "/tensors/" in r for r in res.remote_files)
        for rank in range(2):
            assert (local / f"ranks/rank-{rank}/manifest.json").is_file() and (local / f"ranks/rank-{rank}/steps.jsonl").is_file()
        ex.pull(res)
        trace = read_trace(local / "ranks" / "rank-1")  # every file local now: a complete, valid shard
        rec = next(r for r in trace.step(1).records if r.name == "w")
        assert float(trace.tensor(1, rec)[0]) == 2.0


def test_a_trace_folder_the_user_named_is_complete_when_the_probe_returns(cluster, tmp_path):
    """capture -o on Ray: files past the eager budget are pulled at once into the named folder
    (it must stay readable after the executor and the worker's copy are gone)."""
    work = _folder(tmp_path, "w", value="3.0")
    named = tmp_path / "named.trace"
    with RayExecutor(runner=RUNNER, eager_bytes=0) as ex:
        res = ex.submit(_spec("named", workdir=work, full_steps=(1,), trace_dir=str(named))).result(timeout=120)
    assert res.outcome.status == "ok", res.outcome
    assert res.remote_files == {} and Path(res.trace_dir) == named
    trace = read_trace(named)  # after close: every file is here
    rec = next(r for r in trace.step(1).records if r.name == "w")
    assert float(trace.tensor(1, rec)[0]) == 4.0
    assert json.loads((named / "ray.json").read_text())["remote_files"] == {}


def _make_chatty_runner():
    """``RUNNER`` plus some output of the command (closure: Ray pickles it by value)."""
    inner = RUNNER

    def runner(spec, workdir, trace_dir):
        from dataclasses import replace as _replace

        return _replace(inner(spec, workdir, trace_dir), output_tail="epoch 0 loss 1.0 (printed on the worker)\n")

    return runner


def test_capture_through_the_ray_executor_writes_the_o_folder_and_shows_the_output(cluster, tmp_path, capfd):
    """bisect capture as a probe on Ray: the trace lands in -o (replacing an earlier trace
    there), and the command's output, which could not stream live, is shown when it ended."""
    from reprobisect.workflows.capture import CaptureConfig, capture

    work = _folder(tmp_path, "w", value="4.0")
    out = tmp_path / "run.trace"
    with RayExecutor(runner=_make_chatty_runner(), out_dir=tmp_path / "ray-out") as ex:
        first = capture(["python", "train.py"], out, CaptureConfig(steps=2), cwd=work, executor=ex)
        assert first and first.trace == str(out), first.outcome
        assert read_trace(out).step(0).scalars["loss"] == 4.0
        assert "epoch 0 loss 1.0 (printed on the worker)" in capfd.readouterr().out
        (work / "value.txt").write_text("5.0")
        again = capture(["python", "train.py"], out, CaptureConfig(steps=2, quiet=True), cwd=work, executor=ex)
        assert again and read_trace(out).step(0).scalars["loss"] == 5.0
        assert "printed on the worker" not in capfd.readouterr().out  # quiet: nothing shown
    assert not (tmp_path / "ray-out" / "capture-a0").exists()  # the executor's own folder was not used


# --------------------------------------------------------------------------- pairs


def test_pairs_pack_on_one_node_and_spread_on_two(cluster, tmp_path):
    work = _folder(tmp_path, "w")
    with RayExecutor(runner=RUNNER, placement_timeout=30) as ex:
        a, b = ex.submit_pair(_spec("pa", workdir=work), _spec("pb", workdir=work), placement="spread")
        ra, rb = a.result(timeout=120), b.result(timeout=120)
        assert ra.outcome.status == rb.outcome.status == "ok"
        assert ra.node_id != rb.node_id and ra.placement == rb.placement == "spread"
    with RayExecutor(runner=RUNNER, cpus_per_probe=0.5, placement_timeout=30) as ex:
        envs = ({"env_vars": {"RB_SIDE": "a"}}, {"env_vars": {"RB_SIDE": "b"}})
        a, b = ex.submit_pair(_spec("qa", workdir=work), _spec("qb", workdir=work), placement="pack", runtime_envs=envs)
        ra, rb = a.result(timeout=120), b.result(timeout=120)
        assert ra.outcome.status == rb.outcome.status == "ok"
        assert (_info(ra)["side"], _info(rb)["side"]) == ("a", "b")  # each side its own runtime_env
        assert ra.node_id == rb.node_id and ra.device_type == rb.device_type == "cpu"
        assert json.loads((Path(ra.trace_dir) / "ray.json").read_text())["placement"] == "pack"


def test_repro_and_envs_pairs_follow_the_placement_option(cluster, tmp_path):
    """--placement reaches the executor, and the sides repro/envs submit together are paired."""
    kw = build_options({"executor": "ray", "ray.placement": "spread"}).executor_config.executor_kwargs()
    assert kw["placement"] == "spread"
    with pytest.raises(UsageError, match="unknown placement 'diagonal'"):
        build_options({"executor": "ray", "ray.placement": "diagonal"})
    work = _folder(tmp_path, "w")
    with RayExecutor(runner=RUNNER, placement_timeout=30, **{k: v for k, v in kw.items() if k == "placement"}) as ex:
        ra, rb = (f.result(timeout=120) for f in submit_all(ex, [_spec("sa", workdir=work), _spec("sb", workdir=work)]))
        assert ra.outcome.status == rb.outcome.status == "ok"
        assert ra.placement == rb.placement == "spread" and ra.node_id != rb.node_id
        # what the launcher's environment record will see (group "probe" of the trace)
        for r in (ra, rb):
            probe_env = _info(r)["probe_env"]
            assert probe_env["REPROBISECT_PROBE_PLACEMENT"] == "spread"
            assert probe_env["REPROBISECT_PROBE_NODE"] == r.node_id
            assert probe_env["REPROBISECT_PROBE_DEVICE"] in ("cpu", "GPU")


def test_unsatisfiable_placement_fails_fast_with_a_clear_message(cluster, tmp_path):
    work = _folder(tmp_path, "w")
    with RayExecutor(runner=RUNNER, gpus_per_probe=1, placement_timeout=3) as ex:
        t0 = time.monotonic()
        a, b = ex.submit_pair(_spec("xa", workdir=work), _spec("xb", workdir=work), placement="pack")
        with pytest.raises(ProbeError, match=r"cannot place the pair 'xa' / 'xb' \(pack: STRICT_PACK, 2 x \[1 CPU, 1 GPU\] on one node\) within 3 s"):
            a.result(timeout=60)
        with pytest.raises(ProbeError):
            b.result(timeout=5)
        assert time.monotonic() - t0 < 30
        # the executor still works afterwards (the placement group was released)
        assert ex.submit(_spec("after", workdir=work)).result(timeout=120).outcome.status == "ok"


# --------------------------------------------------------------------------- faults


def test_timeout_cancels_the_task_and_kills_its_worker(cluster, tmp_path):
    work = _folder(tmp_path, "w", mode="sleep 60")
    pidfile = tmp_path / "pids"
    with RayExecutor(runner=RUNNER, start_grace_s=2) as ex:
        t0 = time.monotonic()
        res = ex.submit(_spec("slow", workdir=work, timeout=1.0, env={"PIDFILE": str(pidfile)})).result(timeout=60)
        assert res.outcome.status == "timeout", res.outcome
        assert "ray.cancel" in res.outcome.detail
        assert time.monotonic() - t0 < 40
    pid = int(pidfile.read_text().split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the worker process {pid} of a cancelled probe is still alive")


def test_close_ends_running_and_queued_probes(cluster, tmp_path):
    work = _folder(tmp_path, "w", mode="sleep 60")
    pidfile = tmp_path / "pids"
    ex = RayExecutor(runner=RUNNER, max_parallel=1)
    running = ex.submit(_spec("run", workdir=work, env={"PIDFILE": str(pidfile)}))
    queued = ex.submit(_spec("queued", workdir=work))
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    ex.close()
    res = running.result(timeout=5)
    assert res.outcome.status == "infra" and "closed" in res.outcome.detail
    assert queued.cancelled()
    with pytest.raises(ProbeError, match="closed"):
        ex.submit(_spec("late", workdir=work))


def test_dead_worker_is_retried_then_infra_never_bad(cluster, tmp_path):
    once = _folder(tmp_path, "once", value="4.0", mode="die-once")
    always = _folder(tmp_path, "always", mode="die")
    pids = tmp_path / "pids"
    with RayExecutor(runner=RUNNER, max_retries=1, out_dir=tmp_path / "out") as ex:
        r1 = ex.submit(_spec("once", workdir=once, env={"MARKER": str(tmp_path / "m"), "PIDFILE": str(pids)})).result(timeout=120)
        r2 = ex.submit(_spec("always", workdir=always)).result(timeout=120)
    assert len(pids.read_text().split()) == 2  # the first execution died, Ray ran it again
    assert r1.outcome.status == "ok", r1.outcome
    assert read_trace(r1.trace_dir).step(0).scalars["loss"] == 4.0  # one execution's trace, whole
    assert r2.outcome.status == "infra", r2.outcome
    assert "after 1 retries" in r2.outcome.detail


# --------------------------------------------------------------------------- searching


def _search(ex: RayExecutor, repo: Path, commits: list[str], k: int, on_round=None):
    """Bisection over the history with K probes in flight; verdict = w matches the good commit."""
    ref = ex.submit(_spec("ref", repo, commits[0])).result(timeout=120)
    ref_fp = _w(ref, ex=ex).fingerprint
    b = Bisection(commits)
    results = []
    rounds = 0
    while not b.done:
        points = b.next(k)
        rounds += 1
        futs = {ex.submit(_spec(f"p{commits.index(p)}", repo, p)): p for p in points}
        if on_round:
            on_round(rounds)
        wait(futs, timeout=180)
        for f, p in futs.items():
            r = f.result(timeout=1)
            results.append(r)
            verdict = "skip" if not r.outcome else ("good" if _w(r, ex=ex).fingerprint == ref_fp else "bad")
            b.mark(p, verdict)
    return b.result(), rounds, results


def test_k3_parallel_search_finds_the_culprit(cluster, history, tmp_path):
    repo, commits = history
    with RayExecutor(runner=RUNNER, max_parallel=3, out_dir=tmp_path / "out") as ex:
        result, rounds, results = _search(ex, repo, commits, 3)
    assert result.first_bad == commits[CULPRIT]
    assert rounds <= math.ceil(math.log(N_COMMITS - 1, 4)) + 1
    assert all(r.commit_ran == r.spec.revision for r in results)
    spans = sorted((_info(r)["t0"], _info(r)["t1"]) for r in results)
    assert any(b0 < a1 for (_, a1), (b0, _) in zip(spans, spans[1:])), "no two probes ran at the same time"
    assert len({r.node_id for r in results}) >= 2


def test_killing_a_node_mid_search_still_finds_the_culprit(cluster, history, tmp_path):
    repo, commits = history
    killed = []

    def kill_once(round_no):
        if round_no == 1 and not killed:
            time.sleep(0.5)  # the round's probes are starting (a fresh worker each) or running
            killed.append((cluster.cpu_node.node_id, time.time()))
            cluster.remove_node(cluster.cpu_node, allow_graceful=False)

    try:
        with RayExecutor(runner=RUNNER, max_parallel=3, max_retries=3, start_grace_s=60) as ex:
            result, _, results = _search(ex, repo, commits, 3, on_round=kill_once)
    finally:
        cluster.cpu_node = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    assert killed
    assert result.first_bad == commits[CULPRIT]
    # round 1 put one probe on each of the three 1-CPU nodes: one still running on the killed node
    # ran again elsewhere; a result from that node is one that ended before the kill (a loaded
    # machine can be slow to start the kill), never one cut short by it
    node, t_kill = killed[0]
    assert all(_info(r)["t1"] <= t_kill for r in results if r.node_id == node), [_info(r) for r in results]
    assert all(r.outcome.status == "ok" for r in results), [str(r.outcome) for r in results]


# --------------------------------------------------------------------------- end to end


_TRAIN = textwrap.dedent(
    """
    import torch
    torch.manual_seed(0)
    SCALE = {scale}
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.mul_(SCALE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(8, 4)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    """
)


def test_same_answer_as_the_local_executor_through_bisect_runs(cluster, tmp_path):
    pytest.importorskip("reprobisect.runners.launch")
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    commits = []
    for i in range(3):  # good, culprit, bad: the smallest history with one commit to search
        (repo / "train.py").write_text(_TRAIN.format(scale="1.5" if i >= 1 else "1.0") + f"# edit {i}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"c{i}")
        commits.append(git("rev-parse", "HEAD").stdout.strip())
    answers = {}
    for name, ex in (
        ("ray", RayExecutor(max_parallel=2)),
        ("local", make_executor("local", jobs=2, cache_dir=tmp_path / f"cache-{len(answers)}")),
    ):
        with ex:
            cfg = RunsConfig(good=commits[0], bad=commits[-1], command=(sys.executable, "train.py"), repo=str(repo),
                             cwd=str(repo), cache_dir=str(tmp_path / f"runs-{name}"), recheck=False,
                             options=ProbeOptions(steps=2, quiet=True))
            answers[name] = find_first_bad(cfg, executor=ex)
    assert answers["ray"].first_bad.hash == answers["local"].first_bad.hash == commits[1]


def test_resume_runs_share_the_folder_through_a_borrowed_ray_executor(cluster, tmp_path):
    """bisect resume's three runs through a Ray executor lent by its owner (an audit night): each
    runs in its own copy of the user's folder (the resumed run starts from what the interrupted
    run left), without the owner's executor being switched to shared_fs; the forgotten scheduler
    is named and the user's folder keeps no checkpoint of theirs."""
    pytest.importorskip("reprobisect.runners.launch")
    from reprobisect.workflows.resume import check_resume

    shutil.copy(Path(__file__).resolve().parents[1] / "examples" / "resume" / "train.py", tmp_path / "train.py")
    with RayExecutor(max_parallel=1) as ex:
        opts = ProbeOptions(steps=4, quiet=True, shared_executor=ex)
        r = check_resume([sys.executable, "train.py", "--total", "4", "--ckpt", "c.pt", "--bug", "scheduler"],
                         ["--resume", "c.pt"], at=1, options=opts, cwd=tmp_path)
        assert ex.shared_fs is False
    assert r.verdict == "diverged" and r.finding.component == "learning rate / scheduler", (r.reason, r.runs)
    assert not (tmp_path / "c.pt").exists()


def test_local_instance_started_and_shut_down(tmp_path):
    """Without an address the executor starts its own Ray (no dashboard) and stops it on close."""
    script = tmp_path / "local_ray.py"
    short_tmp = tempfile.mkdtemp(prefix="rb-ray-", dir="/tmp")  # Ray's socket paths must stay < 108 bytes
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            from pathlib import Path
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            import ray
            from test_executor_ray import RUNNER, _spec
            from reprobisect.executors.ray import RayExecutor
            from reprobisect.errors import ReproError
            errors = []
            for address in ("127.0.0.1:1", "nonsense"):
                try:
                    RayExecutor(address=address)
                except ReproError as e:
                    errors.append(f"{{type(e).__name__}}: {{e}}")
            work = Path({str(tmp_path)!r}) / "w"; work.mkdir(); (work / "value.txt").write_text("7")
            ex = RayExecutor(runner=RUNNER, num_cpus=1, temp_dir={short_tmp!r})
            started = ray.is_initialized()
            res = ex.submit(_spec("solo", workdir=work)).result(timeout=120)
            out = ex.out_dir
            ex.close()
            print(json.dumps({{"started": started, "status": res.outcome.status, "after": ray.is_initialized(),
                               "out_left": out.exists(), "errors": errors}}))
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    errors = got.pop("errors")
    assert got == {"started": True, "status": "ok", "after": False, "out_left": False}
    assert errors[0].startswith("ProbeError: cannot reach the Ray cluster at '127.0.0.1:1' (")
    assert errors[1] == "UsageError: 'nonsense' is not a Ray address; use auto, HOST:PORT or ray://HOST:10001"
    shutil.rmtree(short_tmp, ignore_errors=True)


_SCALED_FORWARD = textwrap.dedent(
    """
    import torch
    torch.manual_seed(0)

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x).mul({scale})

    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(8, 4)).pow(2).mean().backward()
        opt.step()
    """
)


def test_bisect_capture_and_compare_zoom_take_executor_ray_from_the_command_line(cluster, tmp_path, capsys):
    """The CLI hands --executor ray (and its --address) to capture and to compare --zoom: the
    runs happen on the cluster's workers, and the traces land where the user said."""
    from reprobisect.cli import main

    work = tmp_path / "w"
    work.mkdir()
    (work / "train.py").write_text(_SCALED_FORWARD.format(scale="1.0"))
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    old = os.getcwd()
    os.chdir(work)
    try:
        assert main(["capture", "-q", "--executor", "ray", "--address", cluster.address, "--steps", "2",
                     "-o", str(a), "--", sys.executable, "train.py"]) == 0
        (work / "b.py").write_text(_SCALED_FORWARD.format(scale="1.5"))
        assert main(["capture", "-q", "--executor", "ray", "--address", cluster.address, "--steps", "2",
                     "-o", str(b), "--", sys.executable, "b.py"]) == 0
        capsys.readouterr()
        rc = main(["compare", str(a), str(b), "--zoom", "--executor", "ray", "--address", cluster.address, "--json"])
    finally:
        os.chdir(old)
    assert rc == 1
    out = json.loads(capsys.readouterr().out)
    assert read_trace(a).manifest.outcome["status"] == read_trace(b).manifest.outcome["status"] == "ok"
    assert out["first"]["module"] == "Scaled", out["first"]
    assert out["zoom"]["verdict"] == "origin" and "mul" in json.dumps(out["zoom"]), out["zoom"]  # the op that differs


def test_a_torchrun_probe_on_ray_records_every_rank_and_agrees_with_a_local_capture(cluster, tmp_path, capsys):
    """A real ``torchrun --nproc_per_node 2`` DDP run (gloo) as a probe on the cluster, through
    the bootstrap: the multi-rank trace comes back whole and compares equal, rank by rank,
    with the same command captured locally."""
    from reprobisect.cli import main
    from reprobisect.core.compare import compare_paths
    from reprobisect.trace.ranks import open_ranks

    work = tmp_path / "w"
    work.mkdir()
    shutil.copy(Path(__file__).parent / "distributed" / "ddp_train.py", work / "train.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py", "plain"]
    on_ray, local = tmp_path / "ray.trace", tmp_path / "local.trace"
    old, omp = os.getcwd(), os.environ.get("OMP_NUM_THREADS")
    os.chdir(work)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        assert main(["capture", "-q", "--executor", "ray", "--address", cluster.address, "--steps", "2",
                     "--timeout", "240", "-o", str(on_ray), "--", *cmd]) == 0, capsys.readouterr()
        assert main(["capture", "-q", "--steps", "2", "--timeout", "240", "-o", str(local), "--", *cmd]) == 0
    finally:
        os.chdir(old)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp
    traces = open_ranks(on_ray)  # every shard's files are here
    assert sorted(traces) == [0, 1] and all(len(t.steps) == 2 for t in traces.values())
    assert [r.name for r in traces[1].steps[0].records if r.kind == "collective"] == ["ddp.bucket0/in", "ddp.bucket0/out"]
    c = compare_paths(on_ray, local)
    assert c and c.first is None and c.ranks == (0, 1), str(c)


# --------------------------------------------------------------------------- multi-GPU probes
# Kept last in the module: ``gpu_nodes`` adds two 2-GPU nodes to the module's cluster, which
# would change the shape the tests above count on.

_SHOW_ENV = textwrap.dedent(
    """
    import json, os, sys
    keys = ("CUDA_VISIBLE_DEVICES", "MASTER_PORT", "PET_MASTER_PORT", "REPROBISECT_PROBE_NODE")
    with open(os.path.join(os.environ["RB_SEEN"], os.environ["RB_NAME"] + ".json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
    """
)


@pytest.fixture(scope="module")
def gpu_nodes(cluster):
    """Two more nodes with two logical GPUs (and two CPUs) each, for the rest of the module."""
    nodes = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
    cluster.wait_for_nodes()
    yield nodes
    for n in nodes:
        cluster.remove_node(n)


def test_multi_gpu_probes_see_exactly_their_gpus_on_one_node_and_spread_pairs_land_apart(cluster, gpu_nodes, tmp_path):
    """--gpus-per-probe 2 with --placement spread: each side's real command sees exactly the
    two GPUs Ray gave it, both of one node, and a rendezvous port of its own; the sides run
    on two different nodes."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "show_env.py").write_text(_SHOW_ENV)
    seen = tmp_path / "seen"
    seen.mkdir()
    specs = [ProbeSpec(key=f"side-{n}", argv=(sys.executable, "show_env.py"), workdir=str(work), timeout=120,
                       env={"RB_SEEN": str(seen), "RB_NAME": n}) for n in "ab"]
    with RayExecutor(gpus_per_probe=2, placement_timeout=60) as ex:
        results = [f.result(timeout=180) for f in ex.submit_pair(*specs, placement="spread")]
        for r in results:  # what ray.json next to the local trace says (before close removes the folder)
            assert json.loads((Path(r.trace_dir) / "ray.json").read_text())["rendezvous"] == r.rendezvous, r.outcome
    two = {n.node_id for n in gpu_nodes}
    for name, r in zip("ab", results):
        env = json.loads((seen / f"{name}.json").read_text())  # what the command itself saw
        assert r.node_id in two and env["REPROBISECT_PROBE_NODE"] == r.node_id, r.outcome
        assert sorted(r.gpu_ids) == ["0", "1"]  # both GPUs of that one node
        assert env["CUDA_VISIBLE_DEVICES"].split(",") == list(r.gpu_ids)
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == r.rendezvous["MASTER_PORT"]
        assert r.placement == "spread"
    assert results[0].node_id != results[1].node_id


def test_two_probes_on_one_node_get_their_own_gpus_and_ports_and_a_user_port_is_kept(cluster, gpu_nodes, tmp_path):
    """--placement pack, one GPU each: both sides on one node at once, disjoint devices,
    different rendezvous ports; a MASTER_PORT the user set reaches the command unchanged."""
    # 4 s: long enough to overlap though a fresh Ray worker can take seconds to start on a loaded node
    work = _folder(tmp_path, "w", mode="sleep 4")
    with RayExecutor(runner=RUNNER, gpus_per_probe=1, placement_timeout=60) as ex:
        ra, rb = (f.result(timeout=120) for f in ex.submit_pair(_spec("pa", workdir=work), _spec("pb", workdir=work), placement="pack"))
        mine = ex.submit(_spec("mine", workdir=work, env={"MASTER_PORT": "23456"})).result(timeout=120)
    assert ra.outcome.status == rb.outcome.status == "ok"
    assert ra.node_id == rb.node_id and ra.node_id in {n.node_id for n in gpu_nodes}
    a, b = _info(ra), _info(rb)
    assert a["t0"] < b["t1"] and b["t0"] < a["t1"]  # they ran at the same time
    assert {a["command_env"]["CUDA_VISIBLE_DEVICES"], b["command_env"]["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    assert a["command_env"]["MASTER_PORT"] != b["command_env"]["MASTER_PORT"]
    assert _info(mine)["command_env"]["MASTER_PORT"] == "23456" and mine.rendezvous == {"PET_MASTER_PORT": _info(mine)["command_env"]["PET_MASTER_PORT"]}


def test_gpus_per_probe_that_no_node_holds_or_bad_values_are_one_line_errors(cluster, gpu_nodes, tmp_path, capsys):
    """From the command line: more GPUs than any node has, a negative or a fractional count
    above one, are one line on stderr and a nonzero exit, before anything is queued."""
    from reprobisect.cli import main

    work = tmp_path / "w"
    work.mkdir()
    (work / "train.py").write_text("print('never run')\n")
    old = os.getcwd()
    os.chdir(work)
    try:
        # (click shows its usage lines above a bad flag value's one error line)
        for n, expect in (("3", r"no node of the Ray cluster can run a probe that needs 1 CPU, 3 GPU \(the largest node has 2 CPU, 2 GPU\)"),
                          ("-1", r"--gpus-per-probe.*must be >= 0 \(got -1\)"),
                          ("1.5", r"--gpus-per-probe must be a whole number above 1 \(got 1.5\)")):
            t0 = time.monotonic()
            rc = main(["repro", "--executor", "ray", "--address", cluster.address, "--gpus-per-probe", n, "--",
                       sys.executable, "train.py"])
            err = capsys.readouterr().err.strip()
            assert rc == 2 and time.monotonic() - t0 < 30
            assert re.search(expect, err.splitlines()[-1]), err
            assert "Traceback" not in err and (n == "-1" or len(err.splitlines()) == 1), err
    finally:
        os.chdir(old)


_ALLREDUCE = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    with open(f"rank{dist.get_rank()}.json", "w") as f:
        json.dump({"port": os.environ["MASTER_PORT"], "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "sum": t.item(), "local_rank": os.environ["LOCAL_RANK"]}, f)
    dist.destroy_process_group()
    """
)


def _make_torchrun_runner():
    """Runs ``torchrun --nproc_per_node 2`` of the shipped gloo script with exactly the env a
    probe's command gets on its node (``{**os.environ, **spec.env}``, as ``run_in_dir`` does)."""

    def runner(spec, workdir, trace_dir):
        import json as _json
        import os as _os
        import subprocess as _sp
        import sys as _sys
        from pathlib import Path as _Path

        from reprobisect.core.outcome import Outcome
        from reprobisect.executors.base import ProbeResult

        cwd = workdir / spec.subdir
        torchrun = _Path(_sys.executable).with_name("torchrun")
        env = {**_os.environ, **spec.env, "OMP_NUM_THREADS": "1"}
        import time as _time

        t0 = _time.time()
        r = _sp.run([str(torchrun), "--nproc_per_node", "2", "allreduce.py"], cwd=cwd, env=env,
                    stdout=_sp.PIPE, stderr=_sp.STDOUT, text=True, timeout=150)
        t1 = _time.time()
        ranks = [_json.loads((cwd / f"rank{i}.json").read_text()) for i in range(2)] if r.returncode == 0 else []
        return ProbeResult(spec=spec, outcome=Outcome("ok" if r.returncode == 0 else "crashed", detail=r.stdout[-800:]),
                           stdout_tail=_json.dumps({"ranks": ranks, "pet": spec.env.get("PET_MASTER_PORT"), "t0": t0, "t1": t1}))

    return runner


def test_two_torchrun_probes_on_one_node_at_once_each_rendezvous_on_their_own_port(cluster, gpu_nodes, tmp_path):
    """The collision this guards against: two torchrun probes packed on one Ray node at the
    same time (gloo, logical GPUs). Both succeed; each job's ranks met on the port its probe
    was given on that node and saw only that probe's GPU."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "allreduce.py").write_text(_ALLREDUCE)
    with RayExecutor(runner=_make_torchrun_runner(), gpus_per_probe=1, placement_timeout=60) as ex:
        ra, rb = (f.result(timeout=240) for f in ex.submit_pair(_spec("ta", workdir=work), _spec("tb", workdir=work), placement="pack"))
    assert ra.outcome.status == "ok", ra.outcome.detail
    assert rb.outcome.status == "ok", rb.outcome.detail
    assert ra.node_id == rb.node_id
    ports = []
    for r in (ra, rb):
        info = _info(r)
        assert [x["sum"] for x in info["ranks"]] == [3.0, 3.0]
        assert {x["port"] for x in info["ranks"]} == {info["pet"]} == {r.rendezvous["PET_MASTER_PORT"]}
        assert {x["cuda"] for x in info["ranks"]} == {",".join(r.gpu_ids)}
        ports.append(info["pet"])
    assert ports[0] != ports[1] and {ra.gpu_ids, rb.gpu_ids} == {("0",), ("1",)}
    a, b = _info(ra), _info(rb)
    assert a["t0"] < b["t1"] and b["t0"] < a["t1"]  # the two jobs overlapped in time
