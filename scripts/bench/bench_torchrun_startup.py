#!/usr/bin/env python
"""Start-up that ``bisect capture -- torchrun ...`` adds over plain ``torchrun``, in the same run.

    .venv/bin/python scripts/bench/bench_torchrun_startup.py [--reps 3] [--nproc 2] [--steps 1] [--json]

A tiny DDP script (gloo on CPU, a one-layer model) that takes exactly ``--steps`` optimizer
steps and exits runs under plain ``torchrun`` and under ``bisect capture --steps N --
torchrun ...`` (the CLI's own start-up, the per-probe bootstrap folder, the recorder in
every rank, sealing the shards and assembling the top manifest all count), repetitions
interleaved so that a busy machine slows both alike. Reported: the median wall time of
each and the difference between the medians and between the best runs (the best is the
least disturbed by other load; issue 13's target: <= 1 s added). A fresh rendezvous port each
run (``--rdzv-endpoint`` on a port bound to 0 and released).

Timings on a shared 2-core machine move between runs: read the difference over several
repetitions. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = '''
import argparse, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
p = argparse.ArgumentParser(); p.add_argument("--steps", type=int, default=1); a = p.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 16)
for _ in range(a.steps):
    opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()
dist.destroy_process_group()
'''


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, steps: int) -> list[str]:
    return [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_port()}", "train.py", "--steps", str(steps)]


def _timed(cmd: list[str], cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-torchrun-"))
    try:
        (work / "train.py").write_text(SCRIPT)
        plain: list[float] = []
        captured: list[float] = []
        for i in range(a.reps):
            plain.append(_timed(_torchrun(a.nproc, a.steps), work))
            captured.append(_timed([sys.executable, "-m", "reprobisect", "capture", "-q", "-o", f"t{i}.trace",
                                    "--steps", str(a.steps), "--", *_torchrun(a.nproc, a.steps)], work))
            shutil.rmtree(work / f"t{i}.trace", ignore_errors=True)
        res = {"nproc": a.nproc, "steps": a.steps, "reps": a.reps, "plain_s": [round(x, 3) for x in plain],
               "capture_s": [round(x, 3) for x in captured], "plain_median_s": round(statistics.median(plain), 3),
               "capture_median_s": round(statistics.median(captured), 3),
               "added_s": round(statistics.median(captured) - statistics.median(plain), 3),
               "added_best_s": round(min(captured) - min(plain), 3)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"plain torchrun:          {res['plain_median_s']:.2f} s (median of {a.reps}: {res['plain_s']})")
        print(f"bisect capture -- torchrun: {res['capture_median_s']:.2f} s (median of {a.reps}: {res['capture_s']})")
        print(f"added: {res['added_s']:+.2f} s between medians, {res['added_best_s']:+.2f} s between the best runs "
              "(target <= 1 s)")


if __name__ == "__main__":
    main()
