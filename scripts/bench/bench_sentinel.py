"""What ``--detail sentinel`` costs per step, against plain training and ``--detail full``.

    python scripts/bench/bench_sentinel.py [--model mlp|transformer] [--steps 1000] [--chunk 50]
                                           [--modes plain,sentinel,full] [--json]

On the recorder benchmark's MLP (``examples/mlp.py``: 4 x 1024, batch 256; ``--hidden``
makes it smaller) or transformer (``--model transformer``, ``examples/transformer.py``: 4
layers, d 256, seq 128, batch 16, its LR schedule stepped), in one process: the run is cut
into chunks of ``--chunk`` steps; each chunk is run once per mode, the modes interleaved in
a rotating order, every mode from the same saved model/optimizer/RNG state on the same
batches (so that machine noise and the MLP's step-to-step time changes hit every mode
alike). A recorded chunk gets a fresh recorder writing a real trace (its first, untimed
step learns names and hooks; then ``--chunk`` timed steps) and takes over the state
buffers of the last chunk of its mode, as a long run's captures reuse the last one's.

Modes: ``plain``; ``sentinel``, complete state once every 50 steps as ``--state-every 50``
does, captured at the chunk's first timed step so that its background write overlaps the
steps after it, as in a long run; ``sentinel_end``, captured after step 49 as a recorder
started at the chunk's untimed step would, its write's rest waited for at the chunk's end
(what a run pays once, at its end, charged to every 50 steps); ``sentinel_nostate``; and
``full``. Every chunk's time includes the wait for its state's files.

Printed: each mode's total time over all chunks and its ratio to plain (wall and process
CPU time), and the time spent inside the recorder (every hook, the step's end, writing:
``TorchRecorder.guarded`` timed; and the state captures, which the optimizer's hook defers
to the next iteration's start) per step and as ``1 + recorder time / plain time``
(``cost_ratio``): on a shared machine whole-step ratios move by more than a sentinel
costs, the recorder's own time does not.

The memory floor of a sentinel step: the bytes it must read (every parameter, fingerprinted
after the step, and every gradient, for the total norm) at the speed of a same-run copy of
as many bytes (``bench_recorder``'s floor, issue 12 item 5). ``floor_ms_per_step`` is that
time and ``floor`` each sentinel mode's recorder time over it: near 1, the sentinel costs
what reading its bytes costs, and only a model with fewer parameter bytes per step time
makes it cheaper.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_recorder, also when loaded by path

import mlp as mlp_example  # noqa: E402
import transformer as tf_example  # noqa: E402

from bench_recorder import _copy_seconds  # noqa: E402
from reprobisect.runners import torch_state  # noqa: E402
from reprobisect.runners.torch import RecordPolicy, TorchRecorder  # noqa: E402
from reprobisect.trace.format import DEFAULT_STATE_EVERY  # noqa: E402
from reprobisect.trace.writer import TraceWriter  # noqa: E402

def policy(mode: str, chunk: int) -> dict:
    """The recorder policy of ``mode`` (see the module's docstring) for a chunk of ``chunk``
    timed steps (steps 1..chunk)."""
    if mode == "sentinel":
        return dict(detail="sentinel", state_every=10**9, state_steps=tuple(range(1, chunk + 1, DEFAULT_STATE_EVERY)))
    if mode == "sentinel_end":
        return dict(detail="sentinel", state_every=DEFAULT_STATE_EVERY)
    if mode == "sentinel_nostate":
        return dict(detail="sentinel", state_every=10**9)
    if mode == "full":
        return dict(detail="full")
    raise SystemExit(f"unknown mode {mode!r}: plain, sentinel, sentinel_end, sentinel_nostate or full")


def build(hidden: int, batches: int, model: str = "mlp"):
    """(step, ``batches`` batches, the stateful objects) of the benchmark's ``model``."""
    if model == "transformer":
        return _build_transformer(batches)
    a = mlp_example.parse(["--features", "1024", "--hidden", str(hidden), "--layers", "4", "--batch-size", "256",
                           "--samples", str(256 * batches), "--dropout", "0.1"])
    net, opt, loader, loss_fn = mlp_example.build(a)

    def step(x, y):
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()

    data = [b for b in loader][:batches]
    return step, data, [net, opt]


def _build_transformer(batches: int):
    a = tf_example.parse(["--layers", "4", "--d-model", "256", "--seq", "128", "--batch-size", "16",
                          "--vocab", "256", "--samples", str(16 * batches)])
    model, opt, sched, loader = tf_example.build(a)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss_fn(model(x).reshape(-1, a.vocab), y.reshape(-1)).backward()
        opt.step()
        sched.step()

    data = [b for b in loader][:batches]
    return step, data, [model, opt, sched]


def run(step, batches, cpu: list[float] | None = None, then=None) -> float:
    """Seconds to run ``batches`` through ``step`` and then ``then()`` (its process CPU time
    appended to ``cpu``)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for x, y in batches:
        step(x, y)
    if then is not None:
        then()
    if cpu is not None:
        cpu.append(time.process_time() - c0)
    return time.perf_counter() - t0


def bench(steps: int, chunk: int, modes: list[str], hidden: int, tmp: Path, model: str = "mlp") -> dict:
    step, data, stateful = build(hidden, chunk + 1, model)
    run(step, data[:3])  # warm-up
    saved = [copy.deepcopy(o.state_dict()) for o in stateful]
    rng = torch.get_rng_state()
    wall = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    record_s: dict[str, float] = {m: 0.0 for m in modes}
    rounds = max(1, steps // chunk)
    spent = _time_recorder()
    inside: dict[str, float] = {m: 0.0 for m in modes}
    buffers: dict[str, dict] = {}
    for r in range(rounds):
        for mode in modes[r % len(modes):] + modes[: r % len(modes)]:
            for o, st in zip(stateful, saved):
                o.load_state_dict(copy.deepcopy(st))
            torch.set_rng_state(rng)
            if mode == "plain":
                run(step, data[:1])
                wall[mode].append(run(step, data[1:], cpu[mode]))
                continue
            writer = TraceWriter(tmp / f"{mode}-{r}", command=["bench"], policy={})
            # a long run's captures copy into the buffers of the one before (TraceWriter._private_copies):
            # each chunk's writer takes them over from the last chunk's of its mode
            writer._state_buffers = buffers.setdefault(mode, {})
            rec = TorchRecorder(writer, RecordPolicy(steps=10**9, **policy(mode, chunk))).install()
            try:
                run(step, data[:1])  # untimed: the recorder's first step (names, hooks, init records)
                spent[0] = 0.0
                # timed with the wait for the chunk's state written (a background write's rest)
                wall[mode].append(run(step, data[1:], cpu[mode], then=writer.drain))
                inside[mode] += spent[0]
            finally:
                rec.remove()
                writer.close()
            record_s[mode] += sum(s.scalars.get("record_s", 0.0) for s in _steps(tmp / f"{mode}-{r}"))
    floor_s = _copy_seconds(_sentinel_bytes(stateful[0]))
    total = {m: sum(v) for m, v in wall.items()}
    ctotal = {m: sum(v) for m, v in cpu.items()}
    n = rounds * chunk
    return {
        "model": model, "steps_per_mode": n, "chunk": chunk, "hidden": hidden, "threads": torch.get_num_threads(),
        "total_s": {m: round(v, 3) for m, v in total.items()},
        "ratio": {m: round(v / total["plain"], 4) for m, v in total.items()},
        "ratio_spread": {m: _middle_half([a / p for a, p in zip(v, wall["plain"])]) for m, v in wall.items() if m != "plain"},
        "cpu_ratio": {m: round(v / ctotal["plain"], 4) for m, v in ctotal.items()},
        "plain_step_ms": round(total["plain"] / n * 1e3, 3),
        "record_ms_per_step": {m: round(v / (rounds * (chunk + 1)) * 1e3, 3) for m, v in record_s.items() if m != "plain"},
        "recorder_ms_per_step": {m: round(v / n * 1e3, 3) for m, v in inside.items() if m != "plain"},
        "cost_ratio": {m: round(1 + v / total["plain"], 4) for m, v in inside.items() if m != "plain"},
        "floor_ms_per_step": round(floor_s * 1e3, 3),
        "floor": {m: round(v / n / floor_s, 3) for m, v in inside.items() if m.startswith("sentinel")},
    }


def _sentinel_bytes(model: torch.nn.Module) -> int:
    """The bytes a sentinel step reads: each parameter (its fingerprint) and its gradient (the norm)."""
    return 2 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _middle_half(values: list[float]) -> list[float]:
    """The lower and upper quartiles of per-chunk ratios (each chunk's mode against the same
    round's plain chunk): how far the machine's noise moves one chunk's ratio."""
    if len(values) < 2:
        return [round(v, 4) for v in values * 2][:2]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [round(q1, 4), round(q3, 4)]


def _time_recorder() -> list[float]:
    """Time spent inside the recorder from now on (outermost ``guarded`` calls, and the state
    captures a step hook defers to the next iteration's start), in a one-item list."""
    spent = [0.0, 0]

    def timed(orig):
        def call(*args, **kwargs):
            if spent[1]:
                return orig(*args, **kwargs)
            spent[1] = 1
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0
                spent[1] = 0

        return call

    TorchRecorder.guarded = timed(TorchRecorder.guarded)
    torch_state._capture_now = timed(torch_state._capture_now)
    return spent


def _steps(path: Path):
    from reprobisect.trace import read_trace

    return read_trace(path).steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000, help="steps per mode in all (default 1000)")
    p.add_argument("--chunk", type=int, default=50, help="steps per mode per round (default 50)")
    p.add_argument("--modes", default="plain,sentinel,full")
    p.add_argument("--hidden", type=int, default=1024, help="the MLP's width")
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if "plain" not in modes:
        modes.insert(0, "plain")
    for m in modes:
        if m != "plain":
            policy(m, args.chunk)  # an unknown mode stops here, before anything runs
    with tempfile.TemporaryDirectory() as tmp:
        res = bench(args.steps, args.chunk, modes, args.hidden, Path(tmp), args.model)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    what = f"MLP hidden {res['hidden']}" if res["model"] == "mlp" else "transformer"
    print(f"torch {torch.__version__}, {res['threads']} threads; {what}, {res['steps_per_mode']} "
          f"steps per mode in chunks of {res['chunk']}; plain step {res['plain_step_ms']} ms; "
          f"memory floor of a sentinel step {res['floor_ms_per_step']} ms")
    for m in modes:
        floor = f", {res['floor'][m]:.2f}x the floor" if m in res["floor"] else ""
        extra = (f", inside the recorder {res['recorder_ms_per_step'][m]} ms/step: {res['cost_ratio'][m]:.4f}x{floor}"
                 if m in res["recorder_ms_per_step"] else "")
        spread = res["ratio_spread"].get(m)
        within = f" (chunks' middle half {spread[0]:.3f}-{spread[1]:.3f}x)" if spread else ""
        print(f"  {m:<18} {res['total_s'][m]:8.2f} s  {res['ratio'][m]:.3f}x wall{within}  {res['cpu_ratio'][m]:.3f}x cpu{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
