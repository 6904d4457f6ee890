"""Time the HTML report of a 200-step comparison (issue 17 target: <= 3 MB, <= 5 s).

Builds two traces of a small MLP-shaped chain with the project's trace writer (NumPy only:
batch, input, activations, output, loss, grads, params, optimizer state per step), B
drifting from A from ``--diverge-at`` on by a tiny perturbation that grows, full tensors
stored every ``--store-every`` steps and at the divergence, then times
``reprobisect.report.html.write_report`` on the folder holding both.

    python scripts/bench/bench_report.py [--steps 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from reprobisect.trace import TraceWriter, record_array

LAYERS = ("encoder.fc1", "encoder.act", "encoder.fc2", "head.norm", "head.out")
PARAMS = ("encoder.fc1.weight", "encoder.fc1.bias", "encoder.fc2.weight", "encoder.fc2.bias", "head.norm.weight",
          "head.out.weight")
ENV = {"python": {"version": "3.11"}, "env_vars": {"OMP_NUM_THREADS": "1"}}


def build_trace(path: Path, *, steps: int, diverge_at: int | None, store_every: int, width: int = 32,
                env: dict | None = None) -> Path:
    """A ``steps``-step trace; from ``diverge_at`` on, values drift by a growing relative amount."""
    rng = np.random.default_rng(0)
    base = {n: rng.standard_normal((width, width) if n.endswith("weight") else (width,)).astype(np.float32)
            for n in PARAMS}
    with TraceWriter(path, command=["python", "train.py"], environment=env or ENV) as w:
        for k in range(steps):
            w.begin_step(k)
            store = k % store_every == 0 or k == diverge_at
            drift = 0.0 if diverge_at is None or k < diverge_at else min(1e-2, 1e-7 * 1.07 ** (k - diverge_at))
            step_rng = np.random.default_rng(k + 1)

            def rec(kind, name, a, module=None):
                a = np.asarray(a, np.float32)
                if drift and kind not in ("batch", "input"):
                    a = a * np.float32(1 + drift * (1 + len(name) % 7))
                w.record(record_array(name, kind, a, module=module), a if store else None)

            x = step_rng.standard_normal((8, width)).astype(np.float32)
            rec("batch", "data[0]", x)
            rec("input", "x", x)
            h = x
            for layer in LAYERS:
                h = np.tanh(h @ base["encoder.fc1.weight"][:width, :width] * 0.1)
                rec("activation", layer, h, module=layer.rsplit(".", 1)[1])
            rec("output", "output", h)
            rec("loss", "loss", np.float32((h ** 2).mean()))
            for n in PARAMS:
                rec("grad", n, base[n] * 0.01)
            for n in PARAMS:
                base[n] = base[n] - np.float32(1e-3) * base[n]
                rec("param", n, base[n])
            for n in PARAMS:
                rec("optim_state", f"{n}/exp_avg", base[n] * 0.1)
            w.end_step({"loss": float((h ** 2).mean()), "lr": [1e-3]}, batch_ids=list(range(k * 8, k * 8 + 8)))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--diverge-at", type=int, default=40)
    ap.add_argument("--store-every", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    from reprobisect.report.html import write_report

    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        build_trace(root / "pair" / "a", steps=args.steps, diverge_at=None, store_every=args.store_every)
        build_trace(root / "pair" / "b", steps=args.steps, diverge_at=args.diverge_at, store_every=args.store_every)
        built = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        out = write_report(root / "pair", root / "report.html")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        size = out.stat().st_size
    figures = {"steps": args.steps, "html_bytes": size, "write_s": round(wall, 3), "write_cpu_s": round(cpu, 3), "build_traces_s": round(built, 3),
               "target_bytes": 3 * 2**20, "target_s": 5.0, "ok": size <= 3 * 2**20 and wall <= 5.0}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{args.steps}-step comparison: report {size / 1024:.0f} KiB written in {wall:.2f} s ({cpu:.2f} s CPU) "
              f"(targets: <= 3 MiB, <= 5 s) -- {'ok' if figures['ok'] else 'OVER TARGET'}")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
