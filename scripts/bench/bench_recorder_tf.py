"""Step time of the TensorFlow/Keras recorder vs plain ``fit``, with check_numerics as the peer.

    python scripts/bench/bench_recorder_tf.py [--rounds 3] [--steps 8] [--modes eager,graph] [--quick] [--json]

In one process, on a small Keras MLP (``--features`` -> 2 x ``--hidden`` with Dropout -> 1,
Adam, batch ``--batch``): each round, every column below runs ``model.fit`` over the same
NumPy data for warm-up + ``--steps`` steps, from a model and optimizer built from the same
seed (each column gets a fresh model: check_numerics and the recorder instrument functions
as they are traced). The order of the columns rotates each round so that machine noise hits
all alike. A step's time is the interval between consecutive ``on_train_batch_end``
callbacks (data fetch + train function + the recorder's work), the first ``--warmup`` steps
of each fit dropped (tracing, first-call costs); the figure per column is the median over
all rounds, ratios are against ``plain`` of the same execution mode in the same run (wall
time, and process CPU time, which a shared machine disturbs less). Columns, per mode
(``eager``: ``run_eagerly=True``; ``graph``: the default ``tf.function``):

- ``plain``: ``fit`` as the user runs it;
- ``record``: under the launcher's recorder (``reprobisect.runners.tensorflow.TFRecorder``,
  ``--detail full``: fingerprints + stats of every recorded tensor every step), writing a
  real trace to a temp folder; when this checkout has no TF recorder, the column says so,
  the others are still printed, and the exit status is 2;
- ``check_numerics``: ``tf.debugging.enable_check_numerics()`` (TF's own NaN/Inf guard on
  every op's output), the peer a user would reach for.

``--json`` prints one object: per mode the medians, ``record`` (record / plain) and
``check_numerics`` (check_numerics / plain) ratios, CPU ratios, and whether the issue's target
holds. Target (issue 14): record within 1.5x of a plain step in eager mode; graph mode reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # PYTHONPATH (a checkout to measure) comes first

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

TARGET_EAGER = 1.5


def _recorder_api():
    """(TFRecorder, RecordPolicy) of this checkout, or the reason there is none."""
    try:
        from reprobisect.runners.tensorflow import RecordPolicy, TFRecorder
    except ImportError as e:
        return None, f"reprobisect.runners.tensorflow is not in this checkout ({e})"
    return (TFRecorder, RecordPolicy), ""


def build(args, seed: int = 0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((args.features,)),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dense(1),
    ])
    return model, keras.optimizers.Adam(1e-3)


class _Clock(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())


def _deltas(xs: list[float], skip: int) -> list[float]:
    return [b - a for a, b in zip(xs[skip:], xs[skip + 1:])]


RECORDED: dict[str, list[int]] = {}
"""Steps each ``record`` fit wrote to its trace, by mode: proof that the column recorded."""


def run_fit(args, mode: str, column: str, data, tmp: Path, api) -> tuple[list[float], list[float]]:
    """One fit of warm-up + steps steps in ``column``; per-step wall and CPU seconds."""
    x, y = data
    model, opt = build(args)
    model.compile(opt, "mse", run_eagerly=(mode == "eager"))
    clock = _Clock()
    rec = writer = None
    if column == "check_numerics":
        tf.debugging.enable_check_numerics()
    elif column == "record":
        from reprobisect.trace.writer import TraceWriter

        recorder_cls, policy_cls = api
        writer = TraceWriter(Path(tempfile.mkdtemp(dir=tmp)) / "bench.trace", command=["bench"])
        rec = recorder_cls(writer, policy_cls(steps=10**9, detail="full")).install()
    try:
        model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[clock])
    finally:
        if column == "check_numerics":
            tf.debugging.disable_check_numerics()
        if rec is not None:
            rec.remove()
            RECORDED.setdefault(mode, []).append(int(writer.steps_written))
            writer.close()
    return _deltas(clock.wall, args.warmup), _deltas(clock.cpu, args.warmup)


def bench_mode(args, mode: str, tmp: Path, api) -> dict:
    n = args.warmup + args.steps + 1
    rs = np.random.RandomState(0)
    data = (rs.rand(n * args.batch, args.features).astype("float32"), rs.rand(n * args.batch, 1).astype("float32"))
    columns = ["plain", "check_numerics"] + (["record"] if api is not None else [])
    wall: dict[str, list[float]] = {c: [] for c in columns}
    cpu: dict[str, list[float]] = {c: [] for c in columns}
    for r in range(args.rounds):
        for c in columns[r % len(columns):] + columns[: r % len(columns)]:
            w, p = run_fit(args, mode, c, data, tmp, api)
            wall[c].extend(w)
            cpu[c].extend(p)
    med = {c: statistics.median(v) for c, v in wall.items()}
    cmed = {c: statistics.median(v) for c, v in cpu.items()}
    out = {
        "mode": mode,
        "median_step_s": med,
        "ratio": {c: round(med[c] / med["plain"], 3) for c in columns if c != "plain"},
        "cpu_ratio": {c: round(cmed[c] / cmed["plain"], 3) for c in columns if c != "plain" and cmed["plain"] > 0},
        "samples_per_column": len(wall["plain"]),
    }
    out["record"] = out["ratio"].get("record")
    out["recorded_steps_per_fit"] = RECORDED.get(mode)
    out["check_numerics"] = out["ratio"]["check_numerics"]
    if mode == "eager" and out["record"] is not None:
        out["target"] = TARGET_EAGER
        out["meets_target"] = out["record"] <= TARGET_EAGER
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="timed steps per column per round")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped at the start of each fit")
    p.add_argument("--modes", default="eager,graph")
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a smaller model and fewer steps (a smoke run, not the figures)")
    p.add_argument("--threads", type=int, default=0, help="TF intra/inter-op threads (0: TF's default)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.quick:
        args.rounds, args.steps, args.warmup, args.hidden, args.features = 1, 3, 2, 32, 16
    got, why = _recorder_api()
    with tempfile.TemporaryDirectory() as tmp:
        results = [bench_mode(args, m, Path(tmp), got) for m in args.modes.split(",")]
    head = {"tensorflow": tf.__version__, "keras": keras.__version__,
            "threads": [tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads()],
            "model": f"MLP {args.features}-{args.hidden}-{args.hidden}-1, batch {args.batch}, Adam",
            "recorder": None if got is None else "reprobisect.runners.tensorflow.TFRecorder (detail full)"}
    if got is None:
        head["recorder_missing"] = why
    if args.json:
        print(json.dumps({**head, **{r["mode"]: r for r in results}}, indent=1))
    else:
        _print(head, results)
    return 2 if got is None else 0


def _print(head: dict, results: list[dict]) -> None:
    print(f"tensorflow {head['tensorflow']}, keras {head['keras']}, {head['model']}; medians of "
          f"{results[0]['samples_per_column']} steps per column")
    print(f"{'mode':<8}{'plain ms':>10}{'record ms':>11}{'chk-num ms':>12}{'record x':>10}{'chk-num x':>11}"
          f"{'cpu rec x':>11}{'cpu chk x':>11}  target (record, eager)")
    for r in results:
        m, c = r["median_step_s"], r["cpu_ratio"]
        rec = f"{m['record'] * 1e3:>11.2f}" if "record" in m else f"{'-':>11}"
        recx = f"{r['record']:>10.3f}" if r["record"] is not None else f"{'missing':>10}"
        crec = f"{c['record']:>11.3f}" if "record" in c else f"{'-':>11}"
        tgt = ""
        if "target" in r:
            tgt = f"  <= {r['target']:.2f} {'ok' if r['meets_target'] else 'MISSED'}"
        print(f"{r['mode']:<8}{m['plain'] * 1e3:>10.2f}{rec}{m['check_numerics'] * 1e3:>12.2f}{recx}"
              f"{r['check_numerics']:>11.3f}{crec}{c.get('check_numerics', float('nan')):>11.3f}{tgt}")
    if head.get("recorder_missing"):
        print(f"record: {head['recorder_missing']}; exit status 2")


if __name__ == "__main__":
    sys.exit(main())
