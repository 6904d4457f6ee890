"""A free rendezvous port per probe, so that probes running at once never collide.

Distributed training starts a rendezvous server on a TCP port: ``torchrun``'s agent (static
rendezvous: ``--master-port``, default 29500), and the rank-0 ``TCPStore`` of any script that
calls ``init_process_group("env://")`` (``MASTER_PORT``). Two probes running at once on one
machine (``--jobs 2`` locally, two probes on one Ray node) would both take 29500: one of them
fails with ``EADDRINUSE`` or, worse, joins the other's job. ``rendezvous_env`` gives each probe
its own port through the variables those programs read when the user did not set them:

* ``MASTER_PORT``: read by ``torch.distributed``'s ``env://`` init, Lightning, Accelerate.
* ``PET_MASTER_PORT``: ``torchrun``'s default for ``--master-port`` (its ``env`` argparse
  action reads ``PET_<DEST>``; a flag on the command line still wins).

A variable the user set (in the probe's environment) is never replaced: their port is their
choice. One port serves both variables: the agent and a script never run their own server at
once (under torchrun the workers get the agent's port).

Ports come from 20000-32767 (below Linux's ephemeral range, so no outgoing connection takes
them in the meantime; above Ray's worker ports 10002-19999; 29400 and 29500, the c10d and
torchrun defaults, excluded). A port is handed out only when it can be bound right now, and
is *reserved* for ``RESERVE_S`` seconds by an ``O_EXCL`` file under the temp folder, so two
probes asking at the same instant, in one process or in two (two Ray workers of one node),
never get the same port before either has bound it.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping

__all__ = ["PORT_VARS", "RESERVE_S", "free_port", "rendezvous_vars", "rendezvous_env", "release"]

PORT_VARS = ("MASTER_PORT", "PET_MASTER_PORT")
"""The variables ``rendezvous_env`` fills (each only when unset)."""
RESERVE_S = 600.0
"""Seconds a handed-out port stays reserved against other callers on this machine."""

_LOW, _HIGH = 20000, 32768
_AVOID = {29400, 29500}
_LOCK = threading.Lock()


def _folder() -> Path:
    return Path(tempfile.gettempdir()) / f"reprobisect-ports-{os.getuid() if hasattr(os, 'getuid') else 'u'}"


def _reservations() -> Path:
    d = _folder()
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _HIGH


def _bindable(port: int) -> bool:
    """Whether ``port`` can be listened on now (IPv4 any-address, and IPv6 where there is one)."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for fam, host in families:
        try:
            s = socket.socket(fam, socket.SOCK_STREAM)
        except OSError:
            continue  # no such stack on this machine: nothing can clash there
        try:
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue
            return False
        finally:
            s.close()
    return True


def _owner_alive(path: Path) -> bool:
    """Whether the process that wrote the claim ``path`` still runs (an unreadable claim counts as alive)."""
    try:
        pid = int(path.read_text() or "0")
    except (OSError, ValueError):
        return True
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _stale(path: Path, now: float) -> bool:
    """A claim older than ``RESERVE_S`` or whose owner process is gone (killed with its probe)."""
    return now - path.stat().st_mtime >= RESERVE_S or not _owner_alive(path)


def _reserve(port: int, folder: Path) -> bool:
    """Claim ``port`` for ``RESERVE_S`` seconds on this machine (False: another caller holds it)."""
    path = folder / str(port)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileNotFoundError:  # the folder went with another caller's last release: make it again
            folder.mkdir(mode=0o700, exist_ok=True)
            continue
        except FileExistsError:
            try:
                if not _stale(path, time.time()):
                    return False
                path.unlink()  # an old claim: its probe has bound the port long ago, or ended
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))  # the owner: a claim whose owner is gone is stale at once
        return True
    return False


def _sweep(folder: Path) -> None:
    """Remove stale claims (``_stale``): the folder holds at most the live, recent ones."""
    now = time.time()
    for path in folder.iterdir():
        try:
            if _stale(path, now):
                path.unlink()
        except OSError:
            pass  # another caller removed or re-claimed it


def free_port(*, rng: random.Random | None = None) -> int:
    """A TCP port free now and reserved on this machine for ``RESERVE_S`` seconds."""
    rng = rng or random.SystemRandom()
    high = min(_HIGH, _ephemeral_low())
    if high - _LOW < 1000:  # an unusual ephemeral range: stay below it if there is room
        high = _HIGH
    folder = _reservations()
    with _LOCK:
        _sweep(folder)
        for _ in range(200):
            port = rng.randrange(_LOW, high)
            if port in _AVOID or not _bindable(port):
                continue
            if _reserve(port, folder):
                return port
    # everything we tried was busy or claimed: let the kernel pick one
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def rendezvous_vars(base_env: Mapping[str, str]) -> dict[str, str]:
    """The rendezvous variables ``base_env`` lacks, all set to one fresh free port ({} if none lacks)."""
    missing = [v for v in PORT_VARS if not base_env.get(v)]
    if not missing:
        return {}
    port = str(free_port())
    return {v: port for v in missing}


def release(given: Mapping[str, str]) -> None:
    """Give back the claims of ports ``rendezvous_vars`` handed out (its result) once the probe
    ended, and the claims folder with the last of them: a probe leaves nothing in the temp dir."""
    folder = _folder()
    for port in set(given.values()):
        try:
            (folder / str(port)).unlink()
        except OSError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass  # other probes' claims are still in it


def rendezvous_env(base_env: Mapping[str, str]) -> dict[str, str]:
    """``base_env`` plus a free rendezvous port in each of ``PORT_VARS`` it does not set.

    Call it once per probe, on the machine that runs the probe's command, just before
    starting it: ``env = rendezvous_env({**os.environ, **spec.env})``.
    """
    return {**base_env, **rendezvous_vars(base_env)}
