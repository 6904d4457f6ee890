"""The Ray executor: probes as Ray tasks on a cluster (or a local Ray instance).

The only module of reprobisect that imports Ray, and only inside functions, so that
``import reprobisect`` never pays for it and a machine without Ray never needs it.

How a probe travels:

* **Code.** The commit reaches the worker as a ``git archive`` (tar) put once into the
  object store and passed to the task; the worker extracts it into its own temp folder,
  so workers need no shared file system and no git. The tar header carries the commit id;
  the worker reports it and the controller checks it equals the spec's revision (stale
  code can never pass unnoticed: a mismatch is outcome ``infra``). A spec without a
  revision (``repro`` in the user's checkout) ships the folder itself (git-tracked and
  untracked-but-not-ignored files), or runs in place with ``shared_fs=True``.
  ``--link`` paths (``spec.links``: ignored data) are never shipped: the worker symlinks
  the controller's path (``<repo>/<path>``) into its unpacked tree, which works where the
  workers see that path (a local Ray instance, a shared file system); on a node that does
  not, the probe is ``skip`` with a message saying so. The links are unlinked before the
  tree is removed.
* **DVC-tracked data.** The worker's ``run_in_dir`` restores the commit's DVC data into the
  unpacked tree (``reprobisect.vcs.dvc``, ``core.no_scm``: there is no ``.git``) from the
  user's DVC cache at the controller's path, linked, never copied: this works where the
  workers see that path (a local Ray instance, a shared file system). On a node that does
  not, a configured DVC remote is pulled into the tree's own cache (removed with it);
  without one the probe is ``skip``, saying the cache is not visible on that node.
* **One worker process per probe.** The task is declared with ``max_calls=1`` and the
  probe's ``num_cpus``/``num_gpus``: Ray starts a fresh Python worker for every probe, so
  CUDA state never leaks between probes. The worker runs
  ``reprobisect.executors.process.run_in_dir`` exactly as the local executor does.
* **Multi-GPU probes.** ``gpus_per_probe=N`` (``--gpus-per-probe N``) is one resource request
  of N GPUs: Ray places a task on exactly one node, so all N GPUs of a probe are on one node
  (a pair's side is one placement-group bundle ``{"CPU": c, "GPU": N}``, the same thing).
  The probe's command gets ``CUDA_VISIBLE_DEVICES`` set to exactly the GPU ids Ray gave the
  task (``ray.get_gpu_ids()``, read inside the task), replacing any value the probe's env
  carried, and a free rendezvous port chosen on that node (``reprobisect.executors.ports``:
  ``MASTER_PORT``, torchrun's ``PET_MASTER_PORT``, each only when the user did not set it),
  so ``torchrun --nproc_per_node N`` inside a probe uses those N devices and two probes on
  one node never meet on port 29500. N above 1 must be whole (Ray's rule); a request no
  node can hold is refused when the executor starts (``_check_feasible``), never queued.
* **Traces stay on the worker's disk.** The task returns the manifest and ``steps.jsonl``
  (small: fingerprints and stats) plus every other file up to ``eager_bytes`` in total.
  The controller writes them to ``out_dir/<key>-a<attempt>`` (the same name the local
  executor uses). Larger files (full-tensor shards, states) stay remote and are pulled on
  demand: ``fetch(result, relpath) -> bytes`` runs a tiny task pinned to the node that
  holds the trace (``NodeAffinitySchedulingStrategy(soft=False)``); ``pull`` writes them
  into the local folder; ``open_trace`` returns a ``Trace`` that pulls a shard the first
  time compare asks for one of its tensors. After ``pull(result)`` the local folder is a
  complete trace that ``read_trace`` validates like any other.
* **Idempotent per (probe key, attempt).** Ray may run a task twice (a retry after a lost
  worker). Each execution records into its own staging folder and renames it over
  ``<key>-a<attempt>`` on that node when done; the controller replaces its local copy
  whole (temp folder + rename). Two executions never mix files.

Faults: a worker or node lost mid-probe is retried by Ray elsewhere (``max_retries``),
then the probe is outcome ``infra`` (never ``bad``); a probe killed by Ray's memory
monitor is ``infra`` with detail ``out of memory``; the probe's own ``timeout`` is enforced
on the worker (process group killed: outcome ``timeout``) and again by the controller,
which ``ray.cancel(force=True)``s a task that has not answered ``start_grace_s`` later.
Every ``ray.get``/``ray.wait`` has a deadline.

Pairs (``repro``/``envs``): ``submit_pair(a, b, placement='pack'|'spread')`` reserves a
placement group (STRICT_PACK: same node, so the same device type; STRICT_SPREAD: two
nodes on purpose); a placement the cluster cannot satisfy within ``placement_timeout``
fails both futures with a ``ProbeError`` that says what was asked. Each result records
its node id, IP, device type and placement (``RayProbeResult`` fields, and a ``ray.json``
file next to the local trace).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from reprobisect.core.checks import check_number
from reprobisect.core.outcome import Outcome
from reprobisect.errors import ProbeError, ReproError, TraceError, UsageError
from reprobisect.core.probe import ProbeResult, ProbeSpec, trace_path
from reprobisect.core.probe import trace_dir_name as _trace_dir_name
from reprobisect.executors.flags import ExecutorFlag
from reprobisect.executors.ports import rendezvous_vars
from reprobisect.executors.process import KILL_GRACE_S, run_in_dir
from reprobisect.support.interrupt import make_temp_dir
from reprobisect.trace.format import FORMAT, VERSION, Manifest, Step, shard_name
from reprobisect.trace.reader import Trace, read_trace
from reprobisect.vcs.git import archive, extract, make_links, remove_links, resolve

__all__ = ["RayExecutor", "RayConfig", "RAY_FLAGS", "RayProbeResult", "PLACEMENTS", "archive_commit"]

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
_POLL_S = 0.1


def _check_whole_gpus(gpus: float) -> None:
    """Ray gives a task a fraction of one GPU or whole GPUs, nothing in between."""
    if gpus > 1 and not float(gpus).is_integer():
        raise UsageError(f"--gpus-per-probe must be a whole number above 1 (got {gpus:g}); "
                         "Ray shares one GPU between probes (e.g. 0.5) or gives whole GPUs")


def _require_ray():
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is installed in every test environment
        raise UsageError("--executor ray needs Ray: pip install 'reprobisect[ray]'") from None
    return ray


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


# --------------------------------------------------------------------------- code shipping


def archive_commit(repo: str | os.PathLike, commit: str) -> bytes:
    """A tar of ``commit`` (``reprobisect.vcs.git.archive``) whose pax header names the commit.

    ``git archive`` writes the commit id into the tar's global header; when the archive
    was rebuilt (submodule content added) the header is written again here, so the
    worker can always read back which commit it unpacked.
    """
    full = resolve(repo, commit)
    data = archive(repo, full)
    if _tar_commit(data) == full:
        return data
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, tarfile.open(
        fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": full}
    ) as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out.getvalue()


def _tar_commit(data: bytes) -> str | None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        commit = tar.pax_headers.get("comment")
    return commit if commit and re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", commit) else None


def _tar_folder(folder: Path, limit: int) -> bytes:
    """A tar of ``folder`` for a probe without a revision: git-visible files, or all but .git."""
    r = subprocess.run(
        ["git", "-C", str(folder), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
    )
    if r.returncode == 0:
        names = [n for n in r.stdout.decode(errors="surrogateescape").split("\0") if n]
    else:
        names = []
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d not in (".git", "__pycache__")]
            names += [os.path.relpath(os.path.join(root, f), folder) for f in files]
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(names):
            p = folder / name
            if not p.is_file() or p.is_symlink():
                continue
            total += p.stat().st_size
            if total > limit:
                raise UsageError(
                    f"'{folder}' holds more than {limit / 2**20:g} MiB to ship to the Ray workers; "
                    "probe a commit instead (it ships as a git archive) or pass shared_fs=True "
                    "when every node sees this folder"
                )
            tar.add(str(p), arcname=name, recursive=False)
    return buf.getvalue()


def _extract(data: bytes, dest: Path) -> str | None:
    """Extract a tar into ``dest``; return the commit id its pax header carries, if any."""

    extract(data, dest)
    return _tar_commit(data)


# --------------------------------------------------------------------------- worker side


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


def _split_trace_files(final: Path, eager_bytes: int) -> tuple[dict[str, bytes], dict[str, int]]:
    """The trace's files to send back now (every manifest and steps file, a multi-rank trace's
    ``ranks/rank-R/`` ones too, then the smallest up to ``eager_bytes``) and the sizes of those
    that stay on this worker until fetched."""
    files: dict[str, bytes] = {}
    remote: dict[str, int] = {}
    if not (final / "manifest.json").is_file():
        return files, remote
    sizes = {}
    for dirpath, _, names in os.walk(final):
        for n in names:
            p = Path(dirpath) / n
            sizes[p.relative_to(final).as_posix()] = p.stat().st_size
    budget = eager_bytes
    always = {r for r in sizes if r.rsplit("/", 1)[-1] in ("manifest.json", "steps.jsonl")}
    for rel in sorted(sizes, key=lambda r: (r not in always, sizes[r], r)):
        if rel in always or sizes[rel] <= budget:
            files[rel] = (final / rel).read_bytes()
            budget -= sizes[rel]
        else:
            remote[rel] = sizes[rel]
    return files, remote


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


def _read_file(path: str) -> bytes:
    """Runs on the node that holds a trace: one file's bytes."""
    with open(path, "rb") as f:
        return f.read()


