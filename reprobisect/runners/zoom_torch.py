"""Op-level zoom for PyTorch: every aten op inside one module's forward at one step.

(Signatures first; implementation follows.)
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["ZoomRecorder", "install_zoom"]


class ZoomRecorder:
    """Records aten ops inside module ``module_name`` during step ``step``.

    ``take()`` returns the ``Record``s collected so far (kind ``activation``, named
    ``NAME::aten.op.overload#i``) for the caller to write into the step, then clears them.
    """

    def __init__(self, module_name: str, step: int, *, current_step: Callable[[], int] | None = None) -> None:
        self.module_name = module_name
        self.step = step

    def install(self) -> "ZoomRecorder":
        raise NotImplementedError

    def remove(self) -> None:
        raise NotImplementedError

    def take(self) -> list[Any]:
        raise NotImplementedError


def install_zoom(module_name: str, step: int, *, current_step: Callable[[], int] | None = None) -> ZoomRecorder:
    """Install a ``ZoomRecorder`` (global module hooks); the launcher writes ``take()`` into step ``step``."""
    return ZoomRecorder(module_name, step, current_step=current_step).install()
