"""Step time of the PyTorch recorder vs plain training, with detect_anomaly as the peer.

    python scripts/bench/bench_recorder.py [--rounds 6] [--steps 4] [--quick] [--json] [--device cuda]
    python scripts/bench/bench_recorder.py --cost [--rounds 7]
    python scripts/bench/bench_recorder.py --throughput [--device cuda]

In one process, after warm-up, on the example MLP (4 x 1024, batch 256) and transformer
(4 layers, d 256, seq 128): each round runs ``--steps`` training steps in each mode,
interleaved (the order rotating each round) so that machine noise hits every mode
alike, every mode from the same saved model/optimizer/RNG state on the same batches
(the MLP's plain step time moves 10x between steps once subnormal floats appear); the figure per mode is the median step time, and ratios are against plain in
the same run (wall time, and process CPU time, which a shared machine disturbs less).
Modes:

- ``plain``: the training step as the example runs it;
- ``record``: the launcher's recorder (fingerprint + stats of every tensor every step:
  batch, inputs, each module output, loss, grads, params, optimizer state), writing a
  real trace to a temp folder;
- ``fp_only``: the same recorder without stats (fingerprints only), to show what the
  stats cost;
- ``record_ops``: ``record`` on the torch-op fallback (what a machine without a C++
  compiler gets; ``reprobisect.native``);
- ``no_optim_state``: an experiment, not a policy the recorder offers: ``record`` without
  the optimizer-state records (what a lighter default policy would cost);
- ``record_batched`` (CPU only): ``record`` with the batched fingerprint path forced
  (``runners.batched_torch``: what an accelerator runs), to time it here;
- ``sentinel``: the recorder at ``--detail sentinel`` (issue 12), only when this checkout
  has that level (``_sentinel_policy``); the JSON says null otherwise;
- ``anomaly``: the same step under ``torch.autograd.detect_anomaly()``.

The memory floor (issue 12, item 5): the bytes one recorded step's records must read (every
distinct tensor fingerprinted: batch, inputs, activations, loss, grads, params, optimizer
state), divided by the bandwidth of a copy of that many bytes measured in the same run
(``memcpy``: host memory on CPU, device-to-device on a GPU). ``floor`` is ``record``'s added
time over that floor; ``excess_us_per_tensor`` is what the added time exceeds the floor by,
per recorded tensor (the Python and dispatch cost); the issue's bound is
``1.5 x floor + 15 us x tensors``.

Every ratio and the added time are paired: each round's median of the mode against the
same round's median of ``plain``, then the median over rounds. This machine's speed drifts
by 10-50% over minutes (a plain transformer step measured 270 ms one hour and 350-450 ms
the next), which whole-run medians of each mode mixed into the ratios. The middle half of
the rounds goes with each figure (``ratio_spread``, ``floor_spread``), and a verdict
(``meets_target``, ``meets_floor_bound``) is null, printed "inconclusive", when that middle
half straddles the limit: the noise is larger than the margin, and more ``--rounds`` are
needed to tell.

``--json`` prints one object: per model ``full`` (record / plain), ``sentinel`` (or null),
``detect_anomaly`` (anomaly / plain) and ``floor``, with the figures behind them.

Targets (issue 3): record <= 1.10x plain on the transformer, <= 1.25x on the MLP.

``--cost`` isolates the fingerprint/stats work, which a shared machine's noise swamps in
whole steps: it keeps (clones of) every tensor one recorded step fingerprints, then
interleaves, round by round, a plain step with ``begin`` + ``finish_many`` over those
tensors by each path: ``native`` (the one-pass kernel, fingerprint + stats), ``ops`` (the
torch-op fallback used when no kernel can be built) and ``fp_only`` (native, no stats). Printed:
median ms per step, and ``1 + cost / plain`` as the ratio that work alone adds.
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

import mlp as mlp_example  # noqa: E402
import transformer as tf_example  # noqa: E402

from reprobisect.runners import batched_torch  # noqa: E402
from reprobisect.runners.torch import RecordPolicy, TorchRecorder  # noqa: E402
from reprobisect.trace.writer import TraceWriter  # noqa: E402

TARGETS = {"transformer": 1.10, "mlp": 1.25}


def _cycle(loader):
    while True:
        yield from loader


DEVICE = "cpu"


def _sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def build(name: str, quick: bool):
    dev = ["--device", DEVICE]
    if name == "mlp":
        a = mlp_example.parse(["--features", "1024", "--hidden", "1024", "--layers", "4", "--batch-size", "256",
                               "--samples", "2048", "--dropout", "0.1"] + (["--hidden", "256"] if quick else []) + dev)
        model, opt, loader, loss_fn = mlp_example.build(a)

        def step(x, y):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

        stateful = [model, opt]
    else:
        a = tf_example.parse(["--layers", "4", "--d-model", "256", "--seq", "128", "--batch-size", "16",
                              "--vocab", "256", "--samples", "256"] + (["--layers", "1"] if quick else []) + dev)
        model, opt, sched, loader = tf_example.build(a)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(x, y):
            opt.zero_grad()
            loss_fn(model(x).reshape(-1, a.vocab), y.reshape(-1)).backward()
            opt.step()
            sched.step()

        stateful = [model, opt, sched]
    return step, ((x.to(DEVICE), y.to(DEVICE)) for x, y in _cycle(loader)), stateful


def snapshot(stateful: list):
    """A ``reset()`` that puts model, optimizer (and scheduler) and the RNG back to now."""
    saved = [copy.deepcopy(o.state_dict()) for o in stateful]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if DEVICE.startswith("cuda") else None

    def reset() -> None:
        for o, st in zip(stateful, saved):
            o.load_state_dict(copy.deepcopy(st))
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)

    return reset


def _sentinel_policy() -> RecordPolicy | None:
    """The hook for ``--detail sentinel``: its policy when this checkout's recorder has the
    level (a ``detail`` field on ``RecordPolicy``), else None and the mode is skipped."""
    try:
        return RecordPolicy(steps=10**9, detail="sentinel")  # type: ignore[call-arg]
    except TypeError:
        return None


def _copy_seconds(nbytes: int, repeats: int = 7) -> float:
    """Median time of one copy of ``nbytes`` on the benchmark's device (memcpy on CPU,
    device-to-device on a GPU)."""
    n = max(1, nbytes // 4)
    src = torch.randn(n, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _record_bytes(rec: TorchRecorder) -> tuple[int, int]:
    """(bytes, tensors) the current step's records read: every distinct pending once."""
    seen: dict[int, int] = {}
    for e in rec._entries:
        for q in [e.pending, *(e.inputs or ())]:
            if q is not None:
                seen[id(q)] = q.nbytes
    for q in rec.observers["gradients"].pre_clip:  # the gradient observer's step state
        if not isinstance(q, torch.Tensor):
            seen[id(q)] = q.nbytes
    return sum(seen.values()), len(seen)


