"""Benchmark of the Ray executor: search rounds with K parallel probes, and Ray's cost per probe.

1. Rounds (pure, simulated verdicts through ``reprobisect.core.search.Bisection``): on a
   generated history of N commits, every position of the first bad commit, K = 1, 2, 4
   probes per round; prints mean and max rounds against ceil(log_{K+1}(N-1)).
2. Overhead (real probes): the same probes of a generated git history through the local
   executor and through the Ray executor (a local Ray instance, no dashboard), one at a
   time, so the difference is Ray's cost per probe (ship the archive, start a fresh worker
   process, return the trace) rather than parallelism. The probe is the real
   ``reprobisect.executors.process.run_in_dir`` with a trivial command when the launcher is installed;
   without it, a stand-in that runs ``python -c pass`` in the unpacked tree.

    python scripts/bench/bench_ray.py [--n 256] [--probes 8] [--skip-overhead]

Figures on this machine move 2x between runs (shared cores): compare the ratios.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["rounds_table", "overhead"]


def rounds_table(n: int, ks: tuple[int, ...] = (1, 2, 4)) -> list[dict]:
    """Rounds used by the search over every answer position, per K."""
    from reprobisect.core.search import Bisection

    points = list(range(n))
    rows = []
    for k in ks:
        used = []
        for culprit in range(1, n):
            b = Bisection(points)
            rounds = 0
            while not b.done:
                batch = b.next(k)
                rounds += 1
                for p in batch:
                    b.mark(p, "bad" if p >= culprit else "good")
            assert b.result().first_bad == culprit
            used.append(rounds)
        bound = math.ceil(math.log(n - 1, k + 1) - 1e-12)
        rows.append({"k": k, "n": n, "mean": statistics.mean(used), "max": max(used), "bound": bound})
    return rows


def _stand_in(spec, workdir, trace_dir):
    """A probe without the launcher: run ``python -c pass`` in the tree, no trace."""
    import subprocess as _sp
    import sys as _sys

    from reprobisect.executors.base import ProbeResult
    from reprobisect.core.outcome import Outcome

    r = _sp.run([_sys.executable, "-c", "pass"], cwd=workdir)
    return ProbeResult(spec=spec, outcome=Outcome("ok" if r.returncode == 0 else "crashed"))


def _history(root: Path, n: int) -> tuple[Path, list[str]]:
    repo = root / "repo"
    repo.mkdir()

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    commits = []
    for i in range(n):
        (repo / "train.py").write_text(f"# a trivial command: no framework\nprint({i})\n")
        git("add", "-A")
        git("-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", f"c{i}")
        commits.append(git("rev-parse", "HEAD"))
    return repo, commits


def _per_probe(ex, repo: Path, commits: list[str], runner_ok: bool) -> list[float]:
    from reprobisect.executors.base import ProbeSpec

    times = []
    for i, c in enumerate(commits):
        spec = ProbeSpec(key=f"b{i}", argv=(sys.executable, "train.py"), repo=str(repo), revision=c, steps=1, timeout=120)
        t0 = time.perf_counter()
        res = ex.submit(spec).result(timeout=300)
        times.append(time.perf_counter() - t0)
        if res.outcome.status in ("infra", "timeout") and runner_ok:
            raise SystemExit(f"probe failed: {res.outcome}")
    return times


def overhead(probes: int = 8) -> dict:
    """Median seconds per probe, local vs Ray, one probe at a time, same commits."""
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from reprobisect.executors.local import LocalExecutor
    from reprobisect.executors.ray import RayExecutor

    try:
        import reprobisect.runners.launch  # noqa: F401

        real = True
    except ImportError:
        real = False
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        root = Path(tmp)
        repo, commits = _history(root, probes + 1)
        out: dict = {"probes": probes, "mode": "real probe (launcher)" if real else "stand-in (python -c pass)"}
        if real:
            with LocalExecutor(jobs=1, cache_dir=root / "cache") as ex:
                _per_probe(ex, repo, commits[:1], real)  # warm-up
                local = _per_probe(ex, repo, commits[1:], real)
        else:
            from reprobisect.executors.base import ProbeSpec

            local = []
            for i, c in enumerate(commits[1:]):
                t0 = time.perf_counter()
                wt = root / f"wt{i}"
                subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(wt), c], check=True)
                _stand_in(ProbeSpec(key="x", argv=("python",)), wt, None)
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(wt)], check=True)
                local.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        short = tempfile.mkdtemp(prefix="rb-ray-", dir="/tmp")
        ray_ex = RayExecutor(max_parallel=1, num_cpus=2, temp_dir=short, runner=None if real else _stand_in)
        start = time.perf_counter() - t0
        with ray_ex as ex:
            _per_probe(ex, repo, commits[:1], real)  # warm-up
            remote = _per_probe(ex, repo, commits[1:], real)
        subprocess.run(["rm", "-rf", short])
        out.update(
            local_s=statistics.median(local),
            ray_s=statistics.median(remote),
            ray_start_s=start,
        )
        out["overhead_s"] = out["ray_s"] - out["local_s"]
        out["ratio"] = out["ray_s"] / out["local_s"]
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256, help="commits in the simulated history")
    ap.add_argument("--probes", type=int, default=8, help="real probes per executor for the overhead")
    ap.add_argument("--skip-overhead", action="store_true")
    a = ap.parse_args(argv)
    print(f"rounds of the search over N={a.n} commits, every answer position (simulated verdicts)")
    print(f"{'K':>3} {'mean':>6} {'max':>4} {'ceil(log_K+1(N-1))':>20}")
    for r in rounds_table(a.n):
        print(f"{r['k']:>3} {r['mean']:>6.2f} {r['max']:>4} {r['bound']:>20}")
    if a.skip_overhead:
        return
    o = overhead(a.probes)
    print(f"\nper-probe wall time, one at a time, {o['probes']} probes, {o['mode']}:")
    print(f"  local executor  {o['local_s']:.3f} s (median)")
    print(f"  ray executor    {o['ray_s']:.3f} s (median)   start of the local Ray instance {o['ray_start_s']:.1f} s (once)")
    print(f"  Ray overhead    {o['overhead_s']:+.3f} s per probe   ratio {o['ratio']:.2f}x")


if __name__ == "__main__":
    main()
