"""``RayExecutor``: probes as Ray tasks on a cluster (or a local Ray instance).

The class a user (or ``reprobisect.executors.make_executor``) makes: it connects to (or
starts) Ray, refuses a probe no node can hold, queues probes and pairs (``_TaskPump``,
``reprobisect.executors.ray.tasks``), fetches trace files left on the workers, and on
``close`` cancels what still runs, cleans the workers' folders and stops a Ray it started.
Ray is imported inside methods only.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from reprobisect.core.outcome import Outcome
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.errors import ProbeError, TraceError, UsageError
from reprobisect.executors.ray.cluster import _init_ray, _require_ray
from reprobisect.executors.ray.config import PLACEMENTS, _check_whole_gpus
from reprobisect.executors.ray.placement import accelerator_type, capacity
from reprobisect.executors.ray.result import RayProbeResult
from reprobisect.executors.ray.tasks import _Job, _Running, _TaskPump
from reprobisect.executors.ray.traces import _lazy_trace, _read_file
from reprobisect.executors.ray.worker import _probe_task, _remove_session
from reprobisect.support.interrupt import make_temp_dir
from reprobisect.trace.reader import Trace, read_trace

__all__ = ["RayExecutor"]


class RayExecutor(_TaskPump):
    """Runs probes as Ray tasks; implements the ``Executor`` protocol (plus pairs and fetch).

    ``address``: None starts a local Ray instance (no dashboard; ``num_cpus``,
    ``temp_dir``) that ``close()`` shuts down; ``'auto'`` or ``'ray://HOST:PORT'`` joins
    an existing cluster (left running). ``gpus_per_probe``/``cpus_per_probe``/
    ``resources``: what each probe task requests. ``max_parallel`` (alias ``jobs``):
    probes in flight at once, capped by what the cluster can hold. ``max_retries``:
    Ray's retries of a probe whose worker or node died. ``placement``: the default for
    ``submit_pair``. ``runtime_env``: the default Ray runtime_env of every probe.
    ``timeout``: per-probe seconds when a spec has none; ``max_probe_s``: deadline of a
    probe without any timeout; ``start_grace_s``: extra seconds the controller allows
    for queueing, worker start and code unpacking before it cancels a task.
    ``placement_timeout``: seconds to wait for a pair's placement group.
    ``connect_timeout``: seconds to reach ``HOST:PORT`` of an address before giving up
    (Ray itself would retry for minutes).
    ``eager_bytes``: trace bytes copied back with each result (the rest stays on the
    worker until fetched). ``shared_fs``: run specs without a revision in their
    ``workdir`` path on the worker instead of shipping the folder. ``out_dir``/``keep``:
    as for the local executor. ``runner``: replaces ``reprobisect.executors.process.run_in_dir``
    on the workers (tests, custom probes; must be picklable).
    """

    name = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        gpus_per_probe: float = 0,
        cpus_per_probe: float = 1,
        max_parallel: int | None = None,
        jobs: int | None = None,
        max_retries: int = 2,
        placement: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        resources: dict[str, float] | None = None,
        timeout: float | None = None,
        max_probe_s: float = 6 * 3600.0,
        start_grace_s: float = 120.0,
        placement_timeout: float = 60.0,
        fetch_timeout: float = 300.0,
        connect_timeout: float = 15.0,
        eager_bytes: int = 64 << 20,
        max_ship_bytes: int = 256 << 20,
        shared_fs: bool = False,
        out_dir: str | os.PathLike | None = None,
        keep: bool = False,
        num_cpus: int | None = None,
        temp_dir: str | None = None,
        runner: Callable[[ProbeSpec, Path, Path], ProbeResult] | None = None,
    ) -> None:
        """Connect to (or start) Ray and get ready to run probes (arguments: the class docstring)."""
        if placement is not None and placement not in PLACEMENTS:
            raise UsageError(f"unknown placement '{placement}'; use pack or spread")
        if gpus_per_probe < 0 or cpus_per_probe < 0:
            raise UsageError("--gpus-per-probe and --cpus-per-probe must be >= 0")
        _check_whole_gpus(float(gpus_per_probe))
        ray = _require_ray()
        self.address = address
        self.gpus_per_probe = float(gpus_per_probe)
        self.cpus_per_probe = float(cpus_per_probe)
        self.resources = dict(resources or {})
        self.max_retries = int(max_retries)
        self.placement = placement
        self.runtime_env = runtime_env
        self.timeout = timeout
        self.max_probe_s = max_probe_s
        self.start_grace_s = start_grace_s
        self.placement_timeout = placement_timeout
        self.fetch_timeout = fetch_timeout
        self.eager_bytes = int(eager_bytes)
        self.max_ship_bytes = int(max_ship_bytes)
        self.shared_fs = shared_fs
        self.keep = keep
        self._runner = runner
        self._session = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        self._own_out = out_dir is None
        # marked as this process's when temporary: a SIGKILL'd session's folder is cleaned by the next start
        self.out_dir = Path(out_dir) if out_dir else make_temp_dir("reprobisect-ray-traces-")
        self.out_dir.mkdir(parents=True, exist_ok=True)

        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            _init_ray(ray, address, num_cpus=num_cpus, temp_dir=temp_dir, connect_timeout=connect_timeout)
        capacity = self._check_feasible()
        want = max_parallel if max_parallel is not None else (jobs if jobs is not None else capacity)
        if want < 1:
            raise UsageError(f"--jobs must be at least 1 (got {want})")
        self.max_parallel = max(1, min(int(want), capacity))
        self._start(ray)

    def _start(self, ray: Any) -> None:
        """Declare the remote functions and start the thread that feeds probes to Ray."""
        self._probe = ray.remote(max_calls=1)(_probe_task)
        self._reader = ray.remote(_read_file)
        self._cleaner = ray.remote(_remove_session)
        self._archives: dict[tuple[str, str], Any] = {}
        self._queue: deque[_Job] = deque()
        self._running: dict[Any, _Running] = {}
        self._placing: list[_Job] = []
        self._nodes_seen: set[str] = set()
        self._accel: dict[str, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._pump_thread = threading.Thread(target=self._pump, name="ray-executor", daemon=True)
        self._pump_thread.start()

    # -- context manager

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- cluster shape

    def _alive_nodes(self) -> list[dict[str, Any]]:
        import ray

        return [n for n in ray.nodes() if n.get("Alive")]

    def _check_feasible(self) -> int:
        """Refuse a request no node can hold; return how many probes the cluster holds at once."""
        return capacity(self._alive_nodes(), self._need())

    def _device_type(self, node_id: str, device: str) -> str:
        if device == "cpu":
            return "cpu"
        if node_id not in self._accel:
            self._accel[node_id] = accelerator_type(self._alive_nodes(), node_id)
        return self._accel[node_id]

    # -- Executor protocol

    def submit(self, spec: ProbeSpec, *, runtime_env: dict[str, Any] | None = None) -> "Future[ProbeResult]":
        """Queue one probe; the future resolves to a ``RayProbeResult`` (never blocks on the probe)."""
        fut: Future = Future()
        self._enqueue(_Job([self._with_timeout(spec)], [fut], [runtime_env or self.runtime_env], None))
        return fut

    def submit_pair(
        self,
        spec_a: ProbeSpec,
        spec_b: ProbeSpec,
        *,
        placement: str | None = None,
        runtime_envs: Sequence[dict[str, Any] | None] = (None, None),
    ) -> "tuple[Future[ProbeResult], Future[ProbeResult]]":
        """Queue two probes placed together (``pack``: one node) or apart (``spread``: two nodes).

        ``placement`` defaults to the executor's, then ``pack``. If the cluster cannot place
        the pair within ``placement_timeout`` seconds both futures fail with ``ProbeError``.
        ``runtime_envs`` gives each side its own Ray runtime_env (``envs``).
        """
        placement = placement or self.placement or "pack"
        if placement not in PLACEMENTS:
            raise UsageError(f"unknown placement '{placement}'; use pack or spread")
        envs = [e or self.runtime_env for e in runtime_envs]
        futs: list[Future] = [Future(), Future()]
        # the placement reaches each trace's environment record (group "probe")
        specs = [replace(s, env={**s.env, "REPROBISECT_PROBE_PLACEMENT": placement}) for s in (spec_a, spec_b)]
        self._enqueue(_Job([self._with_timeout(s) for s in specs], futs, envs, placement))
        return futs[0], futs[1]

    def close(self) -> None:
        """Cancel queued and running probes, release placement groups, clean worker temp
        folders (unless ``keep``), and shut Ray down if this executor started it."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._pump_thread.join(timeout=10)
        import ray

        with self._lock:
            queued, self._queue = list(self._queue), deque()
            placing, self._placing = self._placing, []
            running, self._running = dict(self._running), {}
        for job in queued + placing:
            for f in job.futures:
                f.cancel()
        for job in placing:
            self._release(job)
        for ref, run in running.items():
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
            fut = run.job.futures[run.index]
            if not fut.done():  # a running future cannot be cancelled: it ends as infra, never as bad
                fut.set_result(
                    RayProbeResult(
                        spec=run.spec,
                        outcome=Outcome("infra", detail="the Ray executor was closed while the probe ran; it was cancelled"),
                        placement=run.job.placement,
                    )
                )
            self._release(run.job)
        if not self.keep:
            self._clean_workers()
        self._archives.clear()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        if self._own_out and not self.keep:
            shutil.rmtree(self.out_dir, ignore_errors=True)

    # -- fetching traces

    def fetch(self, result: ProbeResult, relpath: str) -> bytes:
        """The bytes of ``relpath`` inside ``result``'s trace, read on the node that holds it."""
        rel = Path(relpath)
        if rel.is_absolute() or ".." in rel.parts:
            raise UsageError(f"'{relpath}' is not a path inside a trace")
        if result.trace_dir and (Path(result.trace_dir) / rel).is_file():
            return (Path(result.trace_dir) / rel).read_bytes()
        if not isinstance(result, RayProbeResult) or not result.remote_trace_dir or not result.node_id:
            raise TraceError(f"probe '{result.spec.key}' has no trace on the cluster to fetch '{relpath}' from")
        if self._closed:
            raise ProbeError("this Ray executor is closed; fetch trace files before closing it")
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if result.node_id not in {n.get("NodeID") for n in self._alive_nodes()}:
            raise ProbeError(
                f"the node that ran probe '{result.spec.key}' ({result.node_ip}, node {result.node_id[:12]}) "
                f"has left the Ray cluster, and {relpath} of its trace with it; re-run the probe"
            )
        ref = self._reader.options(
            num_cpus=0,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=result.node_id, soft=False),
        ).remote(f"{result.remote_trace_dir}/{rel.as_posix()}")
        try:
            return ray.get(ref, timeout=self.fetch_timeout)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise ProbeError(
                f"reading {relpath} of probe '{result.spec.key}' from node {result.node_ip} took over "
                f"{self.fetch_timeout:g} s; check that node"
            ) from None
        except ray.exceptions.RayTaskError as e:
            raise TraceError(f"cannot read {relpath} of probe '{result.spec.key}' on node {result.node_ip}: {e.cause}") from None
        except ray.exceptions.RayError as e:
            raise ProbeError(
                f"lost the node holding probe '{result.spec.key}' while reading {relpath}: {type(e).__name__}; re-run the probe"
            ) from None

    def pull(self, result: ProbeResult, relpaths: Sequence[str] | None = None) -> Path:
        """Copy trace files still on the worker into ``result.trace_dir`` (all when None)."""
        if not result.trace_dir:
            raise TraceError(f"probe '{result.spec.key}' left no trace ({result.outcome})")
        local = Path(result.trace_dir)
        remote = result.remote_files if isinstance(result, RayProbeResult) else {}
        for rel in relpaths if relpaths is not None else list(remote):
            dest = local / rel
            if dest.is_file():
                continue
            data = self.fetch(result, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}.{threading.get_ident()}")
            tmp.write_bytes(data)
            os.replace(tmp, dest)
        return local

    def open_trace(self, result: ProbeResult, *, allow_incomplete: bool = False) -> "Trace":
        """The result's trace, readable now: steps local, shards pulled on first use.

        With every file local this is ``read_trace`` itself; otherwise the manifest and
        ``steps.jsonl`` are validated here (schema, SHA-256) and ``tensor()`` pulls the
        step's shard from the worker the first time one of its tensors is needed. A trace
        with one shard per rank (``ranks/``) is pulled whole first, then read as a local one.
        """

        if not result.trace_dir:
            raise TraceError(f"probe '{result.spec.key}' left no trace ({result.outcome})")
        local = Path(result.trace_dir)
        remote = result.remote_files if isinstance(result, RayProbeResult) else {}
        missing = [r for r in remote if not (local / r).is_file()]
        if missing and (local / "ranks").is_dir():  # one shard per rank: read it whole, like a local one
            self.pull(result, missing)
            missing = []
        if not missing:
            return read_trace(local, allow_incomplete=allow_incomplete)
        return _lazy_trace(local, allow_incomplete, lambda rel: self.pull(result, [rel]))

    def _clean_workers(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = {n.get("NodeID") for n in self._alive_nodes()}
        refs = [
            self._cleaner.options(
                num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nid, soft=False)
            ).remote(self._session)
            for nid in self._nodes_seen & alive
        ]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=10)