def run_steps(step, data, n: int, cpu: list[float] | None = None) -> list[float]:
    times = []
    for _ in range(n):
        _sync()
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = next(data)
        step(x, y)
        _sync()
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return times


def bench(name: str, rounds: int, steps: int, quick: bool, tmp: Path) -> dict:
    step, data, stateful = build(name, quick)
    run_steps(step, data, 3)  # warm-up
    # every mode runs the same steps from the same state: the MLP's step time moves 10x
    # from step to step once subnormal floats appear (after its first epoch here), so modes
    # timed on different steps are not comparable
    batches = [next(data) for _ in range(steps + 1)]
    reset = snapshot(stateful)
    from reprobisect import native

    kernel = native.kernel
    times: dict[str, list[float]] = {"plain": [], "record": [], "fp_only": [], "record_ops": [],
                                     "no_optim_state": [], "anomaly": []}
    if DEVICE == "cpu":
        times["record_batched"] = []
    sentinel = _sentinel_policy()
    if sentinel is not None:
        times["sentinel"] = []
    orig_add_many = TorchRecorder._add_many

    def add_no_state(self, items):  # the experiment: optimizer state not recorded
        return orig_add_many(self, [it for it in items if it[0] != "optim_state"])
    cpu: dict[str, list[float]] = {m: [] for m in times}
    per_round: dict[str, list[list[float]]] = {m: [] for m in times}  # each round's samples, for paired figures
    floor_info = _measure_records(step, batches, reset, tmp / f"{name}-measure")
    modes = list(times)
    for r in range(rounds):
        for mode in modes[r % len(modes):] + modes[: r % len(modes)]:  # rotate: no mode always first
            reset()
            if mode in ("record", "fp_only", "record_ops", "no_optim_state", "record_batched", "sentinel"):
                native.kernel = kernel if mode != "record_ops" else (lambda: None)
                TorchRecorder._add_many = add_no_state if mode == "no_optim_state" else orig_add_many
                batched_torch.force(True if mode == "record_batched" else None)
                writer = TraceWriter(tmp / f"{name}-{mode}-{r}", command=["bench"], policy={})
                policy = sentinel if mode == "sentinel" else RecordPolicy(steps=10**9, stats=mode != "fp_only")
                rec = TorchRecorder(writer, policy).install()
                run_steps(step, iter(batches), 1)  # the recorder's first step learns names and hooks
                try:
                    per_round[mode].append(run_steps(step, iter(batches[1:]), steps, cpu[mode]))
                finally:
                    rec.remove()
                    writer.close()
                    native.kernel = kernel
                    TorchRecorder._add_many = orig_add_many
                    batched_torch.force(None)
            elif mode == "anomaly":
                run_steps(step, iter(batches), 1)
                with torch.autograd.detect_anomaly(check_nan=True):
                    per_round[mode].append(run_steps(step, iter(batches[1:]), steps, cpu[mode]))
            else:
                run_steps(step, iter(batches), 1)
                per_round[mode].append(run_steps(step, iter(batches[1:]), steps, cpu[mode]))
            times[mode] += per_round[mode][-1]
    med = {m: statistics.median(v) for m, v in times.items()}
    cmed = {m: statistics.median(v) for m, v in cpu.items()}
    nbytes, tensors = floor_info.get("bytes", 0), floor_info.get("tensors", 0)
    copy_s = _copy_seconds(nbytes)
    floor_s = copy_s  # reading the records' bytes once, at the speed of a copy of as many bytes
    ratio = {m: tuple(round(x, 3) for x in _paired(per_round[m], per_round["plain"], lambda a, p: a / p)) for m in times}
    added = _paired(per_round["record"], per_round["plain"], lambda a, p: a - p)
    bound = 1.5 * floor_s + 15e-6 * tensors
    return {
        "full": ratio["record"][0],
        "sentinel": ratio["sentinel"][0] if "sentinel" in ratio else None,
        "detect_anomaly": ratio["anomaly"][0],
        "floor": round(added[0] / floor_s, 3) if floor_s > 0 else None,
        "floor_spread": [round(a / floor_s, 3) for a in added[1:]] if floor_s > 0 else None,
        "floor_s": round(floor_s, 6),
        "added_s": round(added[0], 6),
        "bound_s": round(bound, 6),
        "record_bytes": nbytes,
        "record_tensors": tensors,
        "memcpy_gbps": round(nbytes / copy_s / 1e9, 2) if copy_s > 0 else None,
        "excess_us_per_tensor": round((added[0] - floor_s) / tensors * 1e6, 2) if tensors else None,
        "meets_floor_bound": _verdict(added, bound),
        "cpu_ratio": {m: round(v / cmed["plain"], 3) for m, v in cmed.items()},
        "model": name,
        "median_step_s": {m: round(v, 5) for m, v in med.items()},
        "ratio": {m: r[0] for m, r in ratio.items()},
        "ratio_spread": {m: list(r[1:]) for m, r in ratio.items()},
        "target": TARGETS[name],
        "meets_target": _verdict(ratio["record"], TARGETS[name]),
        "samples_per_mode": len(times["plain"]),
        "rounds": len(per_round["plain"]),
    }


