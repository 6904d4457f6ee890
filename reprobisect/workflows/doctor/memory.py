"""``memory``: steady growth (retained graphs) against spikes on large inputs.

Read from one run recorded with the recorder's ``memory`` switch (``runners.memory_torch``:
per step ``scalars["memory"]``: the batch's shapes and element count, the bytes the
forward saved for backward, saved bytes still alive after backward, loss tensors of
earlier steps still alive with their graph, RSS, and on CUDA the allocated, reserved and
peak bytes). In the guide's terms:

- growth: the losses of earlier steps keep their graphs alive (``losses.append(loss)``, or a
  running total ``total = total + loss`` that holds the graphs without the loss tensors),
  saved activations pile up step after step (a graph kept with ``retain_graph`` or a forward
  with gradients that never goes through backward), or CUDA memory after the step rises at
  every step;
- a spike: one step's activation memory (CUDA peak when there is one) at least twice the
  median, on a batch with at least 1.5 times the median elements (variable-size input).
"""

from __future__ import annotations

import statistics
from typing import Any

from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.model import Finding

__all__ = ["check_memory"]

_NEXT_GROWTH = ("keep numbers, not tensors: losses.append(loss.item()) or loss.detach(); run evaluation under "
                "torch.no_grad()/inference_mode(); drop retain_graph=True unless a second backward needs it")


def _kib(n: Any) -> Any:
    return round(n / 1024.0, 1) if isinstance(n, (int, float)) else n


def _rising(xs: list[float]) -> bool:
    """Non-decreasing and up at least at half the steps, in all by more than the first value's 1 %."""
    ups = sum(1 for a, b in zip(xs, xs[1:]) if b > a)
    return (len(xs) >= 3 and all(b >= a for a, b in zip(xs, xs[1:])) and ups >= (len(xs) - 1) / 2
            and xs[-1] - xs[0] > max(1.0, 0.01 * abs(xs[0])))


def check_memory(trace: Trace) -> list[Finding]:
    """The ``memory`` findings of one recorded run, or one ``info``."""
    ms = [(s.step, s.scalars["memory"]) for s in trace.steps if isinstance(s.scalars.get("memory"), dict)]
    if not ms:
        return [Finding("memory", "info", "inconclusive: the run recorded no memory figures (the recorder's memory "
                        "switch is PyTorch only)", {"steps": len(trace.steps)}, "")]
    steps = [k for k, _ in ms]
    table = {"step": steps,
             "batch_elements": [m.get("batch_elements") for _, m in ms],
             "saved_kib": [_kib(m.get("saved_bytes")) for _, m in ms],
             "alive_after_step_kib": [_kib(m.get("saved_alive_bytes")) for _, m in ms],
             "retained_losses": [m.get("retained_losses") for _, m in ms],
             "rss_mib": [round(m["rss_bytes"] / 2**20, 1) if m.get("rss_bytes") else None for _, m in ms]}
    cuda = [m.get("cuda_allocated") for _, m in ms]
    if all(isinstance(c, int) for c in cuda):
        table["cuda_allocated_mib"] = [round(c / 2**20, 2) for c in cuda]
        table["cuda_peak_mib"] = [round((m.get("cuda_peak") or 0) / 2**20, 2) for _, m in ms]
    retained = [int(m.get("retained_losses") or 0) for _, m in ms]
    if len(ms) >= 3 and retained[-1] >= len(ms) - 2 and all(b >= a for a, b in zip(retained, retained[1:])):
        return [Finding("memory", "warning",
                        f"steady growth from retained graphs: after step {steps[-1]} the losses of {retained[-1]} "
                        "earlier step(s) still hold their autograd graphs (loss tensors kept in a list, "
                        "losses.append(loss), or summed into a running total, total = total + loss): memory grows "
                        "every step until it runs out",
                        {"retained_losses_after_last_step": retained[-1], "table": table}, _NEXT_GROWTH)]
    alive = [float(m.get("saved_alive_bytes") or 0) for _, m in ms]
    if _rising(alive[1:] if len(alive) > 3 else alive):
        return [Finding("memory", "warning",
                        f"steady growth: tensors saved for backward stay alive after the step and pile up "
                        f"({_kib(alive[0])} KiB after step {steps[0]}, {_kib(alive[-1])} KiB after step {steps[-1]}): "
                        "graphs are kept (retain_graph=True, or forwards with gradients whose loss never goes "
                        "through backward)", {"alive_after_step_kib": [_kib(a) for a in alive], "table": table}, _NEXT_GROWTH)]
    if "cuda_allocated_mib" in table and _rising([float(c) for c in cuda][1:]):
        return [Finding("memory", "warning", f"steady growth: CUDA memory allocated after the step rises at every step "
                        f"({table['cuda_allocated_mib'][1]} to {table['cuda_allocated_mib'][-1]} MiB)", {"table": table},
                        _NEXT_GROWTH + "; look for tensors kept across steps (lists, caches, running totals)")]
    peak_key = "cuda_peak" if "cuda_allocated_mib" in table else "saved_bytes"
    peaks = [float(m.get(peak_key) or 0) for _, m in ms]
    sizes = [float(m.get("batch_elements") or 0) for _, m in ms]
    mp, msz = statistics.median(peaks), statistics.median(sizes)
    spikes = [i for i, p in enumerate(peaks) if mp > 0 and p >= 2 * mp and msz > 0 and sizes[i] >= 1.5 * msz]
    if spikes:
        i = max(spikes, key=lambda j: peaks[j])
        ev = {"step": steps[i], "batch_shapes": ms[i][1].get("batch_shapes"),
              "batch_elements": int(sizes[i]), "median_batch_elements": msz,
              f"{peak_key}_kib": _kib(peaks[i]), f"median_{peak_key}_kib": _kib(mp), "spike_steps": [steps[j] for j in spikes],
              "table": table}
        return [Finding("memory", "warning",
                        f"memory spikes on large inputs, not steady growth: step {steps[i]}'s batch has "
                        f"{sizes[i] / msz:.1f}x the median elements and its step needs {peaks[i] / mp:.1f}x the median "
                        "memory; such a batch is where an out-of-memory error comes from", ev,
                        "cap or bucket variable lengths/sizes (sort by length, a max length), or use a smaller "
                        "micro-batch with gradient accumulation; mixed precision and activation checkpointing lower "
                        "the peak")]
    return [Finding("memory", "info", f"memory steady over {len(ms)} step(s): no retained graphs, no spike on a large "
                    "batch", {"table": table}, "")]
