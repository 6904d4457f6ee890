"""The Ray executor's settings: ``RayConfig``, the flags that fill it, the pair placements.

Imported when ``reprobisect.executors`` registers the executor, so it holds no Ray and
nothing heavy: the values are checked here (``--gpus-per-probe`` whole above 1, a known
placement) before any cluster is reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reprobisect.core.checks import check_number
from reprobisect.errors import UsageError
from reprobisect.executors.flags import ExecutorFlag

__all__ = ["RayConfig", "RAY_FLAGS", "PLACEMENTS"]

PLACEMENTS = {"pack": "STRICT_PACK", "spread": "STRICT_SPREAD"}
"""Pair placements and the Ray placement-group strategy each one uses."""


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """The Ray executor's own settings: what ``--executor ray`` adds to the shared options."""

    address: str | None = None
    """Ray cluster address (None: start a local instance; 'auto'; 'ray://HOST:PORT')."""
    gpus_per_probe: float = 0.0
    """GPUs each probe requests from Ray, all on one node (a whole number above 1); the
    probe's command sees exactly those (``CUDA_VISIBLE_DEVICES``)."""
    cpus_per_probe: float = 1.0
    """CPUs each probe requests from Ray."""
    placement: str | None = None
    """How paired probes (repro, envs) are placed: 'pack' (one node, the same device type) or
    'spread' (two nodes, on purpose); None: pack."""

    def __post_init__(self) -> None:
        check_number("--gpus-per-probe", self.gpus_per_probe, minimum=0)
        check_number("--cpus-per-probe", self.cpus_per_probe, minimum=0)
        _check_whole_gpus(self.gpus_per_probe)
        if self.placement is not None and self.placement not in PLACEMENTS:
            raise UsageError(f"unknown placement '{self.placement}'; use --placement pack or --placement spread")

    def executor_kwargs(self, timeout: float | None = None) -> dict[str, Any]:
        """``RayExecutor``'s keywords for these settings (and the probes' ``timeout``, if any)."""
        kw: dict[str, Any] = {"address": self.address, "gpus_per_probe": self.gpus_per_probe,
                              "cpus_per_probe": self.cpus_per_probe, "placement": self.placement}
        if timeout is not None:
            kw["timeout"] = timeout
        return kw

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "gpus_per_probe": self.gpus_per_probe,
                "cpus_per_probe": self.cpus_per_probe, "placement": self.placement}


RAY_FLAGS = (
    ExecutorFlag("address", "--address", "str", "Ray cluster address (--executor ray).", keys=("ray_address",)),
    ExecutorFlag("gpus_per_probe", "--gpus-per-probe", "number",
                 "GPUs per probe, all on one node; the command sees exactly those (CUDA_VISIBLE_DEVICES) and "
                 "gets its own rendezvous port (--executor ray)."),
    ExecutorFlag("cpus_per_probe", "--cpus-per-probe", "number", "CPUs per probe (--executor ray)."),
    ExecutorFlag("placement", "--placement", "choice",
                 "Paired probes on Ray: one node (pack) or two (spread) [default: pack].", choices=tuple(PLACEMENTS)),
)
"""The flags (and config-file keys) that fill a ``RayConfig``; registered in ``reprobisect.executors``."""


def _check_whole_gpus(gpus: float) -> None:
    """Ray gives a task a fraction of one GPU or whole GPUs, nothing in between."""
    if gpus > 1 and not float(gpus).is_integer():
        raise UsageError(f"--gpus-per-probe must be a whole number above 1 (got {gpus:g}); "
                         "Ray shares one GPU between probes (e.g. 0.5) or gives whole GPUs")
