"""Signals and leftovers: SIGTERM and SIGHUP end a probing command the way Ctrl-C does.

``timeout``, CI cancellation, Slurm and ``docker stop`` send SIGTERM; a closed terminal
sends SIGHUP. Python's default for both is to die at once, which leaves the running
probe orphaned, a git worktree registered and temporary trace folders behind. Inside
``signals_as_interrupt()`` (installed once by ``reprobisect.cli.main``) SIGINT, SIGTERM
and SIGHUP raise ``Interrupted`` — a ``KeyboardInterrupt`` — in the main thread, so every
cleanup path written for Ctrl-C runs (the executor kills its probes' process groups and
removes its worktrees, temporary folders go, the session log keeps only finished
probes), and the CLI exits ``128 + signal``: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP).
A second signal while that cleanup runs is ignored (cleanup is bounded: a killed probe
gets ``reprobisect.executors.process`` 's short grace); SIGKILL still ends everything at once. A
SIGHUP that is ignored when the command starts (``nohup``) stays ignored.

SIGKILL cannot be handled, so what a killed session leaves is cleaned when the next one
starts: ``make_temp_dir`` marks every temporary folder it makes with an owner file (pid,
host, the process's start time) under a ``reprobisect-`` prefix, and removes such
folders whose owner is dead — never one without our owner file, one of another host or
user, one whose owner still runs, or one a live process still uses (a probe orphaned by
the kill). Worktrees of dead sessions are removed by ``reprobisect.vcs.git.WorktreePool``
with the same care (``in_use``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Iterator

__all__ = [
    "Interrupted",
    "HANDLED",
    "OWNER_FILE",
    "TEMP_PREFIX",
    "signals_as_interrupt",
    "exit_code",
    "make_temp_dir",
    "pid_alive",
    "clean_stale_temp_dirs",
    "owner_alive",
    "in_use",
]

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
OWNER_FILE = ".reprobisect-owner"
"""Name of the file that marks a temporary folder as reprobisect's (JSON: pid, host, start)."""
TEMP_PREFIX = "reprobisect-"
"""Every temporary folder reprobisect makes starts with this."""


class Interrupted(KeyboardInterrupt):
    """A handled signal (SIGINT, SIGTERM, SIGHUP), raised in the main thread."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal's number (143 SIGTERM, 129 SIGHUP, 130 SIGINT)."""
        return 128 + self.signum


def exit_code(exc: BaseException | None) -> int:
    """The exit status for an interruption: ``exc``'s own (or its cause's), else 130 (Ctrl-C)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, Interrupted):
            return exc.exit_code
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return 130


_state = threading.local()


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM/SIGHUP raise ``Interrupted`` once in the main thread.

    The handlers before the block are restored after it. Outside the main thread (where
    Python cannot install handlers) the block changes nothing. Nested blocks are no-ops.
    """
    if threading.current_thread() is not threading.main_thread() or getattr(_state, "active", False):
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if received:  # cleanup of the first one is running: do not cut it short
            return
        received.append(signum)
        raise Interrupted(signum)

    previous: dict[int, object] = {}
    for sig in HANDLED:
        try:
            old = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if sig == signal.SIGHUP and old == signal.SIG_IGN:
            continue  # nohup: the user asked to survive a hang-up
        if sig == signal.SIGINT and old not in (signal.default_int_handler, signal.SIG_DFL):
            continue  # someone else's Ctrl-C handler (an embedding program): leave it
        previous[sig] = old
        signal.signal(sig, handler)
    _state.active = True
    try:
        yield
    finally:
        _state.active = False
        for sig, old in previous.items():
            try:
                signal.signal(sig, old)  # type: ignore[arg-type]
            except (ValueError, OSError, TypeError):
                pass


# --------------------------------------------------------------------------- leftovers


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (ValueError, IndexError):
        return None


def owner_record() -> dict[str, object]:
    """What marks a folder as this process's: pid, host, start time."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_time(os.getpid())}


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(record: dict) -> bool:
    """True unless the owner in ``record`` is provably gone (same host, pid dead or reused).

    Anything unclear (another host, a malformed record) counts as alive: never removed.
    """
    try:
        pid = int(record["pid"])
    except (KeyError, TypeError, ValueError):
        return True
    if record.get("host") != socket.gethostname() or pid <= 0:
        return True
    if not pid_alive(pid):
        return False
    start = record.get("start")
    now = _start_time(pid)
    if start is not None and now is not None and str(start) != now:
        return False  # the pid now belongs to another process
    return True


def in_use(path: Path) -> bool:
    """True when a live process works inside ``path`` or names it on its command line
    (a probe orphaned when its session was killed). Linux ``/proc``; elsewhere: False."""
    target = str(Path(path).resolve())
    proc = Path("/proc")
    if not proc.is_dir():
        return False
    for p in proc.iterdir():
        if not p.name.isdigit():
            continue
        try:
            cwd = os.readlink(p / "cwd")
            if cwd == target or cwd.startswith(target + os.sep):
                return True
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if target.encode() in cmd:
            return True
    return False


def make_temp_dir(prefix: str = "reprobisect-traces-") -> Path:
    """A new temporary folder marked as this process's (first cleaning dead sessions' ones)."""
    if not prefix.startswith(TEMP_PREFIX):
        prefix = TEMP_PREFIX + prefix
    try:
        clean_stale_temp_dirs()
    except OSError:
        pass  # cleaning is a courtesy: never a reason not to start
    d = Path(tempfile.mkdtemp(prefix=prefix))
    (d / OWNER_FILE).write_text(json.dumps(owner_record()))
    return d


def clean_stale_temp_dirs(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove ``reprobisect-*`` folders under ``root`` (default: the temp folder) that carry
    our owner file and whose owner is dead; returns what was removed."""
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed: list[Path] = []
    uid = os.getuid()
    for d in base.glob(TEMP_PREFIX + "*"):
        try:
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != uid:
                continue
            record = json.loads((d / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not provably ours: leave it
        if not isinstance(record, dict) or owner_alive(record) or in_use(d):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d)
    return removed
