"""What the bootstrap's processes of one probe share: the probe's folder, the claim on its
flat trace, and the launcher's word that it records this process by itself.

Standard library only (the launcher imports it; the bootstrap imports the launcher).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["ENV_CONFIG", "ENV_PROBE", "folder", "claim_flat", "stand_down", "stood_down", "watching"]

ENV_CONFIG = "REPROBISECT_BOOT"
"""Names the probe's ``config.json`` in the command's environment."""
ENV_PROBE = "REPROBISECT_BOOT_TOKEN"
"""A token unique to the probe, inherited by every process of its tree (to find them all)."""

_STOOD_DOWN = False
_WATCHERS: list[Any] = []


def folder() -> Path | None:
    """The probe's bootstrap folder, when this process runs under one."""
    cfg = os.environ.get(ENV_CONFIG)
    return Path(cfg).parent if cfg else None


def claim_flat() -> bool:
    """Take the probe's flat trace for this process; False when another process has it
    (or there is no probe folder)."""
    d = folder()
    if d is None:
        return False
    try:
        fd = os.open(d / "flat.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:  # FileExistsError: another process's; anything else: not ours to take
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def watching(watcher: Any) -> None:
    """Remember the bootstrap's import watcher of this process (``stand_down`` removes it)."""
    _WATCHERS.append(watcher)


def stand_down() -> None:
    """This process records through ``python -m reprobisect.runners.launch``: the bootstrap stops watching."""
    global _STOOD_DOWN
    _STOOD_DOWN = True
    for w in _WATCHERS:
        w.remove()
    _WATCHERS.clear()


def stood_down() -> bool:
    return _STOOD_DOWN
