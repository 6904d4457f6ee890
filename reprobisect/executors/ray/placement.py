"""What places probes: the resources each asks for, whether the cluster can hold one, pairs.

* **Multi-GPU probes.** ``gpus_per_probe=N`` (``--gpus-per-probe N``) is one resource request
  of N GPUs: Ray places a task on exactly one node, so all N GPUs of a probe are on one node
  (a pair's side is one placement-group bundle ``{"CPU": c, "GPU": N}``, the same thing).
  N above 1 must be whole (Ray's rule); a request no node can hold is refused when the
  executor starts (``capacity``), never queued.
* **Pairs** (``repro``/``envs``): ``submit_pair(a, b, placement='pack'|'spread')`` reserves a
  placement group (STRICT_PACK: same node, so the same device type; STRICT_SPREAD: two
  nodes on purpose); a placement the cluster cannot satisfy within ``placement_timeout``
  fails both futures with a ``ProbeError`` that says what was asked
  (``placement_message``). Each result records its node's device type
  (``accelerator_type``).
"""

from __future__ import annotations

import math
from typing import Any

from reprobisect.errors import ProbeError
from reprobisect.executors.ray.config import PLACEMENTS

__all__: list[str] = []


def probe_resources(cpus: float, gpus: float, resources: dict[str, float]) -> dict[str, float]:
    """What one probe asks Ray for (only the resources it needs some of)."""
    need = {"CPU": cpus, "GPU": gpus, **resources}
    return {k: v for k, v in need.items() if v > 0}


def capacity(nodes: list[dict[str, Any]], need: dict[str, float]) -> int:
    """How many probes needing ``need`` the alive ``nodes`` hold at once; a request no node
    can hold is a ``ProbeError`` naming what was asked and the largest node."""
    fits = 0
    for n in nodes:
        res = n.get("Resources", {})
        per_node = min((math.floor(res.get(k, 0) / v + 1e-9) for k, v in need.items()), default=64)
        fits += per_node
    if fits == 0:
        best = {k: max((n.get("Resources", {}).get(k, 0) for n in nodes), default=0) for k in need}
        asked = ", ".join(f"{v:g} {k}" for k, v in need.items())
        has = ", ".join(f"{v:g} {k}" for k, v in best.items())
        raise ProbeError(
            f"no node of the Ray cluster can run a probe that needs {asked} (the largest node has {has}); "
            "lower --gpus-per-probe/--cpus-per-probe or add nodes with those resources"
        )
    return fits


def accelerator_type(nodes: list[dict[str, Any]], node_id: str) -> str:
    """The GPU node's accelerator type (its ``accelerator_type:*`` resource), else ``GPU``."""
    label = ""
    for n in nodes:
        if n.get("NodeID") == node_id:
            label = next((k.split(":", 1)[1] for k in n.get("Resources", {}) if k.startswith("accelerator_type:")), "")
    return label or "GPU"


def pair_group(need: dict[str, float], placement: str) -> Any:
    """A placement group of two bundles of ``need`` placed as ``placement`` asks (pack, spread)."""
    from ray.util import placement_group

    bundle = dict(need) or {"CPU": 0.001}
    return placement_group([dict(bundle), dict(bundle)], strategy=PLACEMENTS[placement])


def remove_group(pg: Any) -> None:
    """Give a pair's placement group back (already gone: nothing to do)."""
    from ray.util import remove_placement_group

    try:
        remove_placement_group(pg)
    except Exception:
        pass


def placement_message(keys: tuple[str, str], placement: str, need: dict[str, float], timeout: float) -> str:
    """Why a pair could not be placed within ``timeout`` seconds, and what to change."""
    asked = ", ".join(f"{v:g} {k}" for k, v in need.items() if v > 0)
    where = "one node" if placement == "pack" else "two different nodes"
    fix = (
        "pair them with placement 'spread', or ask for fewer resources per probe"
        if placement == "pack"
        else "pair them with placement 'pack', or add nodes"
    )
    return (
        f"cannot place the pair '{keys[0]}' / '{keys[1]}' ({placement}: "
        f"{PLACEMENTS[placement]}, 2 x [{asked}] on {where}) within {timeout:g} s; "
        f"the cluster has no room for it: {fix}"
    )
