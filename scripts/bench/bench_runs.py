"""Benchmark of the ``bisect runs`` controller on a generated 256-commit history.

Prints, all measured in this one run (the machine is shared: compare ratios, not seconds):

A. the controller's own cost per probe with a tiny command that does NOT import torch
   (worktree add/remove + launcher start + manifest read, beyond the command's own time);
   such a probe ends ``no_steps`` (no framework), which is all this part needs;
B. a real search with a tiny torch command, K=1: probes used vs ceil(log2 N), probe runs
   (endpoints and re-checks included), wall time, and the overhead per probe beyond the
   command's own time (measured by running the command directly), compare time included;
C. the equivalent ``git bisect run bisect probe --reference REF -- CMD`` in a copy of the
   repository: its probe count and wall time, and the ratio.

Targets (issue 4): search probes <= ceil(log2 N) + 2 with K=1; controller overhead
<= 0.3 s per probe.

    .venv/bin/python scripts/bench/bench_runs.py [--n 256] [--culprit 173] [--no-torch] [--no-git-bisect]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = "import sys\nprint(open('notes.txt').read().count('\\n'))\n"

TORCH_SCRIPT = """import torch

SCALE = {scale}

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
with torch.no_grad():
    model[0].weight.mul_(SCALE)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8)
for _ in range(10):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
"""


def build_history(root: Path, n: int, culprit: int) -> list[str]:
    """A repository with ``n`` commits after the root (git fast-import); commit ``culprit`` changes SCALE."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    lines: list[str] = []
    notes = ""
    t = 1_700_000_000

    def blob(text: str) -> str:
        data = text.encode()
        return f"data {len(data)}\n{text}\n"

    for i in range(n + 1):
        notes += f"note {i}\n"
        scale = "1.0" if i < culprit else "1.0001"
        msg = "initial" if i == 0 else (f"change {i}: scale" if i == culprit else f"change {i}: notes")
        lines.append("commit refs/heads/main")
        lines.append(f"mark :{i + 1}")
        lines.append(f"author Bench <bench@example.com> {t + 60 * i} +0000")
        lines.append(f"committer Bench <bench@example.com> {t + 60 * i} +0000")
        lines.append(blob(msg).rstrip("\n"))
        if i:
            lines.append(f"from :{i}")
        lines.append("M 100644 inline notes.txt")
        lines.append(blob(notes).rstrip("\n"))
        lines.append("M 100644 inline tiny.py")
        lines.append(blob(TINY).rstrip("\n"))
        lines.append("M 100644 inline train.py")
        lines.append(blob(TORCH_SCRIPT.format(scale=scale)).rstrip("\n"))
        lines.append("")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=root, input="\n".join(lines) + "\n", text=True, check=True)
    subprocess.run(["git", "checkout", "-q", "-f", "main"], cwd=root, check=True)
    return subprocess.run(["git", "rev-list", "--reverse", "main"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.split()


def median_time(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def part_a(root: Path, commits: list[str], probes: int) -> dict:
    from reprobisect.executors.base import ProbeSpec
    from reprobisect.executors.local import LocalExecutor

    cmd = ("python", "tiny.py")
    direct = median_time(lambda: subprocess.run([sys.executable, "tiny.py"], cwd=root, capture_output=True, check=True), probes)
    tdir = Path(tempfile.mkdtemp(prefix="bench-runs-launch-"))
    n = iter(range(10**6))
    launcher = median_time(
        lambda: subprocess.run([sys.executable, "-m", "reprobisect.runners.launch", "--trace", str(tdir / f"t{next(n)}"),
                                "--", "tiny.py"], cwd=root, capture_output=True),
        probes,
    )
    shutil.rmtree(tdir, ignore_errors=True)
    walls = []
    with LocalExecutor(jobs=1, cache_dir=Path(tempfile.mkdtemp(prefix="bench-runs-wt-"))) as ex:
        for i, c in enumerate(commits[1 : probes + 1]):
            spec = ProbeSpec(key=f"a{i}", argv=cmd, repo=str(root), revision=c, steps=3)
            t0 = time.perf_counter()
            res = ex.submit(spec).result()
            walls.append(time.perf_counter() - t0)
            assert res.outcome.status == "no_steps", res.outcome
    probe = statistics.median(walls)
    return {"direct_s": direct, "probe_s": probe, "overhead_s": probe - direct, "launcher_s": launcher - direct,
            "controller_s": probe - launcher}


def part_b(root: Path, commits: list[str], culprit: int) -> dict:
    from reprobisect.core.options import ProbeOptions
    from reprobisect.core.verdict import compare_results as compare_traces
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    cmd = ("python", "train.py")
    direct = median_time(lambda: subprocess.run([sys.executable, "train.py"], cwd=root, capture_output=True, check=True), 5)
    cache = Path(tempfile.mkdtemp(prefix="bench-runs-cache-"))
    t0 = time.perf_counter()
    r = find_first_bad(RunsConfig(cwd=str(root), good=commits[0], bad=commits[-1], command=cmd,
                                  options=ProbeOptions(jobs=1, quiet=True), cache_dir=str(cache)))
    wall = time.perf_counter() - t0
    assert r.first_bad is not None and r.first_bad.hash == commits[culprit], r
    traces = sorted((cache / "cache" / "traces").iterdir())
    cmp_s = median_time(lambda: compare_traces(str(traces[0]), str(traces[1]), "bitwise"), 5) if len(traces) >= 2 else 0.0
    per_probe = wall / r.runs
    # the controller's own time: the session's wall less the time its probe processes ran
    # (K=1: probes run one after another, so the difference is what the controller spent)
    from reprobisect.core.session import SessionLog

    in_probes = sum(float((e.outcome or {}).get("wall_s") or 0.0) for e in SessionLog.load(r.session_log))
    controller = (wall - in_probes) / r.runs
    return {"probes": r.probes, "runs": r.runs, "rounds": r.rounds, "wall_s": wall, "direct_s": direct,
            "per_probe_s": per_probe, "overhead_s": per_probe - direct, "compare_s": cmp_s, "cache": cache,
            "controller_s": controller}


def part_c(root: Path, commits: list[str], culprit: int, tmp: Path) -> dict:
    bisect = [sys.executable, "-m", "reprobisect"]
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    ref = tmp / "ref"
    subprocess.run(["git", "checkout", "-q", commits[0]], cwd=clone, check=True)
    subprocess.run([*bisect, "capture", "-o", str(ref), "--", "python", "train.py"], cwd=clone, check=True, capture_output=True)
    t0 = time.perf_counter()
    subprocess.run(["git", "bisect", "start", commits[-1], commits[0]], cwd=clone, check=True, capture_output=True)
    out = subprocess.run(["git", "bisect", "run", *bisect, "probe", "--reference", str(ref), "-q", "--", "python", "train.py"],
                         cwd=clone, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    runs = out.stdout.count("running ")
    found = f"{commits[culprit]} is the first bad commit" in out.stdout
    subprocess.run(["git", "bisect", "reset", "-q"], cwd=clone, capture_output=True)
    return {"runs": runs, "wall_s": wall, "found": found}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256, help="commits after the root [256]")
    ap.add_argument("--culprit", type=int, default=173, help="index of the commit that changes the numerics [173]")
    ap.add_argument("--a-probes", type=int, default=12, help="probes for part A [12]")
    ap.add_argument("--no-torch", action="store_true", help="part A only")
    ap.add_argument("--no-git-bisect", action="store_true", help="skip part C")
    args = ap.parse_args()
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-runs-"))
    try:
        t0 = time.perf_counter()
        commits = build_history(tmp / "repo", args.n, args.culprit)
        print(f"history: {len(commits) - 1} commits after the root, culprit at {args.culprit} "
              f"(built in {time.perf_counter() - t0:.1f} s)")
        bound = math.ceil(math.log2(args.n))
        a = part_a(tmp / "repo", commits, args.a_probes)
        print(f"A. controller cost, no-torch command ({args.a_probes} probes, K=1): probe {a['probe_s']*1e3:.0f} ms, "
              f"command alone {a['direct_s']*1e3:.0f} ms -> overhead {a['overhead_s']*1e3:.0f} ms/probe "
              f"(target <= 300 ms: {'OK' if a['overhead_s'] <= 0.3 else 'MISSED'})")
        print(f"   of which the launcher's start-up (python -m reprobisect.runners.launch, run directly) "
              f"{a['launcher_s']*1e3:.0f} ms and the controller (worktree checkout/release, executor, manifest) "
              f"{a['controller_s']*1e3:.0f} ms")
        if args.no_torch:
            return 0
        b = part_b(tmp / "repo", commits, args.culprit)
        print(f"B. bisect runs, tiny torch command, K=1: {b['probes']} search probes (ceil(log2 {args.n}) = {bound}; "
              f"target <= {bound + 2}: {'OK' if b['probes'] <= bound + 2 else 'MISSED'}), {b['runs']} probe runs "
              f"(+2 endpoints, +2 re-checks), {b['rounds']} rounds, {b['wall_s']:.1f} s")
        print(f"   per probe run {b['per_probe_s']:.2f} s vs command alone {b['direct_s']:.2f} s -> overhead "
              f"{b['overhead_s']:.2f} s/probe, of which compare {b['compare_s']*1e3:.0f} ms "
              f"(includes the recorder's own hooks and trace sealing; target <= 0.3 s: "
              f"{'OK' if b['overhead_s'] <= 0.3 else 'MISSED'}); ratio {b['per_probe_s'] / b['direct_s']:.2f}x")
        print(f"   controller's own time (session wall less the probe processes' wall, per probe run): "
              f"{b['controller_s']*1e3:.0f} ms (target <= 300 ms: {'OK' if b['controller_s'] <= 0.3 else 'MISSED'})")
        if not args.no_git_bisect:
            c = part_c(tmp / "repo", commits, args.culprit, tmp)
            print(f"C. git bisect run bisect probe: {c['runs']} probe runs, {c['wall_s']:.1f} s, found={c['found']}; "
                  f"bisect runs / git bisect run wall = {b['wall_s'] / c['wall_s']:.2f}x "
                  f"(bisect runs also verifies both endpoints and re-checks the culprit and its parent); "
                  f"per probe run {b['wall_s'] / b['runs']:.2f} s vs {c['wall_s'] / max(c['runs'], 1):.2f} s")
        shutil.rmtree(b["cache"], ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