def _paired(mode: list[list[float]], plain: list[list[float]], fn) -> tuple[float, float, float]:
    """``fn(mode, plain)`` of each round's medians, the two modes timed minutes apart at most
    (a shared machine's speed drifts more than that between rounds): the median over rounds,
    and the lower and upper quartiles (the middle half of the rounds)."""
    per = sorted(fn(statistics.median(a), statistics.median(p)) for a, p in zip(mode, plain))
    if len(per) < 2:
        return (round(per[0], 6),) * 3 if per else (float("nan"),) * 3
    q1, _, q3 = statistics.quantiles(per, n=4, method="inclusive")
    return round(statistics.median(per), 6), round(q1, 6), round(q3, 6)


def _verdict(figure: tuple[float, float, float], limit: float) -> bool | None:
    """Whether a paired figure is at most ``limit``: True or False when the middle half of the
    rounds agrees, None (inconclusive: the machine's noise is larger than the margin) when
    it straddles the limit."""
    _, lo, hi = figure
    if hi <= limit:
        return True
    if lo > limit:
        return False
    return None


def _measure_records(step, batches, reset, path: Path) -> dict[str, int]:
    """The bytes and tensors of one recorded step's records (the second: no ``init``)."""
    reset()
    into: dict[str, int] = {}
    writer = TraceWriter(path, command=["bench"], policy={})
    rec = TorchRecorder(writer, RecordPolicy(steps=10**9)).install()
    end_step = rec._end_step

    def end(opt):
        if rec.step == 1:
            into["bytes"], into["tensors"] = _record_bytes(rec)
        end_step(opt)

    rec._end_step = end  # type: ignore[method-assign]
    try:
        run_steps(step, iter(batches), 2)
    finally:
        rec.remove()
        writer.close()
    return into


