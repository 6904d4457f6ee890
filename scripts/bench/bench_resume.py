"""Benchmark of ``bisect resume``: its three runs against the same three runs plain.

Target (issue 16): ``bisect resume`` costs at most 1.2x running the command three times
plain. Both sides run the same work, interleaved in one session so that the shared
machine's load hits them alike:

- plain: ``python train.py --total N``, ``python train.py --total K`` (the part a preemption
  leaves), ``python train.py --total N --resume ckpt.pt`` (the rest), one after another;
- resume: ``bisect resume --steps N --at K --resume-args '--resume ckpt.pt' -- python train.py --total N``
  (the command is stopped after N steps, after K steps, after N-K resumed steps).

The workload is ``examples/resume/train.py`` (a small MLP, dropout, SGD with momentum,
StepLR, a CPU GradScaler) with a wider model and more steps than the tests use
(``--width``, default 256; N=40, K=20) so that training, not only interpreter start-up, is
measured; the ratio of medians over ``--repeats`` rounds is the figure. The recorded runs end
with ``os._exit`` after the trace is sealed (no interpreter teardown), which a plain run pays:
with few steps the ratio can come out below 1.

    python scripts/bench/bench_resume.py [--steps 40] [--at 20] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["plain_three", "resume_three", "main"]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "resume" / "train.py"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _timed(argv: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    return dt


def plain_three(n: int, k: int, cwd: Path, W: list[str]) -> float:
    """Seconds for the command run three times without reprobisect: N steps, K steps, resumed to N."""
    py = [sys.executable, str(SCRIPT)]
    return (_timed([*py, "--total", str(n), *W], cwd) + _timed([*py, "--total", str(k), *W], cwd)
            + _timed([*py, "--total", str(n), *W, "--resume", "ckpt.pt"], cwd))


def resume_three(n: int, k: int, cwd: Path, W: list[str]) -> float:
    """Seconds for ``bisect resume --steps N --at K`` on the same command."""
    return _timed([sys.executable, "-m", "reprobisect", "resume", "--quiet", "--steps", str(n), "--at", str(k),
                   "--resume-args", "--resume ckpt.pt", "--", "python", str(SCRIPT), "--total", str(n), *W], cwd)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--at", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--width", type=int, default=256, help="hidden width of the example's MLP")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    plain, rec = [], []
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as d:
        for _ in range(a.repeats):  # interleaved: the machine's load hits both alike
            w = ["--width", str(a.width)]
            plain.append(plain_three(a.steps, a.at, Path(d), w))
            rec.append(resume_three(a.steps, a.at, Path(d), w))
    mp, mr = statistics.median(plain), statistics.median(rec)
    out = {"steps": a.steps, "at": a.at, "width": a.width, "repeats": a.repeats, "plain_three_s": [round(x, 3) for x in plain],
           "resume_s": [round(x, 3) for x in rec], "plain_median_s": round(mp, 3), "resume_median_s": round(mr, 3),
           "ratio": round(mr / mp, 3), "target": 1.2}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"bisect resume --steps {a.steps} --at {a.at}: {mr:.2f} s; the three runs plain: {mp:.2f} s; "
              f"ratio {mr / mp:.2f} (target <= 1.2; medians of {a.repeats})")


if __name__ == "__main__":
    main()
