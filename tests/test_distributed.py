"""Multi-rank traces (issue 13): trace/ranks.py on synthetic shards, rank-aware compare,
distributed findings, and real torchrun runs (gloo, CPU, 2 ranks) of a tiny DDP/FSDP2
script (tests/distributed/ddp_train.py) recorded one shard per rank.
The torchrun runs go through ``bisect capture -- python -m torch.distributed.run ...``: the
bootstrap records every rank, the probe assembles the top manifest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from reprobisect.core.compare import compare_paths
from reprobisect.errors import TraceError
from reprobisect.trace import TraceWriter, record_array
from reprobisect.trace.ranks import assemble, is_multi_rank, open_ranks, rank_dir, world_size_of

HERE = Path(__file__).parent
ROOT = HERE.parent
ENV = {"device": "cpu", "packages": {"torch": {"version": "2.13.0"}}}


# --------------------------------------------------------------------------------------
# synthetic shards


def _rec(kind: str, name: str, a: np.ndarray, meta: dict | None = None):
    return record_array(name, kind, a, meta=meta)


def shard(path: Path, rank: int, world: int, *, steps: int = 2, change=None, batch=None, seal: bool = True,
          env: dict | None = None, ddp: bool = True, policy: dict | None = None, samplers: list | None = None) -> Path:
    """One rank's shard: input, activation, loss, a DDP bucket (in = this rank's gradient,
    out = the reduced one, same on every rank), grad, param (same on every rank)."""
    w = TraceWriter(path, command=["python", "train.py"], environment={**(env or ENV), "distributed": {"world_size": world}},
                    policy=policy,
                    extra={"distributed": {"rank": rank, "local_rank": rank, "world_size": world,
                                           "backend": "gloo", "device": "cpu"},
                           **({"samplers": samplers} if samplers is not None else {})})
    for k in range(steps):
        rng = np.random.default_rng(100 * k + rank)
        common = np.random.default_rng(k)
        arrays = [("input", "x", rng.standard_normal((2, 4)).astype(np.float32), None),
                  ("activation", "fc", rng.standard_normal((2, 3)).astype(np.float32), None),
                  ("loss", "loss", np.float32(rng.standard_normal()), None)]
        if ddp:
            arrays += [("collective", "ddp.bucket0/in", rng.standard_normal(15).astype(np.float32),
                        {"op": "ddp_allreduce", "bucket": 0, "io": "in"}),
                       ("collective", "ddp.bucket0/out", common.standard_normal(15).astype(np.float32),
                        {"op": "ddp_allreduce", "bucket": 0, "io": "out"})]
        arrays += [("grad", "fc.weight", common.standard_normal((3, 4)).astype(np.float32), None),
                   ("param", "fc.weight", common.standard_normal((3, 4)).astype(np.float32), None)]
        w.begin_step(k)
        for kind, name, a, meta in arrays:
            if change is not None:
                a = change(rank, k, kind, name, a)
            w.record(_rec(kind, name, a, meta))
        w.end_step({}, batch_ids=batch(rank, k) if batch else [k * world * 2 + rank * 2, k * world * 2 + rank * 2 + 1])
    if seal:
        w.close("complete", outcome={"status": "ok", "detail": "ok"})
    return path


def multi(path: Path, world: int = 2, samplers=None, **kw) -> Path:
    for r in range(world):
        shard(rank_dir(path, r), r, world, samplers=samplers(r) if samplers else None, **kw)
    assemble(path, command=["torchrun", "train.py"], outcome={"status": "ok", "detail": "done"})
    return path


def test_flat_trace_reads_as_rank_0(tmp_path):
    p = shard(tmp_path / "flat", 0, 1)
    assert not is_multi_rank(p)
    traces = open_ranks(p)
    assert list(traces) == [0] and len(traces[0].steps) == 2
    assert world_size_of(p) == 1


def test_assemble_writes_the_top_manifest(tmp_path):
    p = multi(tmp_path / "t")
    assert is_multi_rank(p)
    top = json.loads((p / "manifest.json").read_text())
    assert top["status"] == "complete" and top["world_size"] == 2
    assert [(r["rank"], r["path"], r["status"], r["steps"], r["device"]) for r in top["ranks"]] == [
        (0, "ranks/rank-0", "complete", 2, "cpu"), (1, "ranks/rank-1", "complete", 2, "cpu")]
    assert top["environment"]["distributed"] == {"world_size": 2}  # rank 0's
    assert set(top["files"]) == {"ranks/rank-0/manifest.json", "ranks/rank-1/manifest.json"}
    assert not (p / "steps.jsonl").exists()
    traces = open_ranks(p)
    assert sorted(traces) == [0, 1] and world_size_of(p) == 2


def test_a_missing_rank_is_one_line(tmp_path):
    p = tmp_path / "t"
    shard(rank_dir(p, 0), 0, 2)
    with pytest.raises(TraceError, match=r"missing rank 1 of world size 2 \(ranks/rank-1\)"):
        open_ranks(p)
    top = assemble(p, command=["torchrun"], outcome={"status": "ok"})
    assert top["status"] == "failed" and "rank 1" in top["error"]


def test_mismatched_world_sizes_are_one_line(tmp_path):
    p = tmp_path / "t"
    shard(rank_dir(p, 0), 0, 2)
    shard(rank_dir(p, 1), 1, 4)
    with pytest.raises(TraceError, match="different world sizes.*rank 0 says 2, rank 1 says 4"):
        open_ranks(p)
    with pytest.raises(TraceError, match="different world sizes"):
        assemble(p, command=["torchrun"])


def test_an_incomplete_shard_makes_the_top_status_name_the_rank(tmp_path):
    p = tmp_path / "t"
    shard(rank_dir(p, 0), 0, 2)
    shard(rank_dir(p, 1), 1, 2, seal=False)
    top = assemble(p, command=["torchrun"], outcome={"status": "ok"})
    assert top["status"] == "failed"
    assert "rank 1's shard is incomplete" in top["error"]
    with pytest.raises(TraceError, match="did not complete.*rank 1"):
        open_ranks(p)
    assert sorted(open_ranks(p, allow_incomplete=True)) == [0, 1]


def test_a_crashed_rank_names_itself_in_the_outcome(tmp_path):
    p = tmp_path / "t"
    shard(rank_dir(p, 0), 0, 2)
    w = TraceWriter(rank_dir(p, 1), extra={"distributed": {"rank": 1, "world_size": 2}})
    w.close("failed", outcome={"status": "crashed", "detail": "RuntimeError: boom", "step": 1}, error="crashed")
    top = assemble(p, command=["torchrun"])
    assert top["status"] == "failed" and top["outcome"]["rank"] == 1
    assert top["outcome"]["status"] == "crashed" and top["outcome"]["detail"] == "rank 1: RuntimeError: boom"


def test_a_shard_changed_after_assembly_is_refused(tmp_path):
    p = multi(tmp_path / "t")
    shard(rank_dir(p, 1), 1, 2, steps=1)  # replaced by another run's shard
    with pytest.raises(TraceError, match="modified after it was assembled"):
        open_ranks(p)


def test_multi_rank_compare_names_rank_and_agreeing_ranks(tmp_path):
    a = multi(tmp_path / "a", world=3)

    def bump(rank, k, kind, name, x):
        return x + np.float32(1e-3) if (rank, k, kind) == (2, 1, "activation") else x

    b = multi(tmp_path / "b", world=3, change=bump)
    assert compare_paths(a, multi(tmp_path / "a2", world=3))
    c = compare_paths(a, b)
    assert not c and c.first.rank == 2 and c.first.step == 1 and c.first.kind == "activation"
    assert c.first.agree == (0, 1) and c.first.differ == ()
    text = str(c)
    assert "step 1 · rank 2 · activation · fc" in text
    assert "ranks 0, 1 agree here" in text
    assert "verdict: DIVERGED at step 1 (rank 2, activation fc)" in text
    assert c.to_json()["first"]["rank"] == 2 and c.to_json()["ranks"] == [0, 1, 2]


def test_lowest_rank_wins_a_tie_and_arrival_is_placed(tmp_path):
    a = multi(tmp_path / "a")

    def input_and_reduced(rank, k, kind, name, x):
        if k == 0 and rank == 1 and kind in ("input", "activation", "loss") or (k == 0 and name.endswith("/in") and rank == 1):
            return x + np.float32(1.0)
        if k == 0 and (name.endswith("/out") or kind in ("grad", "param")):
            return x + np.float32(1.0)  # the reduced gradient differs on every rank
        return x

    b = multi(tmp_path / "b", change=input_and_reduced)
    c = compare_paths(a, b)
    assert c.first.rank == 1 and c.first.kind == "input"  # originates on rank 1
    # rank 0's first difference arrives through the collective: its own input agrees
    r0 = [d for d in c.rank_firsts if d.rank == 0]
    assert r0 and r0[0].kind == "collective" and r0[0].name == "ddp.bucket0/out" and r0[0].localization == "arrival"
    assert "arrived through a collective" in str(c)
    assert any("starts on rank 1 only" in h for h in c.hints)

    def both_inputs(rank, k, kind, name, x):
        return x + np.float32(1.0) if k == 0 and kind == "input" else x

    c2 = compare_paths(a, multi(tmp_path / "c", change=both_inputs))
    assert c2.first.rank == 0 and c2.first.differ == (1,)  # a tie at the same record: the lowest rank


def test_a_forward_collective_comes_before_the_activations_across_ranks(tmp_path):
    """Across ranks, chain order is the record's place in its step: rank 0's forward
    all-gather (written before the activation it feeds) is first, although rank 1's
    activation of the same step differs too and activations rank before collectives by kind."""
    def fsdp_like(path: Path, rank: int, bump_gather: bool, bump_act: bool) -> None:
        w = TraceWriter(path, command=["torchrun"], environment=ENV,
                        extra={"distributed": {"rank": rank, "world_size": 2, "backend": "gloo", "device": "cpu"}})
        w.begin_step(0)
        one = np.ones(4, np.float32)
        for kind, name, a in (("input", "input", one), ("collective", "all_gather_single.0/in", one),
                              ("collective", "all_gather_single.0/out", one + np.float32(bump_gather)),
                              ("activation", "fc", one + np.float32(bump_act)), ("loss", "loss", np.float32(1.0))):
            w.record(_rec(kind, name, a, {"op": "all_gather_single", "io": name[-3:].strip("/")} if kind == "collective" else None))
        w.end_step({})
        w.close("complete", outcome={"status": "ok"})

    for r in (0, 1):
        fsdp_like(rank_dir(tmp_path / "a", r), r, False, False)
    fsdp_like(rank_dir(tmp_path / "b", 0), 0, True, True)   # rank 0: the gathered parameters differ, then its activation
    fsdp_like(rank_dir(tmp_path / "b", 1), 1, False, True)  # rank 1: only its activation (listed first by kind)
    for side in "ab":
        assemble(tmp_path / side, command=["torchrun"], outcome={"status": "ok"})
    c = compare_paths(tmp_path / "a", tmp_path / "b")
    assert (c.first.rank, c.first.kind, c.first.name) == (0, "collective", "all_gather_single.0/out"), str(c)
    assert (c.next[0].rank, c.next[0].kind) == (0, "activation") and (c.next[1].rank, c.next[1].kind) == (1, "activation")


def test_world_size_difference_is_an_environment_difference(tmp_path):
    flat = shard(tmp_path / "flat", 0, 1)
    two = multi(tmp_path / "two")
    c = compare_paths(flat, two)
    assert not c
    assert c.env[0].path == "distributed.world_size" and (c.env[0].a, c.env[0].b) == (1, 2)
    assert "rank(s) 1 only in B" in c.structure
    text = str(c)
    assert text.index("distributed.world_size: 1 → 2") < text.index("tolerance:")
    four = multi(tmp_path / "four", world=4)
    c2 = compare_paths(two, four)
    assert c2.env[0].path == "distributed.world_size" and "A has 2 rank(s), B has 4" in c2.structure


def test_findings_desync_and_overlap(tmp_path):
    def buffers_apart(rank, k, kind, name, x):
        return x + np.float32(rank) if (kind, k) == ("param", 1) else x

    p = multi(tmp_path / "desync", change=buffers_apart)
    c = compare_paths(p, p)
    assert any("ranks 0 and 1 hold different models after step 1" in f for f in c.findings)

    q = multi(tmp_path / "overlap", batch=lambda rank, k: [k * 2, k * 2 + 1])  # every rank draws the same samples
    c = compare_paths(q, q)
    assert any("ranks 0 and 1 drew overlapping samples at step 0" in f for f in c.findings)
    assert "distributed: A: ranks 0 and 1 drew overlapping samples" in str(c)
    assert compare_paths(multi(tmp_path / "ok"), multi(tmp_path / "ok2")).findings == ()


def _sampler_note(rank: int, indices: list[int], *, n: int = 8, world: int = 2, seed: int = 0, sampler_rank=None) -> dict:
    bits = bytearray((n + 7) // 8)
    for i in indices:
        bits[i >> 3] |= 1 << (i & 7)
    return {"sampler": 0, "step": 0, "epoch": 0, "dataset_len": n, "num_replicas": world,
            "rank": rank if sampler_rank is None else sampler_rank, "seed": seed, "shuffle": True, "drop_last": False,
            "num_samples": n // world, "total_size": n, "drawn": len(indices), "indices": bytes(bits).hex()}


def test_findings_missing_samples_from_the_samplers_index_sets(tmp_path):
    from reprobisect.core.distributed import findings

    ok = multi(tmp_path / "ok", samplers=lambda r: [_sampler_note(r, [0, 2, 4, 6] if r == 0 else [1, 3, 5, 7])])
    assert findings(open_ranks(ok)) == []
    seeded = multi(tmp_path / "seeded", samplers=lambda r: [_sampler_note(r, [0, 2, 4, 6] if r == 0 else [0, 1, 2, 3], seed=r)])
    found = findings(open_ranks(seeded))
    assert found and found[0].startswith("the ranks do not draw the dataset once between them in epoch 0 (from step 0")
    assert "2 of 8 samples are drawn by no rank (missing) and 2 draw(s) repeat" in found[0]
    assert "seeded differently (rank 0: seed 0, rank 1: seed 1)" in found[0]
    wrong = multi(tmp_path / "wrong", samplers=lambda r: [_sampler_note(r, [0, 2, 4, 6], sampler_rank=0)])
    found = findings(open_ranks(wrong))
    assert "4 of 8 samples are drawn by no rank" in found[0] and "rank 1's DistributedSampler says num_replicas=2, rank=0" in found[0]
    # padding (8 samples over 3 ranks: 9 draws) is what DistributedSampler does, not an overlap
    pad = multi(tmp_path / "pad", world=3, samplers=lambda r: [{**_sampler_note(r, [[0, 3, 6], [1, 4, 7], [2, 5, 0]][r], world=3),
                                                                "num_samples": 3, "total_size": 9}])
    assert findings(open_ranks(pad)) == []


def test_zoom_of_a_multi_rank_trace_is_inconclusive_and_runs_nothing(tmp_path):
    from reprobisect.workflows.zoom import run_zoom

    def bump(rank, k, kind, name, x):
        return x + np.float32(1e-3) if (rank, k, kind) == (1, 0, "activation") else x

    a, b = multi(tmp_path / "a"), multi(tmp_path / "b", change=bump)
    c = compare_paths(a, b)
    z = run_zoom(a, b, c, trust=True, executor=object())  # an executor that cannot run anything
    assert not z and z.verdict == "unsupported" and z.module == "fc" and z.step == 0
    assert str(z).startswith("zoom into module 'fc' at step 0: inconclusive: zoom of a distributed run is not supported yet (")
    assert "the divergence is on rank 1" in str(z)


def test_sentinel_escalation_of_a_multi_rank_run_is_inconclusive(tmp_path):
    from reprobisect.core.outcome import Outcome, Status
    from reprobisect.core.probe import ProbeResult, ProbeSpec
    from reprobisect.workflows.escalate import escalate

    def bump(rank, k, kind, name, x):
        return x + np.float32(1e-3) if (rank, k, kind) == (1, 1, "loss") else x

    sentinel = {"detail": "sentinel"}
    a, b = multi(tmp_path / "a", policy=sentinel), multi(tmp_path / "b", policy=sentinel, change=bump)
    c = compare_paths(a, b)
    assert c.sentinel and c.first.step == 1 and c.first.rank == 1
    spec = ProbeSpec(key="p", argv=("torchrun", "train.py"), detail="sentinel")
    sides = [ProbeResult(spec, Outcome(Status.OK), trace_dir=str(p)) for p in (a, b)]
    esc = escalate(c, sides[0], sides[1], executor=None)  # nothing may be submitted
    assert esc is not None and not esc and esc.comparison is None
    assert esc.reason.startswith("full detail at step 1 is inconclusive: replay of a distributed run is not supported yet (")


def test_workflow_readers_take_multi_rank_traces(tmp_path):
    from reprobisect.core.verdict import nonfinite_in
    from reprobisect.trace.ranks import read_rank0

    def nan_on_rank_1(rank, k, kind, name, x):
        return np.full_like(x, np.nan) if (rank, k, kind) == (1, 1, "loss") else x

    p = multi(tmp_path / "t", change=nan_on_rank_1)
    assert nonfinite_in(str(p)) == "loss 'loss' at step 1 holds NaN/Inf (rank 1)"
    assert nonfinite_in(str(multi(tmp_path / "ok"))) is None
    assert read_rank0(p).manifest.extra["distributed"]["rank"] == 0
    flat = shard(tmp_path / "flat", 0, 1)
    assert read_rank0(flat).path == flat


def test_environment_records_the_distributed_settings(monkeypatch):
    import torch  # noqa: F401 - distributed_info reads torch.distributed when imported

    from reprobisect.core.envdiff import diff_environments
    from reprobisect.runners.environment import collect_environment, distributed_info

    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert distributed_info() is None and "distributed" not in collect_environment()  # a single process
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500", "GLOO_SOCKET_IFNAME": "lo", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "NCCL_ALGO": "Ring"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    a = collect_environment()
    d = a["distributed"]
    assert (d["world_size"], d["rank"], d["local_rank"], d["local_world_size"]) == (2, 1, 1, 2)
    assert d["env"] == {"GLOO_SOCKET_IFNAME": "lo", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    assert d["rendezvous"] == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert a["env_vars"]["NCCL_ALGO"] == "Ring"
    monkeypatch.setenv("MASTER_PORT", "29501")
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    changes = {c.path: c for c in diff_environments(a, collect_environment())}
    assert changes["distributed.rendezvous.MASTER_PORT"].info  # a free port differs every run
    assert not changes["env_vars.NCCL_ALGO"].info  # the reduction algorithm changes numerics


# --------------------------------------------------------------------------------------
# real torchrun (gloo, CPU, 2 ranks)

SCRIPT = HERE / "distributed" / "ddp_train.py"


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONHASHSEED="0", **kw)
    return env


def torchrun(trace: Path | None, mode: str, *, nproc: int = 2, steps: int = 3, dump: Path | None = None,
             **env_vars: str) -> Path | None:
    """Run ddp_train.py MODE under torchrun: through ``bisect capture`` (one shard per rank) into
    ``trace``, or plain when ``trace`` is None."""
    env = _env(**({"DUMP": str(dump)} if dump else {}), **env_vars)
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(SCRIPT), mode]
    if trace is not None:
        run = [sys.executable, "-m", "reprobisect", "capture", "-o", str(trace), "--steps", str(steps), "--", *run]
    r = subprocess.run(run, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return trace


# Every torchrun run of this module, each recorded once and shared by the tests that read it: name ->
# (mode, nproc, steps, dump, extra env). Two run side by side: a run spends part of its wall time
# waiting (process start, rendezvous), so pairs finish sooner than one after the other.
RUNS = {
    # 3 ranks: DDP scales gradients by 1/3 with a multiply, which a division would not match bit for bit;
    # 6 steps are the whole run: it ends by itself (and saves its parameters) before --steps 7
    "plain": ("plain", 3, 7, "rec", {}),
    "plain2": ("plain", 3, 7, None, {}),
    "sampler": ("sampler_seed", 2, 4, None, {}),
    "sampler_rank0": ("sampler_rank0", 2, 2, None, {}),
    "bn": ("bn", 2, 3, None, {}),
    "single": ("plain", 1, 7, None, {}),
    "allreduce": ("allreduce", 2, 2, None, {}),
    "user_hook": ("user_hook", 2, 2, None, {}),
    # rank-local noise: 4 ranks, rank 2 noisy (the 2-rank case is the same code path with one receiver)
    "noise": ("noise", 4, 1, None, {"NOISE_RANK": "2"}),
    "noise2": ("noise", 4, 1, None, {"NOISE_RANK": "2"}),
    "fsdp": ("fsdp", 2, 2, None, {}),
    "fsdp2": ("fsdp", 2, 2, None, {}),
    "fsdp_shard": ("fsdp_shard", 2, 2, None, {}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")

    def one(name: str) -> Path:
        mode, nproc, steps, dump, env_vars = RUNS[name]
        return torchrun(base / name, mode, nproc=nproc, steps=steps, dump=base / dump if dump else None, **env_vars)

    with ThreadPoolExecutor(max_workers=2) as pool:
        unrecorded = pool.submit(torchrun, None, "plain", nproc=3, dump=base / "plain-unrecorded")
        out = dict(zip(RUNS, pool.map(one, RUNS)))
        unrecorded.result()
    out["base"] = base
    return out


@pytest.mark.slow
def test_identical_ddp_runs_agree_and_recording_keeps_numerics(runs):
    c = compare_paths(runs["plain"], runs["plain2"])
    assert c, str(c)
    assert c.ranks == (0, 1, 2) and c.findings == ()
    import torch

    for r in (0, 1, 2):  # a recorded run (its DDP comm hook included) ends with the plain run's parameters, bit for bit
        rec = torch.load(runs["base"] / f"rec-{r}.pt")
        plain = torch.load(runs["base"] / f"plain-unrecorded-{r}.pt")
        assert rec.keys() == plain.keys()
        for k in rec:
            assert torch.equal(rec[k], plain[k]), k


@pytest.mark.slow
def test_shards_carry_rank_and_collectives(runs):
    traces = open_ranks(runs["plain"])
    for r, t in traces.items():
        d = t.manifest.extra["distributed"]
        assert (d["rank"], d["world_size"], d["backend"], d["device"]) == (r, 3, "gloo", "cpu")
        env = t.manifest.environment["distributed"]
        assert env["world_size"] == 3 and "MASTER_PORT" in env["rendezvous"]
        kinds = [rec.kind for rec in t.steps[0].records]
        names = [rec.name for rec in t.steps[0].records if rec.kind == "collective"]
        assert names == ["ddp.bucket0/in", "ddp.bucket0/out"]
        assert kinds.index("collective") > kinds.index("loss") and kinds.index("grad") > kinds.index("collective")
    s0, s1 = traces[0].steps[0].by_key(), traces[1].steps[0].by_key()
    assert s0[("collective", "ddp.bucket0/in")].fingerprint != s1[("collective", "ddp.bucket0/in")].fingerprint
    assert s0[("collective", "ddp.bucket0/out")].fingerprint == s1[("collective", "ddp.bucket0/out")].fingerprint


@pytest.mark.slow
def test_a_users_own_comm_hook_is_kept_and_observed(runs):
    traces = open_ranks(runs["user_hook"])
    for t in traces.values():
        assert [r.name for r in t.steps[0].records if r.kind == "collective"] == ["ddp.bucket0/in", "ddp.bucket0/out"]
        assert "notes" not in t.manifest.extra  # no "buckets not recorded"
    g = [{r.name: r.fingerprint for r in t.steps[0].records if r.kind == "grad"} for t in traces.values()]
    assert g[0] == g[1]  # the user's hook still averaged the gradients


@pytest.mark.slow
def test_hand_written_all_reduce_is_recorded(runs):
    traces = open_ranks(runs["allreduce"])
    by_rank = [{r.name: r for r in t.steps[0].records if r.kind == "collective"} for t in traces.values()]
    assert sorted(by_rank[0]) == sorted(f"all_reduce.{k}/{io}" for k in range(4) for io in ("in", "out"))
    for k in range(4):
        assert by_rank[0][f"all_reduce.{k}/in"].fingerprint != by_rank[1][f"all_reduce.{k}/in"].fingerprint
        assert by_rank[0][f"all_reduce.{k}/out"].fingerprint == by_rank[1][f"all_reduce.{k}/out"].fingerprint
        assert by_rank[0][f"all_reduce.{k}/out"].meta == {"op": "all_reduce", "io": "out"}


@pytest.mark.slow
def test_rank_local_unseeded_noise_is_named_with_its_rank(runs):
    c = compare_paths(runs["noise"], runs["noise2"])
    assert not c and c.first.step == 0 and c.first.rank == 2 and c.first.kind in ("batch", "input")
    assert c.first.agree == (0, 1, 3)
    r0 = [d for d in c.rank_firsts if d.rank == 0]
    assert r0 and r0[0].localization == "arrival" and r0[0].name == "ddp.bucket0/out", c.rank_firsts
    assert "step 0 · rank 0 · collective · ddp.bucket0/out" in str(c) and "(arrived through a collective)" in str(c)
    assert any("starts on rank 2 only" in h and "rank-local random source" in h for h in c.hints)
    assert "step 0 · rank 2 · " in str(c)


@pytest.mark.slow
def test_per_rank_sampler_seed_is_found(runs):
    c = compare_paths(runs["sampler"], runs["sampler"])
    assert any("drew overlapping samples" in f for f in c.findings), c.findings
    assert any("same shuffled sample order every epoch" in f and "set_epoch" in f for f in c.findings), c.findings
    # the samplers' whole epoch (noted by the recorder), not only the recorded steps: what no rank draws
    missing = [f for f in c.findings if "drawn by no rank" in f]
    assert missing and "epoch 0 (from step 0" in missing[0] and "of 16 samples are drawn by no rank" in missing[0]
    assert "seeded differently (rank 0: seed 0, rank 1: seed 1)" in missing[0]
    assert not [f for f in compare_paths(runs["noise"], runs["noise2"]).findings if "drawn by no rank" in f]


@pytest.mark.slow
def test_a_sampler_told_the_wrong_rank_is_found(runs):
    c = compare_paths(runs["sampler_rank0"], runs["sampler_rank0"])
    missing = [f for f in c.findings if "drawn by no rank" in f]
    assert missing and "8 of 16 samples are drawn by no rank (missing) and 8 draw(s) repeat" in missing[0], c.findings
    assert "rank 1's DistributedSampler says num_replicas=2, rank=0" in missing[0]


@pytest.mark.slow
def test_unsynchronized_batchnorm_buffers_are_found_at_the_first_step(runs):
    c = compare_paths(runs["bn"], runs["bn"])
    found = [f for f in c.findings if "hold different models" in f]
    assert found and "after step 0" in found[0] and "running_mean' (buffer)" in found[0] and "SyncBatchNorm" in found[0]


@pytest.mark.slow
def test_world_size_difference_is_reported_not_a_crash(runs):
    assert not is_multi_rank(runs["single"])
    c = compare_paths(runs["single"], runs["plain"])
    assert not c and c.env[0].path == "distributed.world_size" and (c.env[0].a, c.env[0].b) == (1, 3)
    assert "rank(s) 1-2 only in B" in c.structure
    assert "A: " in str(c) and ", 3 ranks)" in str(c)


@pytest.mark.slow
def test_fsdp2_fully_shard_records_its_collectives(runs):
    a, b = runs["fsdp"], runs["fsdp2"]
    c = compare_paths(a, b)
    assert c, str(c)
    t = open_ranks(a)
    for r in (0, 1):
        ops = {(rec.meta or {}).get("op") for rec in t[r].steps[0].records if rec.kind == "collective"}
        assert {"all_gather_single", "reduce_scatter_single"} <= ops
        # each collective where it happened: the forward's all-gather before the activations it
        # feeds, the backward's reduce-scatter between the loss and the gradients
        names = [f"{rec.kind}:{rec.name}" for rec in t[r].steps[0].records]
        assert names.index("collective:all_gather_single.0/out") < next(
            i for i, n in enumerate(names) if n.startswith("activation:")), names
        rs = names.index("collective:reduce_scatter_single.0/in")
        assert names.index("loss:loss") < rs < next(i for i, n in enumerate(names) if n.startswith("grad:")), names
    # rank 1 changes its own shard: it originates there; rank 0 first sees it arrive through the
    # forward's all-gather (not as an activation of its own)
    c = compare_paths(a, runs["fsdp_shard"])
    assert not c and c.first.rank == 1 and c.first.step == 0 and c.first.kind == "init", str(c)
    r0 = [d for d in c.rank_firsts if d.rank == 0]
    assert r0 and (r0[0].kind, r0[0].name, r0[0].localization) == ("collective", "all_gather_single.0/out", "arrival"), r0


@pytest.mark.slow
def test_four_ranks_name_the_noisy_rank_and_the_others_receive_it(runs):
    c = compare_paths(runs["noise"], runs["noise2"])
    assert not c and c.ranks == (0, 1, 2, 3) and c.world_size_a == 4
    assert c.first.step == 0 and c.first.rank == 2 and c.first.kind in ("batch", "input"), str(c)
    assert c.first.agree == (0, 1, 3) and c.first.differ == ()
    others = {d.rank: d for d in c.rank_firsts if d.rank != 2}
    assert sorted(others) == [0, 1, 3]
    for d in others.values():  # each other rank first sees it arrive through the gradient all-reduce
        assert (d.step, d.kind, d.name, d.localization) == (0, "collective", "ddp.bucket0/out", "arrival"), d
    assert any("starts on rank 2 only" in h and "rank(s) 0, 1, 3 receive it through a collective" in h for h in c.hints)
    assert "verdict: DIVERGED at step 0 (rank 2, " in str(c)
