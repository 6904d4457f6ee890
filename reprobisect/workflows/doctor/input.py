"""``input``: is the run input-bound or compute-bound? Data-fetch time against compute time.

Read from one recorded run: the PyTorch recorder's per-step scalars ``data_wait_s`` (time
inside the ``DataLoader``'s ``__next__``: waiting for the batch), ``compute_s`` (the rest
of the step's wall time, up to the optimizer step, with the device synchronised on CUDA so
that asynchronous kernels count) and ``record_s`` (the recorder's own time, left out of
both). The first step is left out when there are three or more (worker start-up and
first-call costs). Input-bound: the median fetch is at least the median compute and at
least 2 ms per step (below that neither matters for a person's decision).
"""

from __future__ import annotations

import statistics
from typing import Any

from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.model import Finding

__all__ = ["check_input"]

_MIN_FETCH_S = 0.002
"""A fetch below this per step is never called the bottleneck."""


def _ms(x: float) -> float:
    return round(x * 1000.0, 3)


def check_input(trace: Trace) -> list[Finding]:
    """The ``input`` finding of one recorded run: input-bound (warning) or not (info)."""
    timed = [s for s in trace.steps if isinstance(s.scalars.get("data_wait_s"), (int, float))
             and isinstance(s.scalars.get("compute_s"), (int, float))]
    if not timed:
        return [Finding("input", "info", "inconclusive: no step drew its batch from a torch DataLoader, so fetch time "
                        "was not measured (batches built inside the loop count as compute)",
                        {"steps": len(trace.steps)}, "")]
    use = timed[1:] if len(timed) >= 3 else timed
    fetch = statistics.median(float(s.scalars["data_wait_s"]) for s in use)
    compute = statistics.median(float(s.scalars["compute_s"]) for s in use)
    rec = statistics.median(float(s.scalars.get("record_s") or 0.0) for s in use)
    share = fetch / (fetch + compute) if fetch + compute > 0 else 0.0
    cuda = any("cuda_memory_allocated" in s.scalars for s in use)
    ev: dict[str, Any] = {"fetch_ms_per_step": _ms(fetch), "compute_ms_per_step": _ms(compute),
                          "fetch_share": round(share, 3), "steps_timed": [s.step for s in use],
                          "fetch_ms": [_ms(float(s.scalars["data_wait_s"])) for s in use][:12],
                          "compute_ms": [_ms(float(s.scalars["compute_s"])) for s in use][:12],
                          "recorder_ms_per_step": _ms(rec),
                          "device": "cuda (synchronised before each step's time is read)" if cuda else "cpu"}
    if fetch >= compute and fetch >= _MIN_FETCH_S:
        return [Finding("input", "warning",
                        f"input-bound: fetching a batch takes {_ms(fetch):g} ms per step against {_ms(compute):g} ms of "
                        f"compute ({share:.0%} of the step waits for data), so model tuning will not speed it up", ev,
                        "make the input path faster: DataLoader(num_workers=N, persistent_workers=True, "
                        "prefetch_factor=2..4), pin_memory=True with .to(device, non_blocking=True), move slow decoding "
                        "or transforms out of __getitem__ (cache or precompute them); compare with pre-generated "
                        "tensors already on the device")]
    what = "compute-bound" if compute >= fetch else "neither dominates"
    return [Finding("input", "info", f"{what}: fetch {_ms(fetch):g} ms vs compute {_ms(compute):g} ms per step "
                    f"({share:.0%} waiting for data)", ev, "")]
