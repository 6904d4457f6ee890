"""The local executor: probes as subprocesses on this machine, ``jobs`` at a time.

The embedded default. A probe with ``repo`` + ``revision`` runs in a detached
``git worktree`` of that commit under ``cache_dir`` (the user's checkout is never
touched), removed afterwards; a probe without one runs in ``spec.workdir`` (or the
current folder) as it is. Each probe writes its trace straight into
``out_dir/<key>-a<attempt>`` so retries never share a folder.

Ctrl-C: ``close()`` (also on leaving a ``with`` block by an exception) kills the process
group of every running probe and removes every worktree this executor made.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from reprobisect.errors import ProbeError, UsageError
from reprobisect.executors.base import ProbeResult, ProbeSpec
from reprobisect.outcome import Outcome

__all__ = ["LocalExecutor", "default_cache_dir", "trace_dir_name"]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/reprobisect`` (``~/.cache/reprobisect``): worktrees live below it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reprobisect"


def trace_dir_name(spec: ProbeSpec) -> str:
    """The folder name of a probe's trace: its key (made path-safe) and attempt."""
    safe = re.sub(r"[^A-Za-z0-9._=+-]+", "_", spec.key).strip("._") or "probe"
    return f"{safe}-a{spec.attempt}"


class LocalExecutor:
    """Runs probes in a pool of ``jobs`` threads, each driving one subprocess."""

    name = "local"

    def __init__(
        self,
        jobs: int = 1,
        cache_dir: Path | None = None,
        keep: bool = False,
        out_dir: Path | None = None,
        **_ignored: object,
    ) -> None:
        """``jobs``: probes at once; ``cache_dir``: where worktrees go (default
        ``default_cache_dir()``); ``keep``: keep traces after ``close()``; ``out_dir``:
        where traces go (given: always kept; default: a temporary folder removed on
        ``close()`` unless ``keep``). Options meant for other executors are ignored."""
        if jobs < 1:
            raise UsageError(f"--jobs must be at least 1 (got {jobs})")
        self.max_parallel = jobs
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.keep = keep
        self._own_out = out_dir is None
        self.out_dir = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="reprobisect-traces-"))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="probe")
        self._lock = threading.Lock()
        self._worktrees: dict[Path, Path] = {}  # worktree -> repo
        self._closed = False

    # -- Executor protocol

    def submit(self, spec: ProbeSpec) -> "Future[ProbeResult]":
        if self._closed:
            raise ProbeError("this executor is closed; make a new one")
        return self._pool.submit(self._run, spec)

    def close(self) -> None:
        """Stop: cancel queued probes, kill running ones, remove worktrees (and temp traces)."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        from reprobisect.probe import kill_all_running

        kill_all_running()
        self._pool.shutdown(wait=True)
        with self._lock:
            left = list(self._worktrees.items())
        for wt, repo in left:
            self._remove_worktree(repo, wt)
        if self._own_out and not self.keep:
            shutil.rmtree(self.out_dir, ignore_errors=True)

    def __enter__(self) -> "LocalExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one probe

    def _run(self, spec: ProbeSpec) -> ProbeResult:
        from reprobisect.probe import run_in_dir

        trace_dir = self.out_dir / trace_dir_name(spec)
        if trace_dir.exists():
            shutil.rmtree(trace_dir)
        if spec.repo and spec.revision:
            try:
                wt = self._add_worktree(Path(spec.repo), spec.revision)
            except ProbeError as e:
                return ProbeResult(spec=spec, outcome=Outcome("infra", detail=str(e)))
            try:
                return run_in_dir(spec, wt, trace_dir)
            finally:
                self._remove_worktree(Path(spec.repo), wt)
        workdir = Path(spec.workdir) if spec.workdir else Path.cwd()
        return run_in_dir(spec, workdir, trace_dir)

    # -- worktrees (through reprobisect.git when it offers them)

    def _add_worktree(self, repo: Path, revision: str) -> Path:
        root = self.cache_dir / "worktrees"
        root.mkdir(parents=True, exist_ok=True)
        wt = Path(tempfile.mkdtemp(prefix=f"{revision[:12]}-", dir=root))
        wt.rmdir()
        r = subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "--force", str(wt), revision],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise ProbeError(f"cannot check out {revision[:12]} in a worktree: {r.stderr.strip().splitlines()[-1:]}")
        with self._lock:
            self._worktrees[wt] = repo
        if (wt / ".gitmodules").is_file():
            subprocess.run(
                ["git", "-C", str(wt), "submodule", "update", "--init", "--recursive"], capture_output=True, text=True
            )
        return wt

    def _remove_worktree(self, repo: Path, wt: Path) -> None:
        with self._lock:
            if self._worktrees.pop(wt, None) is None:
                return
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", "--force", str(wt)],
            capture_output=True,
            text=True,
        )
        if wt.exists():
            shutil.rmtree(wt, ignore_errors=True)
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True, text=True)
