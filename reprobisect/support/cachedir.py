"""Where reprobisect keeps this user's files outside any project: the native kernel's
builds, internal-error logs, the trust key. One place, so ``REPROBISECT_CACHE_DIR`` moves
all of them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache_dir"]


def user_cache_dir() -> Path:
    """``$REPROBISECT_CACHE_DIR``, else ``$XDG_CACHE_HOME/reprobisect``, else ``~/.cache/reprobisect``."""
    base = os.environ.get("REPROBISECT_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "reprobisect"
