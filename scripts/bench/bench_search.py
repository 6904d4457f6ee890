"""Benchmark of the search: probes and rounds on generated histories, and worktree costs.

Counts part (pure, no git): on an N-point history (default 256) with simulated verdicts,
for every first-bad position, how many probes a one-at-a-time search uses against
ceil(log2 N), and how many rounds K parallel probes use against ceil(log_{K+1} N), with
and without randomly skipped (untestable) points, on a line and on a merge-heavy graph.

Worktree part (``--worktrees``): on a generated repository, the cost of a fresh
``git worktree add``/``remove`` per probe against reusing one pool worktree
(``checkout --detach`` + ``clean``), measured in the same run (ratios, not absolutes:
the machine is shared). The real-probe timing part (``bisect runs`` vs ``git bisect run``)
is added by the probe driver's owner; keep this module importable
(``from scripts.bench.bench_search import count_search``).

    python scripts/bench/bench_search.py [--n 256] [--json] [--worktrees]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reprobisect.core.search import Bisection

__all__ = ["count_search", "count_table", "bench_worktrees", "main"]


def _dag(rng: random.Random, n: int, merge_p: float) -> tuple[list[int], dict[int, list[int]]]:
    """A history like a team's: a mainline; with probability ``merge_p`` a mainline commit
    starts a feature branch of 1-6 commits that merges back a few commits later."""
    parents: dict[int, list[int]] = {0: []}
    main_tip, open_branches, i = 0, [], 1  # open branch: [tip, merge after this many mainline commits]
    while i < n - 1:
        if open_branches and open_branches[0][1] <= 0 and i < n - 1:
            tip = open_branches.pop(0)[0]
            parents[i] = [main_tip, tip]  # the merge
            main_tip = i
        elif rng.random() < merge_p and i + 1 < n - 1:
            start = main_tip
            for _ in range(rng.randint(1, 6)):
                if i >= n - 2:
                    break
                parents[i] = [start]
                start = i
                i += 1
            open_branches.append([start, rng.randint(0, 3)])
            continue
        else:
            parents[i] = [main_tip]
            main_tip = i
        for b in open_branches:
            b[1] -= 1
        i += 1
    parents[n - 1] = [main_tip, *(b[0] for b in open_branches)]
    return list(range(n)), parents


def _ancestors(parents: dict[int, list[int]], n: int) -> list[set[int]]:
    anc: list[set[int]] = []
    for i in range(n):
        s = {i}
        for p in parents.get(i, ()):
            s |= anc[p]
        anc.append(s)
    return anc


def count_search(
    n: int = 256, k: int = 1, *, skip_rate: float = 0.0, merge_p: float | None = None, trials: int | None = None, seed: int = 0
) -> dict[str, Any]:
    """Run simulated searches and summarise probes and rounds.

    Every first-bad position 1..n-1 is tried (or ``trials`` random ones); a point is
    untestable with probability ``skip_rate``; ``merge_p`` (not None) builds a random graph
    with that share of merges and searches it in graph mode.
    """
    rng = random.Random(seed)
    positions = list(range(1, n)) if trials is None else [rng.randrange(1, n) for _ in range(trials)]
    parents = anc = None
    if merge_p is not None:
        _, parents = _dag(rng, n, merge_p)
        anc = _ancestors(parents, n)
    probes, rounds, ambiguous, wrong = [], [], 0, 0
    for answer in positions:
        skips = {i for i in range(1, n - 1) if rng.random() < skip_rate}
        if anc is None:
            bad = lambda p, a=answer: p >= a  # noqa: E731
        else:
            bad = lambda p, a=answer: a in anc[p]  # noqa: E731
        b = Bisection(list(range(n)), parents=parents)
        while not b.done:
            for p in b.next(k):
                b.mark(p, "skip" if p in skips else ("bad" if bad(p) else "good"))
        r = b.result()
        probes.append(r.probes)
        rounds.append(r.rounds)
        if r.ambiguous:
            ambiguous += 1
            wrong += answer not in r.candidates
        else:
            wrong += r.first_bad != answer
    return {
        "n": n,
        "k": k,
        "skip_rate": skip_rate,
        "graph": merge_p is not None,
        "searches": len(positions),
        "probes_mean": statistics.fmean(probes),
        "probes_max": max(probes),
        "log2_n": math.ceil(math.log2(n)),
        "rounds_mean": statistics.fmean(rounds),
        "rounds_max": max(rounds),
        "log_k1_n": math.ceil(math.log(n, k + 1) - 1e-9),
        "ambiguous": ambiguous,
        "wrong": wrong,
    }


def count_table(n: int = 256, ks: tuple[int, ...] = (1, 2, 4), skip_rates: tuple[float, ...] = (0.0, 0.1), seed: int = 0) -> list[dict[str, Any]]:
    rows = []
    for graph in (None, 0.3):
        for skip in skip_rates:
            for k in ks:
                rows.append(count_search(n, k, skip_rate=skip, merge_p=graph, seed=seed))
    return rows


def _timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_worktrees(files: int = 300, commits: int = 20, repeat: int = 15) -> dict[str, Any]:
    """Median seconds per probe checkout: fresh worktree add+remove vs a reused pool worktree."""
    from reprobisect.vcs.git import WorktreePool

    def git(cwd: Path, *args: str) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    with tempfile.TemporaryDirectory(prefix="bench-wt-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        git(repo, "init", "-q")
        git(repo, "config", "user.name", "bench")
        git(repo, "config", "user.email", "bench@example.com")
        for c in range(commits):
            for f in range(files):
                if c == 0 or f % 10 == c % 10:
                    p = repo / f"pkg{f % 10}" / f"mod{f}.py"
                    p.parent.mkdir(exist_ok=True)
                    p.write_text(f"VALUE = {c}\n" + "# padding\n" * 50)
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", f"c{c}")
        revs = subprocess.run(["git", "rev-list", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.split()
        it = iter(range(10**9))

        with WorktreePool(repo, reuse=False) as fresh:
            def add_remove() -> None:
                with fresh.checkout(revs[next(it) % len(revs)]):
                    pass
            t_fresh = _timed(add_remove, repeat)
        with WorktreePool(repo, reuse=True) as pool:
            with pool.checkout(revs[0]):
                pass

            def reuse() -> None:
                with pool.checkout(revs[next(it) % len(revs)]):
                    pass
            t_reuse = _timed(reuse, repeat)
    return {"files": files, "add_remove_s": t_fresh, "reuse_s": t_reuse, "reuse_over_fresh": t_reuse / t_fresh}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worktrees", action="store_true", help="also time worktree add/remove vs reuse")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = count_table(args.n)
    out: dict[str, Any] = {"counts": rows, "counts_wall_s": time.perf_counter() - t0}
    if args.worktrees:
        out["worktrees"] = [bench_worktrees(files=f, repeat=r) for f, r in ((30, 15), (300, 15), (3000, 5))]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"N={args.n}: probes vs ceil(log2 N)={rows[0]['log2_n']}; rounds vs ceil(log_(k+1) N); every first-bad position")
    print(f"{'history':8} {'skips':>5} {'k':>2} {'probes mean/max':>16} {'rounds mean/max':>16} {'bound':>6} {'ambig':>6} {'wrong':>6}")
    for r in rows:
        print(
            f"{'graph' if r['graph'] else 'line':8} {r['skip_rate']:>5.0%} {r['k']:>2} "
            f"{r['probes_mean']:>9.2f}/{r['probes_max']:<6} {r['rounds_mean']:>9.2f}/{r['rounds_max']:<6} "
            f"{r['log_k1_n']:>6} {r['ambiguous']:>6} {r['wrong']:>6}"
        )
    print(f"(search itself: {out['counts_wall_s']:.2f} s for {sum(r['searches'] for r in rows)} simulated searches)")
    for w in out.get("worktrees", []):
        print(
            f"worktree per probe, {w['files']} files: add+remove {w['add_remove_s'] * 1e3:.1f} ms, "
            f"reuse (checkout+clean) {w['reuse_s'] * 1e3:.1f} ms, ratio {w['reuse_over_fresh']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
