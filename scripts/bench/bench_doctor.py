#!/usr/bin/env python
"""``bisect doctor``'s overhead, as ratios against a plain run of the same steps measured in
the same run (issue 15: the checks that observe one run cost at most 2x a plain run).

    PYTHONPATH=. .venv/bin/python scripts/bench/bench_doctor.py [--steps 30] [--reps 3] [--width 512] [--json]

A small training script (an MLP on random data through a ``DataLoader``, ``--width`` wide,
batch 128) runs exactly ``--steps`` optimizer steps as a plain ``python`` command; the
doctor then records the same command (asked for more steps, it is ended at ``--steps``)
for: every one-run check (``finite,update,contract,modes,input,memory``: one full-detail
recording with the memory switch), the same without ``memory`` (the switch's share), and
``overfit`` alone (its own sentinel run of ``--overfit-steps``, reported separately: it is
a second run by design, not an observation of the first). Variants run interleaved per
repetition so a busy machine slows all alike; the best repetition counts. Whole-command
wall times (Python and torch start-up included, as a user waits for them) and CPU times
of all child processes (steadier than wall time on a loaded machine).

Timings on a shared 2-core machine move 2x between runs: read the ratios, not the seconds.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = '''
import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
steps, width = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
x = torch.randn(4096, 256); y = torch.randint(0, 10, (4096,))
loader = DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True)
model = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, width), nn.ReLU(),
                      nn.Linear(width, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
done = 0
while done < steps:
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        done += 1
        if done >= steps:
            break
'''

ONE_RUN = ("finite", "update", "contract", "modes", "input", "memory")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _wall(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (all child processes) of ``cmd``."""
    t, c = time.perf_counter(), _cpu()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    if rc not in (0, 1):  # 1: the doctor found something; still a timing
        raise SystemExit(f"bench: {' '.join(cmd)} exited {rc}")
    return time.perf_counter() - t, _cpu() - c


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--overfit-steps", type=int, default=60)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        py = sys.executable
        doctor = [py, "-m", "reprobisect", "doctor", "-q", "--steps", str(a.steps)]
        target = ["--", py, str(script), str(a.steps + 1000), str(a.width)]
        variants = {
            "plain": [py, str(script), str(a.steps), str(a.width)],
            "one_run_checks": doctor + ["--check", ",".join(ONE_RUN)] + target,
            "one_run_checks_without_memory": doctor + ["--check", ",".join(c for c in ONE_RUN if c != "memory")] + target,
            "overfit": doctor + ["--check", "overfit", "--overfit-steps", str(a.overfit_steps)] + target,
        }
        best: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for _ in range(a.reps):
            for name, cmd in variants.items():
                w, c = _wall(cmd)
                best[name] = min(best.get(name, w), w)
                cpu[name] = min(cpu.get(name, c), c)
    plain = best["plain"]
    doc = {"steps": a.steps, "width": a.width, "reps": a.reps, "overfit_steps": a.overfit_steps,
           "wall_s": {k: round(v, 3) for k, v in best.items()},
           "ratio_vs_plain": {k: round(v / plain, 2) for k, v in best.items() if k != "plain"},
           "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
           "cpu_ratio_vs_plain": {k: round(v / cpu["plain"], 2) for k, v in cpu.items() if k != "plain"}}
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"plain run of {a.steps} steps: {plain:.2f} s (best of {a.reps})")
        print(f"{'':34} {'wall':>8} {'ratio':>6} {'cpu':>8} {'ratio':>6}")
        print(f"  {'plain':<32} {plain:7.2f}s {1:5.2f}x {cpu['plain']:7.2f}s {1:5.2f}x")
        for k, r in doc["ratio_vs_plain"].items():
            print(f"  {k:<32} {best[k]:7.2f}s {r:5.2f}x {cpu[k]:7.2f}s {doc['cpu_ratio_vs_plain'][k]:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
