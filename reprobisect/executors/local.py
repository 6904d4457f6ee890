"""The local executor: probes as subprocesses on this machine, ``jobs`` at a time.

The embedded default. A probe with ``repo`` + ``revision`` runs in a detached
``git worktree`` of that commit (``reprobisect.vcs.git.WorktreePool``: reused between probes,
cleaned with ``git clean -ffdx``, all removed on ``close()``; the user's checkout is never
touched; ``spec.links`` appear there as symlinks to the user's files, unlinked first); a
probe without one runs in ``spec.workdir`` (or the current folder) as it is. Each probe
writes its trace straight into ``out_dir/<key>-a<attempt>`` so retries never share a
folder, or into ``spec.trace_dir`` when the spec names one (``bisect capture -o``). The
child process itself is ``reprobisect.executors.process.run_in_dir``; ``spec.echo``
streams its output live to this terminal (``live_output``).

Ctrl-C, SIGTERM, SIGHUP (``reprobisect.support.interrupt``): ``close()`` (also on leaving a
``with`` block by an exception) kills the process group of every running probe and
removes every worktree and temporary folder this executor made. The temporary trace
folder carries an owner file, so one left by a SIGKILL'd session is removed by the next
executor that starts (``reprobisect.support.interrupt.make_temp_dir``).
"""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from reprobisect.core.outcome import Outcome, Status
from reprobisect.core.probe import ProbeResult, ProbeSpec, trace_path
from reprobisect.errors import ProbeError, UsageError
from reprobisect.executors.process import kill_all_running, run_in_dir, set_owner
from reprobisect.support.interrupt import make_temp_dir
from reprobisect.vcs import git

__all__ = ["LocalExecutor"]


class LocalExecutor:
    """Runs probes in a pool of ``jobs`` threads, each driving one subprocess."""

    name = "local"
    live_output = True
    """A probe's ``spec.echo`` output reaches this terminal while it runs."""

    def __init__(
        self,
        jobs: int = 1,
        cache_dir: Path | None = None,
        keep: bool = False,
        out_dir: Path | None = None,
    ) -> None:
        """``jobs``: probes at once; ``cache_dir``: worktrees go under ``cache_dir/worktrees``
        (default: ``reprobisect.vcs.git.default_cache_dir(repo)``, inside the repository's git dir); ``keep``: keep traces after ``close()``; ``out_dir``:
        where traces go (given: always kept; default: a temporary folder removed on
        ``close()`` unless ``keep``)."""
        if jobs < 1:
            raise UsageError(f"--jobs must be at least 1 (got {jobs})")
        self.max_parallel = jobs
        self._cache_given = Path(cache_dir) if cache_dir else None
        self.keep = keep
        self._own_out = out_dir is None
        if out_dir:
            self.out_dir = Path(out_dir)
        else:  # marked as ours, so a SIGKILL'd session's folder is cleaned by the next start
            self.out_dir = make_temp_dir("reprobisect-traces-")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="probe")
        self._lock = threading.Lock()
        self._pools: dict[Path, object] = {}  # repository root -> git.WorktreePool
        self._closed = False
        self._futures: set[Future[ProbeResult]] = set()

    # -- Executor protocol

    def submit(self, spec: ProbeSpec) -> "Future[ProbeResult]":
        if self._closed:
            raise ProbeError("this executor is closed; make a new one")
        fut = self._pool.submit(self._run, spec)
        with self._lock:
            self._futures.add(fut)
        fut.add_done_callback(self._forget)
        return fut

    def _forget(self, fut: "Future[ProbeResult]") -> None:
        with self._lock:
            self._futures.discard(fut)

    def close(self) -> None:
        """Stop: cancel queued probes, kill running ones, remove worktrees (and temp traces)."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        # kill until every started probe has ended: one may be between its checkout and
        # its Popen when the first kill goes out
        while True:
            kill_all_running(self)
            with self._lock:
                pending = [f for f in self._futures if not f.done()]
            if not pending:
                break
            time.sleep(0.05)
        self._pool.shutdown(wait=True)
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.close()
        if self._own_out and not self.keep:
            shutil.rmtree(self.out_dir, ignore_errors=True)

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one probe

    def _run(self, spec: ProbeSpec) -> ProbeResult:
        set_owner(self)
        trace_dir = trace_path(spec, self.out_dir)
        if trace_dir.exists() and not spec.trace_dir:  # a folder the spec names: the trace writer checks it
            shutil.rmtree(trace_dir)
        if spec.repo and spec.revision:
            pool = self._pool_for(Path(spec.repo))
            try:
                cm = pool.checkout(spec.revision, links=spec.links)
                wt = cm.__enter__()
            except ProbeError as e:
                return ProbeResult(spec=spec, outcome=Outcome(Status.INFRA, detail=str(e)))
            except UsageError as e:
                return ProbeResult(spec=spec, outcome=Outcome(Status.SKIP, detail=str(e)))
            try:
                if self._closed:
                    return ProbeResult(spec=spec, outcome=Outcome(Status.INFRA, detail="cancelled: the executor was closed"))
                return run_in_dir(spec, wt, trace_dir, echo=spec.echo)
            finally:
                cm.__exit__(None, None, None)
        workdir = Path(spec.workdir) if spec.workdir else Path.cwd()
        return run_in_dir(spec, workdir, trace_dir, echo=spec.echo)

    # -- worktrees (reprobisect.vcs.git.WorktreePool, one per repository)

    def _pool_for(self, repo: Path) -> git.WorktreePool:
        key = repo.resolve()
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                cache = self._cache_given / "worktrees" if self._cache_given else None
                pool = git.WorktreePool(key, cache_dir=cache, reuse=True)
                self._pools[key] = pool
            return pool