def _remove_session(session: str) -> None:
    shutil.rmtree(_worker_root(session), ignore_errors=True)


# --------------------------------------------------------------------------- controller side


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
    job: _Job
    index: int
    spec: ProbeSpec
    deadline: float
    cancelled: bool = False


class RayExecutor:
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
        nodes = self._alive_nodes()
        need = {"CPU": self.cpus_per_probe, "GPU": self.gpus_per_probe, **self.resources}
        need = {k: v for k, v in need.items() if v > 0}
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

    def _device_type(self, node_id: str, device: str) -> str:
        if device == "cpu":
            return "cpu"
        if node_id not in self._accel:
            label = ""
            for n in self._alive_nodes():
                if n.get("NodeID") == node_id:
                    label = next((k.split(":", 1)[1] for k in n.get("Resources", {}) if k.startswith("accelerator_type:")), "")
            self._accel[node_id] = label or "GPU"
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

    # -- internals: queue and pump

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

    def _payload(self, spec: ProbeSpec) -> tuple[str, Any]:
        import ray

        if spec.repo and spec.revision:
            key = (str(spec.repo), spec.revision)
            if key not in self._archives:
                self._archives[key] = ray.put(archive_commit(spec.repo, spec.revision))
            return ("archive", self._archives[key])
        folder = Path(spec.workdir) if spec.workdir else Path.cwd()
        if self.shared_fs or spec.in_place:
            return ("shared", str(folder.resolve()))
        return ("tree", ray.put(_tar_folder(folder, self.max_ship_bytes)))

    def _launch(self, job: _Job, index: int, strategy: Any = None) -> None:
        spec = job.specs[index]
        fut = job.futures[index]
        if not fut.set_running_or_notify_cancel():
            job.pending -= 1
            if job.pending == 0:
                self._release(job)
            return
        try:
            payload = self._payload(spec)
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
            from ray.util import remove_placement_group

            try:
                remove_placement_group(job.pg)
            except Exception:
                pass
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
        from ray.util import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # start what fits
        with self._lock:
            while self._queue and (self._slots() >= len(self._queue[0].specs) or (not self._running and not self._placing)):
                job = self._queue.popleft()
                if job.placement is None:
                    self._launch(job, 0)
                else:
                    bundle = {"CPU": self.cpus_per_probe, "GPU": self.gpus_per_probe, **self.resources}
                    bundle = {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.001}
                    job.pg = placement_group([dict(bundle), dict(bundle)], strategy=PLACEMENTS[job.placement])
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
                err = ProbeError(self._placement_message(job))
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

    def _placement_message(self, job: _Job) -> str:
        need = {"CPU": self.cpus_per_probe, "GPU": self.gpus_per_probe, **self.resources}
        asked = ", ".join(f"{v:g} {k}" for k, v in need.items() if v > 0)
        where = "one node" if job.placement == "pack" else "two different nodes"
        fix = (
            "pair them with placement 'spread', or ask for fewer resources per probe"
            if job.placement == "pack"
            else "pair them with placement 'pack', or add nodes"
        )
        return (
            f"cannot place the pair '{job.specs[0].key}' / '{job.specs[1].key}' ({job.placement}: "
            f"{PLACEMENTS[job.placement]}, 2 x [{asked}] on {where}) within {self.placement_timeout:g} s; "
            f"the cluster has no room for it: {fix}"
        )

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


