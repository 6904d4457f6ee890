"""What runs probes on Ray and retries them: the controller's queue, its pump, the results.

Probes wait in a queue; a pump thread starts what the cluster holds (``max_parallel``; a
pair once its placement group is ready), collects results, and enforces deadlines. Each
result is made here: the small part of the trace written under ``out_dir`` (temp folder +
rename: an earlier execution's copy is replaced whole), the commit the worker ran checked
against the spec's revision, and where it ran (``RayProbeResult``, ``ray.json``).

Faults: a worker or node lost mid-probe is retried by Ray elsewhere (``max_retries``),
then the probe is outcome ``infra`` (never ``bad``); a probe killed by Ray's memory
monitor is ``infra`` with detail ``out of memory``; the probe's own ``timeout`` is enforced
on the worker (process group killed: outcome ``timeout``) and again by the controller,
which ``ray.cancel(force=True)``s a task that has not answered ``start_grace_s`` later.
Every ``ray.get``/``ray.wait`` has a deadline. Code that cannot be shipped fails its own
probe (``infra`` or the error), never hangs it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from reprobisect.core.outcome import Outcome
from reprobisect.core.probe import ProbeResult, ProbeSpec, trace_path
from reprobisect.errors import ProbeError, ReproError
from reprobisect.executors.process import KILL_GRACE_S
from reprobisect.executors.ray.cluster import _first_line
from reprobisect.executors.ray.placement import pair_group, placement_message, probe_resources, remove_group
from reprobisect.executors.ray.result import RayProbeResult
from reprobisect.executors.ray.ship import payload as ship_payload

__all__: list[str] = []

_POLL_S = 0.1


class _Job:
    """A probe (or a pair of probes) waiting to run or running."""

    def __init__(self, specs: list[ProbeSpec], futures: list[Future], runtime_envs: list[Any], placement: str | None):
        self.specs = specs
        self.futures = futures
        self.runtime_envs = runtime_envs
        self.placement = placement
        self.pg: Any = None
        self.pg_deadline = 0.0
        self.pg_ready: Any = None
        self.pending = len(specs)


@dataclass
class _Running:
    """A probe launched as a Ray task: its job, its side of the job, and the controller's deadline."""

    job: _Job
    index: int
    spec: ProbeSpec
    deadline: float
    cancelled: bool = False


