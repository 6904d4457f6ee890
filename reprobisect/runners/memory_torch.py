"""Per-step memory figures for ``bisect doctor --check memory`` (installed on the PyTorch
recorder when ``RecordPolicy.memory`` is set).

What tells steady growth (retained graphs) from spikes on large inputs, on any device:

- ``saved_bytes``: bytes the step's forward saved for backward (its activations, the
  graph's size; a ``saved_tensors_hooks`` pack hook, parameters excluded);
- ``saved_alive_bytes``: bytes of saved tensors of this and earlier steps still alive
  when the step ends (after backward): graphs kept alive (``retain_graph``, a forward
  with gradients whose loss never went through backward);
- ``retained_losses``: losses of earlier steps (the tensors ``backward`` was called on)
  whose graph is still alive when the step ends: the loss tensor itself kept
  (``losses.append(loss)``), or only its graph, through a tensor computed from it
  (``running = running + loss``). The graph's liveness is read from a small marker object
  put in the loss's ``grad_fn.metadata`` (autograd nodes take no weak reference; the
  metadata dict lives exactly as long as the node);
- ``batch_elements`` and ``batch_shapes``: the shapes of the step's batch tensors and the
  element count of the largest (the token count of a batch of token IDs);
- ``rss_bytes``: the process's resident memory (``/proc/self/statm``; None elsewhere);
- CUDA only (when initialised): ``cuda_allocated``, ``cuda_reserved``, ``cuda_peak``
  (``max_memory_allocated`` during the step; its counter is reset at each step's end).

All are read when the recorder ends the step (the optimizer's step pre-hook: after
backward, before the update).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable

import torch

__all__ = ["MemoryObserver"]


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class MemoryObserver:
    """Measures each step's memory (see the module docstring)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self._saved: dict[int, tuple[weakref.ref, int]] = {}  # id -> (tensor, bytes), alive across steps
        self._step_saved = 0
        self._losses: list[tuple[weakref.ref, weakref.ref | None]] = []  # losses of earlier steps: (tensor, graph)
        self._step_losses: list[tuple[weakref.ref, weakref.ref | None]] = []
        self._shapes: list[list[int]] | None = None

    def install(self) -> Callable[[], None]:
        from torch.utils.data import dataloader as dl

        undo: list[Callable[[], None]] = []
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        undo.append(torch._C._autograd._pop_saved_tensors_default_hooks)
        old_backward = torch.autograd.backward  # Tensor.backward calls it too
        me = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            for t in [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ()):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    try:
                        me._step_losses.append((weakref.ref(t), _graph_marker(t)))
                    except TypeError:
                        pass
            return old_backward(tensors, *args, **kwargs)

        torch.autograd.backward = backward  # type: ignore[assignment]
        undo.append(lambda: setattr(torch.autograd, "backward", old_backward))
        old_next = dl._BaseDataLoaderIter.__dict__["__next__"]

        def __next__(it: Any) -> Any:
            data = old_next(it)
            if torch.is_grad_enabled() and me._shapes is None:
                from reprobisect.runners.overfit_torch import _tensors

                me._shapes = [list(t.shape) for t in _tensors(data)][:8]
            return data

        dl._BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]
        undo.append(lambda: setattr(dl._BaseDataLoaderIter, "__next__", old_next))
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

        def remove() -> None:
            while undo:
                undo.pop()()

        return remove

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            n = t.numel() * t.element_size()
            self._step_saved += n
            key = id(t)
            if key not in self._saved:
                try:
                    self._saved[key] = (weakref.ref(t, lambda _r, k=key: self._saved.pop(k, None)), n)
                except TypeError:
                    pass
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def step_scalars(self) -> dict[str, Any]:
        """The step's ``memory`` scalar; starts the next step's counts."""
        alive = sum(n for r, n in list(self._saved.values()) if r() is not None)
        retained = sum(1 for r, g in self._losses if _alive(r, g))
        m: dict[str, Any] = {"saved_bytes": self._step_saved, "saved_alive_bytes": alive, "retained_losses": retained,
                             "batch_shapes": self._shapes,
                             "batch_elements": max(_numel(sh) for sh in self._shapes) if self._shapes else None,
                             "rss_bytes": _rss()}
        if torch.cuda.is_initialized():
            m["cuda_allocated"] = int(torch.cuda.memory_allocated())
            m["cuda_reserved"] = int(torch.cuda.memory_reserved())
            m["cuda_peak"] = int(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        self._losses = [(r, g) for r, g in self._losses + self._step_losses if _alive(r, g)]
        self._step_losses = []
        self._step_saved = 0
        self._shapes = None
        return {"memory": m}


class _Marker:
    """Lives as long as the autograd node whose metadata holds it."""

    __slots__ = ("__weakref__",)


def _graph_marker(t: torch.Tensor) -> weakref.ref | None:
    """A weak reference that dies with ``t``'s graph (its ``grad_fn``), or None when the
    node has no metadata to hold the marker."""
    try:
        meta = t.grad_fn.metadata
        m = meta.setdefault("reprobisect_memory", _Marker())
        return weakref.ref(m)
    except (AttributeError, RuntimeError, TypeError):
        return None


def _alive(tensor: weakref.ref, graph: weakref.ref | None) -> bool:
    """An earlier step's loss whose graph is alive: the tensor with its grad_fn, or the graph alone."""
    t = tensor()
    if t is not None and t.grad_fn is not None:
        return True
    return graph is not None and graph() is not None


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
