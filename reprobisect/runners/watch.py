"""The import watcher shared by the launcher and the bootstrap: a meta-path finder that calls
back right after the program's import of a watched module finishes.

Standard library only: the bootstrap installs it at the start of every Python process a
wrapped command starts, where it must cost next to nothing until a framework is imported.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable

__all__ = ["Activator"]


class Activator(importlib.abc.MetaPathFinder):
    """Calls ``on_import(name)`` right after the script's import of a watched module finishes."""

    def __init__(self, names: set[str], on_import: Callable[[str], None]) -> None:
        self.names = set(names)
        self.on_import = on_import
        self.busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname not in self.names or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig = loader.exec_module
        activator = self

        def exec_module(module):
            orig(module)
            activator.names.discard(fullname)
            if not activator.names:
                activator.remove()
            activator.on_import(fullname)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def remove(self) -> None:
        """Stop watching (idempotent)."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