def _init_ray(ray: Any, address: str | None, *, num_cpus: int | None, temp_dir: str | None,
              connect_timeout: float) -> None:
    """Start a local Ray instance (``address`` None) or join the cluster at ``address``; a
    failure is one ``ProbeError`` line saying which and what to check."""
    try:
        if address is None:
            kw: dict[str, Any] = {"address": "local", "include_dashboard": False}
            if num_cpus is not None:
                kw["num_cpus"] = num_cpus
            if temp_dir is not None:
                kw["_temp_dir"] = temp_dir
            ray.init(**kw, log_to_driver=False, configure_logging=False)
        else:
            _check_reachable(address, connect_timeout)
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except ReproError:
        raise
    except Exception as e:  # ConnectionError, RuntimeError, ValueError from ray.init
        why = _first_line(e)
        if address is None:
            raise ProbeError(f"cannot start a local Ray instance: {why}") from None
        raise ProbeError(
            f"cannot reach the Ray cluster at '{address}': {why}; check --address "
            "(auto, or ray://HOST:10001) and that the cluster runs the same Ray and Python versions"
        ) from None


def _check_reachable(address: str, timeout: float) -> None:
    """Fail fast with one line when ``HOST:PORT`` (or ``ray://HOST:PORT``) does not answer."""
    m = re.fullmatch(r"(?:ray://)?\[?([^\]/]+?)\]?:(\d+)/?", address.strip())
    if not m:
        if address != "auto" and not address.startswith("ray://"):
            raise UsageError(f"'{address}' is not a Ray address; use auto, HOST:PORT or ray://HOST:10001")
        return
    host, port = m.group(1), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        why = f"no answer within {timeout:g} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ProbeError(
            f"cannot reach the Ray cluster at '{address}' ({why}); "
            "check that its head node runs and that this machine can reach the port"
        ) from None