def throughput(sizes_mib: list[int], repeats: int = 5) -> list[dict]:
    """Fingerprint (+ stats) throughput of one large float32 tensor, per path, as a fraction
    of a same-run copy of the same bytes on the device (1.0: as fast as the copy)."""
    from reprobisect.runners import fingerprint_torch as fpt

    out = []
    for mib in sizes_mib:
        t = torch.randn(mib << 18, device=DEVICE)
        copy_s = _copy_seconds(t.numel() * 4, repeats)
        row: dict = {"mib": mib, "copy_s": round(copy_s, 6)}
        paths = {"per_tensor": lambda s, t=t: fpt.finish_many([fpt.begin(t, with_stats=s)]),
                 "batched": lambda s, t=t: fpt.finish_many(batched_torch.begin_many([t], with_stats=s))}
        batched_torch.force(True)
        if batched_torch.fused_ok(t.device, t.dtype):  # the Triton kernel over the tensor's own bytes
            paths["kernel"] = lambda s, t=t: fpt.finish_many([batched_torch.begin(t, with_stats=s)])
        row["kernel_status"] = batched_torch.fused_status().get(f"{t.device} float32")
        try:
            for path, fn in paths.items():
                for stats in (False, True):
                    fn(stats)  # warm-up: weights, layouts
                    times = []
                    for _ in range(repeats):
                        _sync()
                        t0 = time.perf_counter()
                        fn(stats)
                        _sync()
                        times.append(time.perf_counter() - t0)
                    key = path + ("_stats" if stats else "")
                    row[key] = round(copy_s / statistics.median(times), 3)
        finally:
            batched_torch.force(None)
        out.append(row)
        del t
    return out


