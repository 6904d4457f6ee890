"""Reaching Ray: import it (a message when it is missing), start a local instance or join a cluster.

A failure is one ``ProbeError`` line saying which and what to check; an address that does
not answer fails within ``connect_timeout`` (Ray itself would retry for minutes).
"""

from __future__ import annotations

import re
import socket
from typing import Any

from reprobisect.errors import ProbeError, ReproError, UsageError

__all__: list[str] = []


def _require_ray():
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is installed in every test environment
        raise UsageError("--executor ray needs Ray: pip install 'reprobisect[ray]'") from None
    return ray


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
