"""The Ray executor: probes as Ray tasks on a cluster (or a local Ray instance).

The only package of reprobisect that imports Ray, and only inside functions, so that
``import reprobisect`` never pays for it and a machine without Ray never needs it. It is
registered in ``reprobisect.executors`` as ``ray`` (``reprobisect.executors.ray:RayExecutor``,
with ``RayConfig`` and ``RAY_FLAGS``). Its rooms, each with one job:

- ``config``: ``RayConfig``, ``RAY_FLAGS``, ``PLACEMENTS`` (no Ray: read at registration);
- ``ship``: what ships a revision: the commit as a ``git archive`` tar whose header names
  the commit, or the folder itself, put once into the object store;
- ``placement``: what places probes: the resources each asks for, whether any node holds
  one, a pair's placement group (``pack``: one node; ``spread``: two);
- ``worker``: what runs on the worker: unpack, link, run ``run_in_dir`` with the node's
  GPUs and a free rendezvous port, keep the trace on the node;
- ``traces``: which trace files come back with a result, and reading the rest later;
- ``tasks``: what runs and retries probes: the controller's queue and pump, deadlines,
  Ray's failures turned into outcomes, results written locally;
- ``cluster``: reaching Ray (a local instance, or a cluster's address);
- ``executor``: ``RayExecutor`` itself (``submit``, ``submit_pair``, ``fetch``, ``pull``,
  ``open_trace``, ``close``).

How a probe travels: its code as an archive in the object store (``ship``); one fresh
worker process per probe with exactly the GPUs Ray gave it (``worker``); its trace stays
on the worker's disk, the small part copied back (``traces``); a worker or node lost is
retried by Ray, then ``infra``, never ``bad`` (``tasks``). Each result records its node
id, IP, device type and placement (``RayProbeResult``, and ``ray.json`` next to the
local trace).
"""

from __future__ import annotations

from reprobisect.executors.ray.config import PLACEMENTS, RAY_FLAGS, RayConfig
from reprobisect.executors.ray.executor import RayExecutor
from reprobisect.executors.ray.result import RayProbeResult
from reprobisect.executors.ray.ship import archive_commit
from reprobisect.executors.ray.worker import _run_unpacked  # noqa: F401  (the worker's code path, for tests)

__all__ = ["RayExecutor", "RayConfig", "RAY_FLAGS", "RayProbeResult", "PLACEMENTS", "archive_commit"]