def cost(name: str, rounds: int, quick: bool, tmp: Path) -> dict:
    from reprobisect.runners import fingerprint_torch as fpt

    step, data, _ = build(name, quick)
    run_steps(step, data, 2)
    writer = TraceWriter(tmp / f"{name}-cost", command=["bench"], policy={})
    rec = TorchRecorder(writer, RecordPolicy(steps=10**9, stats=True)).install()
    kept: list[torch.Tensor] = []
    begin, begin_many = fpt.begin, fpt.begin_many

    # the recorder keeps no tensor once begun: clone each one as it is begun, in one step
    def keep_one(t, with_stats=True):
        kept.append(t.detach().clone())
        return begin(t, with_stats=with_stats)

    def keep_many(ts, with_stats=True):
        kept.extend(t.detach().clone() for t in ts)
        return begin_many(ts, with_stats=with_stats)

    try:
        run_steps(step, data, 1)  # learns names and hooks
        fpt.begin, fpt.begin_many = keep_one, keep_many
        try:
            run_steps(step, data, 1)
        finally:
            fpt.begin, fpt.begin_many = begin, begin_many
    finally:
        rec.remove()
        writer.close()
    from reprobisect import native

    kernel = native.kernel

    def work(stats: bool, use_native: bool) -> float:
        native.kernel = kernel if use_native else (lambda: None)
        try:
            t0 = time.perf_counter()
            fpt.finish_many([fpt.begin(t, with_stats=stats) for t in kept])
            return time.perf_counter() - t0
        finally:
            native.kernel = kernel

    times: dict[str, list[float]] = {"plain": [], "native": [], "ops": [], "fp_only": []}
    for _ in range(rounds):
        times["plain"] += run_steps(step, data, 1)
        times["native"].append(work(True, True))
        times["ops"].append(work(True, False))
        times["fp_only"].append(work(False, True))
    med = {m: statistics.median(v) for m, v in times.items()}
    return {
        "model": name,
        "tensors": len(kept),
        "elements": sum(t.numel() for t in kept),
        "median_s": {m: round(v, 5) for m, v in med.items()},
        "ratio": {m: round(1 + v / med["plain"], 3) for m, v in med.items() if m != "plain"},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4, help="steps per mode per round")
    p.add_argument("--quick", action="store_true", help="smaller models (a smoke run, not the figures)")
    p.add_argument("--models", default="transformer,mlp")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:n]: where the models train")
    p.add_argument("--cost", action="store_true", help="time only the fingerprint/stats work of one step's tensors, by path")
    p.add_argument("--throughput", action="store_true",
                   help="fingerprint throughput of large tensors as a fraction of a same-run copy of the same bytes")
    p.add_argument("--sizes-mib", default=None, help="tensor sizes for --throughput (default 64,256 on a GPU, 16,64 on CPU)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if args.throughput:
        sizes = args.sizes_mib or ("16,64" if DEVICE == "cpu" else "64,256")
        res = throughput([int(s) for s in sizes.split(",")])
        print(json.dumps({"device": DEVICE, "threads": torch.get_num_threads(), "fraction_of_copy": res}, indent=1))
        return 0
    if args.cost:
        with tempfile.TemporaryDirectory() as tmp:
            res = [cost(n, max(args.rounds, 5), args.quick, Path(tmp)) for n in args.models.split(",")]
        if args.json:
            print(json.dumps({"threads": torch.get_num_threads(), "results": res}, indent=1))
            return 0
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; fingerprint/stats work of one step, medians")
        for r in res:
            m, x = r["median_s"], r["ratio"]
            print(f"{r['model']:<12}{r['tensors']} tensors, {r['elements'] / 1e6:.1f}M elements: plain step {m['plain'] * 1e3:.1f} ms; "
                  + ", ".join(f"{k} {m[k] * 1e3:.1f} ms ({x[k]:.3f}x)" for k in ("native", "ops", "fp_only")))
        return 0
    import warnings

    warnings.filterwarnings("ignore", message=".*Anomaly Detection.*")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            results.append(bench(name, args.rounds, args.steps, args.quick, Path(tmp)))
    if args.json:
        out = {"device": args.device, "threads": torch.get_num_threads(), "torch": torch.__version__,
               "triton_kernel": batched_torch.fused_status()}  # per device and dtype: "on", or why not
        out.update({r["model"]: r for r in results})
        print(json.dumps(out, indent=1))
        return 0
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads; medians of {results[0]['samples_per_mode']} "
          f"steps per mode; ratios are medians over {results[0]['rounds']} rounds of each round's own ratio")
    print(f"{'model':<12}{'plain ms':>10}{'record ms':>11}{'fp-only ms':>12}{'anomaly ms':>12}"
          f"{'record x':>10}{'fp-only x':>11}{'rec-ops x':>11}{'no-state x':>11}{'anomaly x':>11}  target (record)")
    for r in results:
        m, x = r["median_step_s"], r["ratio"]
        ok = _say(r["meets_target"], "ok")
        print(f"{r['model']:<12}{m['plain'] * 1e3:>10.1f}{m['record'] * 1e3:>11.1f}{m['fp_only'] * 1e3:>12.1f}"
              f"{m['anomaly'] * 1e3:>12.1f}{x['record']:>10.3f}{x['fp_only']:>11.3f}{x['record_ops']:>11.3f}"
              f"{x['no_optim_state']:>11.3f}{x['anomaly']:>11.3f}"
              f"  <= {r['target']:.2f} {ok}")
        c = r["cpu_ratio"]
        print(f"{'':<12}{'(process CPU time ratios)':>45}{c['record']:>10.3f}{c['fp_only']:>11.3f}{c['record_ops']:>11.3f}"
              f"{c['no_optim_state']:>11.3f}{c['anomaly']:>11.3f}")
        extra = f"; record_batched {x['record_batched']:.3f}x" if "record_batched" in x else ""
        extra += f"; sentinel {x['sentinel']:.3f}x" if "sentinel" in x else "; sentinel: no such level here"
        print(f"{'':<12}floor: {r['record_tensors']} tensors, {r['record_bytes'] / 1e6:.1f} MB read, "
              f"copy {r['memcpy_gbps']} GB/s -> floor {r['floor_s'] * 1e3:.2f} ms; record adds {r['added_s'] * 1e3:.2f} ms = "
              f"{r['floor']}x floor (middle half of the rounds {r['floor_spread'][0]}-{r['floor_spread'][1]}x), "
              f"{r['excess_us_per_tensor']} us/tensor over it; bound {r['bound_s'] * 1e3:.2f} ms "
              f"{_say(r['meets_floor_bound'], 'met')}{extra}")
    return 0


def _say(verdict: bool | None, yes: str) -> str:
    return yes if verdict else ("MISSED" if verdict is False else "inconclusive (noise larger than the margin)")


if __name__ == "__main__":
    sys.exit(main())