class _TaskPump:
    """The queue-and-pump half of ``RayExecutor`` (a mixin: the executor holds the state).

    It uses the executor's settings (``cpus_per_probe``, ``gpus_per_probe``, ``resources``,
    ``max_retries``, ``max_parallel``, ``timeout``, ``max_probe_s``, ``start_grace_s``,
    ``placement_timeout``, ``eager_bytes``, ``shared_fs``, ``max_ship_bytes``, ``out_dir``)
    and the state ``RayExecutor._start`` makes (``_probe``, ``_archives``, ``_queue``,
    ``_running``, ``_placing``, ``_nodes_seen``, ``_lock``, ``_wake``, ``_closed``); it calls
    back ``pull`` and ``_device_type``.
    """

    def _need(self) -> dict[str, float]:
        """What each probe asks Ray for."""
        return probe_resources(self.cpus_per_probe, self.gpus_per_probe, self.resources)

    def _with_timeout(self, spec: ProbeSpec) -> ProbeSpec:
        if self._closed:
            raise ProbeError("this executor is closed; make a new one")
        if spec.timeout is None and self.timeout is not None:
            spec = replace(spec, timeout=float(self.timeout))
        return spec

    def _enqueue(self, job: _Job) -> None:
        with self._lock:
            self._queue.append(job)
        self._wake.set()

    def _deadline(self, spec: ProbeSpec) -> float:
        budget = spec.timeout + KILL_GRACE_S + self.start_grace_s if spec.timeout else self.max_probe_s
        return time.monotonic() + budget

    def _launch(self, job: _Job, index: int, strategy: Any = None) -> None:
        spec = job.specs[index]
        fut = job.futures[index]
        if not fut.set_running_or_notify_cancel():
            job.pending -= 1
            if job.pending == 0:
                self._release(job)
            return
        try:
            payload = ship_payload(spec, self._archives, shared_fs=self.shared_fs,
                                   max_ship_bytes=self.max_ship_bytes)
        except Exception as e:  # the code could not be shipped: say so on this probe, never hang it
            if isinstance(e, ProbeError):  # e.g. git archive failed: like a failed worktree, infra
                fut.set_result(RayProbeResult(spec=spec, outcome=Outcome("infra", detail=str(e)), placement=job.placement))
            else:
                fut.set_exception(e if isinstance(e, ReproError) else ProbeError(f"cannot ship probe '{spec.key}': {_first_line(e)}"))
            job.pending -= 1
            if job.pending <= 0:
                self._release(job)
            return
        opts: dict[str, Any] = {
            "num_cpus": self.cpus_per_probe,
            "num_gpus": self.gpus_per_probe,
            "max_retries": self.max_retries,
            "retry_exceptions": False,
            "name": f"probe:{spec.key}:a{spec.attempt}",
        }
        if self.resources:
            opts["resources"] = self.resources
        if job.runtime_envs[index]:
            opts["runtime_env"] = job.runtime_envs[index]
        if strategy is not None:
            opts["scheduling_strategy"] = strategy
        ref = self._probe.options(**opts).remote(spec, payload[0], payload[1], self._session, self.eager_bytes, self._runner)
        self._running[ref] = _Running(job, index, spec, self._deadline(spec))

    def _release(self, job: _Job) -> None:
        if job.pg is not None:
            remove_group(job.pg)
            job.pg = None

    def _slots(self) -> int:
        return self.max_parallel - len(self._running) - sum(len(j.specs) for j in self._placing)

    def _pump(self) -> None:
        import ray

        while not self._closed:
            try:
                self._pump_once(ray)
            except Exception as e:  # never let the pump die silently: fail what is waiting
                with self._lock:
                    running = list(self._running.values())
                    self._running.clear()
                for run in running:
                    if not run.job.futures[run.index].done():
                        run.job.futures[run.index].set_exception(
                            ProbeError(f"the Ray executor lost track of probe '{run.spec.key}': {type(e).__name__}: {e}")
                        )
            self._wake.wait(_POLL_S)
            self._wake.clear()

    def _pump_once(self, ray: Any) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # start what fits
        with self._lock:
            while self._queue and (self._slots() >= len(self._queue[0].specs) or (not self._running and not self._placing)):
                job = self._queue.popleft()
                if job.placement is None:
                    self._launch(job, 0)
                else:
                    job.pg = pair_group(self._need(), job.placement)
                    job.pg_ready = job.pg.ready()
                    job.pg_deadline = time.monotonic() + self.placement_timeout
                    self._placing.append(job)
        # placement groups that became ready, or ran out of time
        for job in list(self._placing):
            ready, _ = ray.wait([job.pg_ready], timeout=0)
            if ready:
                with self._lock:
                    self._placing.remove(job)
                    for i in range(2):
                        self._launch(job, i, PlacementGroupSchedulingStrategy(job.pg, placement_group_bundle_index=i))
            elif time.monotonic() > job.pg_deadline:
                with self._lock:
                    self._placing.remove(job)
                self._release(job)
                err = ProbeError(placement_message((job.specs[0].key, job.specs[1].key), job.placement,
                                                   self._need(), self.placement_timeout))
                for f in job.futures:
                    if f.set_running_or_notify_cancel():
                        f.set_exception(err)
        # results
        with self._lock:
            refs = list(self._running)
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=_POLL_S, fetch_local=False)
            for ref in done:
                self._finish(ray, ref)
        # deadlines
        now = time.monotonic()
        with self._lock:
            late = [(ref, run) for ref, run in self._running.items() if not run.cancelled and now > run.deadline]
        for ref, run in late:
            run.cancelled = True
            ray.cancel(ref, force=True)

    def _finish(self, ray: Any, ref: Any) -> None:
        with self._lock:
            run = self._running.pop(ref, None)
        if run is None:
            return
        fut = run.job.futures[run.index]
        try:
            try:
                value = ray.get(ref, timeout=60)
                res: ProbeResult = self._materialise(run, value)
            except ray.exceptions.TaskCancelledError:
                res = RayProbeResult(
                    spec=run.spec,
                    outcome=Outcome(
                        "timeout",
                        detail="no result from the cluster within the probe's deadline; cancelled (ray.cancel force)",
                    ),
                    placement=run.job.placement,
                )
            except ray.exceptions.OutOfMemoryError as e:
                res = RayProbeResult(
                    spec=run.spec,
                    outcome=Outcome("infra", detail=f"out of memory: Ray's memory monitor killed the probe ({_first_line(e)})"),
                    placement=run.job.placement,
                )
            except ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, ReproError):
                    fut.set_exception(cause)
                    return
                res = RayProbeResult(
                    spec=run.spec,
                    outcome=Outcome("infra", detail=f"the probe task failed on the worker: {_first_line(cause or e)}"),
                    placement=run.job.placement,
                )
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
                if run.cancelled:
                    outcome = Outcome("timeout", detail="no result within the probe's deadline; cancelled (ray.cancel force)")
                else:
                    outcome = Outcome(
                        "infra",
                        detail=f"lost the worker or node after {self.max_retries} retries: {type(e).__name__}: {_first_line(e)}",
                    )
                res = RayProbeResult(spec=run.spec, outcome=outcome, placement=run.job.placement)
            fut.set_result(res)
        except BaseException as e:  # a bug here must reach the caller, not hang it
            if not fut.done():
                fut.set_exception(e)
        finally:
            run.job.pending -= 1
            if run.job.pending <= 0:
                self._release(run.job)
            self._wake.set()

    def _materialise(self, run: _Running, value: dict[str, Any]) -> RayProbeResult:
        spec = run.spec
        base: ProbeResult = value["result"]
        outcome = base.outcome
        expected = spec.revision if spec.repo and spec.revision else None
        ran = base.commit_ran
        if expected and ran != expected:
            outcome = Outcome(
                "infra",
                detail=f"stale code: the worker ran {ran or 'an unknown commit'}, not {expected}; the result is discarded",
            )
        local = None
        stale_local = trace_path(spec, self.out_dir)
        if not value["has_trace"] and stale_local.exists():  # an earlier execution's copy: not this one's
            shutil.rmtree(stale_local, ignore_errors=True)
        if value["has_trace"]:
            local = trace_path(spec, self.out_dir)
            tmp = local.parent / f".{local.name}.tmp-{value['run_id']}"
            shutil.rmtree(tmp, ignore_errors=True)
            for rel, data in value["files"].items():
                p = tmp / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
            if local.exists():
                old = local.parent / f".{local.name}.old-{value['run_id']}"
                os.replace(local, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, local)
        result = RayProbeResult(
            spec=spec,
            outcome=outcome,
            trace_dir=str(local) if local else None,
            commit_ran=ran,
            host=value["host"],
            stdout_tail=base.stdout_tail,
            stderr_tail=base.stderr_tail,
            output_tail=base.output_tail,
            node_id=value["node_id"],
            node_ip=value["node_ip"],
            device_type=self._device_type(value["node_id"], value["device"]),
            gpu_ids=tuple(value["gpu_ids"]),
            rendezvous=dict(value.get("rendezvous", {})),
            placement=run.job.placement,
            remote_trace_dir=value["remote_trace_dir"],
            remote_files=dict(value["remote"]),
        )
        self._nodes_seen.add(value["node_id"])
        if local is not None and spec.trace_dir and result.remote_files:
            # a folder the user named (capture -o) gets the whole trace now: it must stay
            # readable after this executor and the worker's copy are gone
            self.pull(result)
            result = replace(result, remote_files={})
        if local is not None:
            (local / "ray.json").write_text(json.dumps(result.placement_record(), indent=1) + "\n")
        return result
