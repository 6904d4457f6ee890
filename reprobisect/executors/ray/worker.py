"""What runs on a Ray worker: unpack the code, run the probe, hand back the small part of the trace.

* **One worker process per probe.** The task is declared with ``max_calls=1`` and the
  probe's ``num_cpus``/``num_gpus``: Ray starts a fresh Python worker for every probe, so
  CUDA state never leaks between probes. The worker runs
  ``reprobisect.executors.process.run_in_dir`` exactly as the local executor does.
* **The node's own settings.** The probe's command gets ``CUDA_VISIBLE_DEVICES`` set to
  exactly the GPU ids Ray gave the task (``ray.get_gpu_ids()``, read inside the task),
  replacing any value the probe's env carried, and a free rendezvous port chosen on that
  node (``reprobisect.executors.ports``: ``MASTER_PORT``, torchrun's ``PET_MASTER_PORT``,
  each only when the user did not set it), so ``torchrun --nproc_per_node N`` inside a
  probe uses those N devices and two probes on one node never meet on port 29500.
* **Links and DVC data.** ``--link`` paths (``spec.links``) are not shipped: the worker
  symlinks the controller's path (``<repo>/<path>``) into its unpacked tree, which works
  where the workers see that path (a local Ray instance, a shared file system); on a node
  that does not, the probe is ``skip`` with a message saying so. The links are unlinked
  before the tree is removed. ``run_in_dir`` restores the commit's DVC data into the
  unpacked tree (``reprobisect.vcs.dvc``, ``core.no_scm``: there is no ``.git``) from the
  user's DVC cache at the controller's path, linked, never copied; on a node that does not
  see it, a configured DVC remote is pulled into the tree's own cache (removed with it);
  without one the probe is ``skip``, saying the cache is not visible on that node.
* **Idempotent per (probe key, attempt).** Ray may run a task twice (a retry after a lost
  worker). Each execution records into its own staging folder and renames it over
  ``<key>-a<attempt>`` on that node when done. Two executions never mix files.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from reprobisect.core.outcome import Outcome
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.core.probe import trace_dir_name as _trace_dir_name
from reprobisect.executors.ports import rendezvous_vars
from reprobisect.executors.process import run_in_dir
from reprobisect.executors.ray.ship import _extract
from reprobisect.executors.ray.traces import _split_trace_files
from reprobisect.vcs.git import make_links, remove_links

__all__: list[str] = []


def _worker_root(session: str) -> Path:
    return Path(tempfile.gettempdir()) / "reprobisect-ray" / session


def _device_info() -> tuple[tuple[str, ...], str]:
    import ray

    ids = ray.get_gpu_ids()
    return tuple(str(i) for i in ids), ("GPU" if ids else "cpu")


def _node_env(spec: ProbeSpec, gpu_ids: tuple[str, ...]) -> dict[str, str]:
    """What the probe's command gets on this node on top of ``spec.env``: exactly the GPUs Ray
    gave this task, and a rendezvous port free here (only the port variables the user left unset)."""
    env: dict[str, str] = {}
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    env.update(rendezvous_vars({**os.environ, **spec.env}))
    return env


def _probe_task(
    spec: ProbeSpec,
    kind: str,
    value: Any,
    session: str,
    eager_bytes: int,
    runner: Callable[[ProbeSpec, Path, Path], ProbeResult] | None,
) -> dict[str, Any]:
    """Runs on a Ray worker: unpack the code, run the probe, return the small part of the trace."""
    import ray

    ctx = ray.get_runtime_context()
    gpu_ids, device = _device_info()
    node_env = _node_env(spec, gpu_ids)
    # where it ran reaches the trace's environment record (group "probe"); the result keeps `spec`
    run_spec = replace(spec, env={**spec.env, **node_env, "REPROBISECT_PROBE_NODE": ctx.get_node_id(),
                                  "REPROBISECT_PROBE_DEVICE": device})
    root = _worker_root(session)
    root.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:10]
    name = _trace_dir_name(spec)
    final = root / name
    staging = root / f".{name}.{run_id}"
    res, commit = _run_unpacked(spec, run_spec, kind, value, root / f".work-{name}.{run_id}", staging, runner)
    # this execution's trace replaces any earlier execution's, whole (or removes it: no trace this time)
    if final.exists():
        old = root / f".{name}.old-{run_id}"
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    if staging.exists():
        os.replace(staging, final)
    files, remote = _split_trace_files(final, eager_bytes)
    return {
        "result": replace(res, spec=spec, commit_ran=commit if commit else res.commit_ran, trace_dir=None),
        "has_trace": (final / "manifest.json").is_file(),
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "host": socket.gethostname(),
        "gpu_ids": gpu_ids,
        "rendezvous": {k: v for k, v in node_env.items() if k != "CUDA_VISIBLE_DEVICES"},
        "device": device,
        "remote_trace_dir": str(final),
        "files": files,
        "remote": remote,
        "run_id": run_id,
    }


def _run_unpacked(spec: ProbeSpec, run_spec: ProbeSpec, kind: str, value: Any, work: Path, staging: Path,
                  runner: Callable[[ProbeSpec, Path, Path], ProbeResult] | None) -> tuple[ProbeResult, str | None]:
    """Unpack the code into ``work`` (or use the shared folder), make the links, run the probe
    into ``staging``; the result and the commit the tar named. ``work`` is removed after."""
    runner = runner or run_in_dir
    commit = None
    shared = kind == "shared"
    try:
        if shared:
            workdir = Path(value)
        else:
            work.mkdir()
            commit = _extract(value, work)
            workdir = work
        missing = _linkable(spec, workdir) if not shared else None
        if missing:
            return ProbeResult(spec=run_spec, outcome=Outcome("skip", detail=missing), host=socket.gethostname()), commit
        made = make_links(workdir, spec.repo, spec.links) if spec.links and not shared else []
        if not shared and spec.revision is None and spec.workdir:  # a copy of the controller's folder:
            # the trace names the folder it came from, so zoom (and people) can re-run it there
            origin = str(Path(spec.workdir) / spec.subdir)
            run_spec = replace(run_spec, extra_launch_args=(*run_spec.extra_launch_args, "--recorded-cwd", origin))
        try:
            return runner(run_spec, workdir, staging), commit
        finally:
            if made:
                remove_links(made)  # unlink before the folder goes: never delete through a link
    finally:
        if not shared:
            shutil.rmtree(work, ignore_errors=True)


def _linkable(spec: ProbeSpec, workdir: Path) -> str | None:
    """Why ``spec.links`` cannot be made on this worker (None: they can, or there are none).

    Linked paths are not shipped (a dataset is no archive payload): each worker links the
    controller's path itself, so ``--link`` works where the workers see the user's checkout
    at the same path (a local Ray instance, a shared file system) and is refused clearly
    elsewhere.
    """
    if not spec.links:
        return None
    if not spec.repo:
        return "--link needs a probe of a commit (a repository and revision)"
    lost = [rel for rel in spec.links if not os.path.lexists(os.path.join(spec.repo, rel))]
    if lost:
        return (f"--link {lost[0]}: {os.path.join(spec.repo, lost[0])} is not visible on Ray node {socket.gethostname()}; "
                "linked paths are not shipped: run with --executor local, or on a cluster whose nodes share that path")
    return None


def _remove_session(session: str) -> None:
    shutil.rmtree(_worker_root(session), ignore_errors=True)