def _first_line(e: Any) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _lazy_trace(path: Path, allow_incomplete: bool, pull: Callable[[str], Any]) -> "Trace":
    """A ``Trace`` over a folder whose shards are still remote: validated steps, lazy tensors."""
    import hashlib


    try:
        raw = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        raise TraceError(f"trace '{path}' has no readable manifest.json; re-run the probe") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise TraceError(f"'{path}' is not a reprobisect v{VERSION} trace")
    manifest = Manifest.from_json(raw, f"trace '{path}'")
    data = (path / "steps.jsonl").read_bytes()
    info = manifest.files.get("steps.jsonl")
    if manifest.status != "incomplete" and (not info or hashlib.sha256(data).hexdigest() != info.get("sha256")):
        raise TraceError(f"trace '{path}': steps.jsonl does not match its checksum; re-run the probe")
    steps = [Step.from_json(json.loads(line), f"trace '{path}', steps.jsonl line {i + 1}") for i, line in enumerate(data.split(b"\n")) if line.strip()]
    if manifest.status != "complete" and not allow_incomplete:
        raise TraceError(f"trace '{path}' is {manifest.status}; re-run it or pass --allow-incomplete")

    class _LazyTrace(Trace):
        def tensor(self, step, rec):  # type: ignore[override]
            if rec.stored and not (self.path / shard_name(step)).is_file():
                pull(shard_name(step))
            return super().tensor(step, rec)

    return _LazyTrace(path=path, manifest=manifest, steps=steps)
