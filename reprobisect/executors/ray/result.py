"""``RayProbeResult``: a probe's result plus where on the cluster it ran.

The node, its device type and GPUs, the rendezvous ports, the pair placement, and which
trace files stayed on the worker (``fetch``/``pull`` bring them); ``ray.json`` next to
the local trace holds the same (``placement_record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reprobisect.core.probe import ProbeResult

__all__ = ["RayProbeResult"]


@dataclass(frozen=True)
class RayProbeResult(ProbeResult):
    """A ``ProbeResult`` plus where on the cluster it ran and which trace files stayed there."""

    node_id: str | None = None
    """Ray node id of the node that ran the probe (``fetch`` pins its reads there)."""
    node_ip: str | None = None
    device_type: str | None = None
    """``cpu``, or the node's accelerator type (``accelerator_type:*`` resource), else ``GPU``."""
    gpu_ids: tuple[str, ...] = ()
    """The GPUs Ray gave the probe (what ``CUDA_VISIBLE_DEVICES`` held)."""
    rendezvous: dict[str, str] = field(default_factory=dict)
    """The rendezvous port variables the probe's command was given on its node (``ports``)."""
    placement: str | None = None
    """``pack`` / ``spread`` for a pair, None for a single probe."""
    remote_trace_dir: str | None = None
    """The trace folder on the worker's disk."""
    remote_files: dict[str, int] = field(default_factory=dict)
    """Trace files (relative path → size) not yet copied to ``trace_dir``."""

    def placement_record(self) -> dict[str, Any]:
        """What ``ray.json`` next to the local trace holds."""
        return {
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "host": self.host,
            "device_type": self.device_type,
            "gpu_ids": list(self.gpu_ids),
            "rendezvous": dict(self.rendezvous),
            "placement": self.placement,
            "remote_trace_dir": self.remote_trace_dir,
            "remote_files": dict(self.remote_files),
        }
