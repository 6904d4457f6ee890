"""Tensor helpers the PyTorch recorder and its observers share (what a record is made of).

``_Entry`` is one buffered record of the step; the rest read tensors without changing them
(``detach``, version counters, the local shard of a distributed tensor) or say what can be
fingerprinted. The names keep their leading underscore: ``runners.torch`` re-exports them.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.runners.chain import json_float
from reprobisect.trace.format import KINDS, Record

__all__ = ["to_numpy"]

_KIND_RANK = {k: i for i, k in enumerate(KINDS)}
_SMALL_GRAD_BYTES = 64 << 10


def to_numpy(t: torch.Tensor) -> np.ndarray | None:
    """A host copy of ``t`` as NumPy (bfloat16/float8 through ml_dtypes); None if unsupported."""
    import ml_dtypes

    t = t.detach()
    views = {
        torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
        torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
        torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
    }
    c = t.to("cpu", copy=True).contiguous()
    if t.dtype in views:
        raw, np_dtype = views[t.dtype]
        return c.view(raw).numpy().view(np_dtype)
    if t.dtype in (torch.complex32, torch.uint16, torch.uint32, torch.uint64) or t.is_sparse:
        return None
    try:
        return c.numpy()
    except (TypeError, RuntimeError):
        return None


@dataclass(slots=True)
class _Entry:
    kind: str
    name: str
    pending: fpt.Pending | None = None
    module: str | None = None
    inputs: list[fpt.Pending] | None = None
    array: np.ndarray | None = None
    record: Record | None = None  # already finished (batch ids)
    seq: int = 0
    meta: dict[str, Any] | None = None  # the record's meta (collectives, buffers: runners.distributed_torch)
    chain: tuple[int, float] | None = None  # its place in chain order when not its kind's (a forward collective)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if type(obj) is tuple and all(isinstance(x, torch.Tensor) for x in obj):  # a module's usual args
        return list(obj)
    try:
        from torch.utils._pytree import tree_flatten

        leaves, _ = tree_flatten(obj)
    except Exception:
        return []
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def _small_on_cpu(g: torch.Tensor) -> bool:
    """A CPU gradient small enough to fingerprint with the others when backward returns: a
    call of its own costs more Python (~10 us) than reading its bytes again (<= 64 KiB);
    a larger one is read at its hook, while backward has it in cache. Not in a distributed
    run: there backward returns after DDP averaged the gradients, and the norm before
    clipping would mix small gradients averaged with large ones as this rank computed them."""
    if not g.is_cpu or g.numel() * g.element_size() > _SMALL_GRAD_BYTES:
        return False
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized())


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, or None for a tensor without one (an inference tensor)."""
    if t.is_inference():
        return None
    try:
        return t._version
    except RuntimeError:
        return None


class _NoGrad:
    """``torch.no_grad()`` for the hooks run at every module call and gradient: the same
    switch without its decorator machinery (0.4 against 1.4 us a use)."""

    __slots__ = ("prev",)

    def __enter__(self) -> None:
        self.prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)

    def __exit__(self, *exc: Any) -> None:
        torch._C._set_grad_enabled(self.prev)


def _training() -> bool:
    """Whether a forward pass now can train: gradients on, not inference mode."""
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a distributed tensor (FSDP2's DTensor parameters: the local shard);
    any other tensor itself."""
    if type(t) is torch.Tensor:
        return t
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None and hasattr(t, "device_mesh") else t


def _fingerprintable(t: torch.Tensor) -> bool:
    return not (t.is_sparse or t.is_nested or t.is_meta or getattr(t, "is_mkldnn", False)) and t.layout == torch.strided


@contextlib.contextmanager
def _gc_paused() -> Any:
    """Python's cyclic GC held off while the recorder handles a step's many tensors.

    Each record allocates a few small objects; with the collector on, those allocations set
    off collections that walk every live object (the user's model, torch's modules) several
    times a step: measured 2-3x the recorder's own Python time per tensor. Paused, the
    allocations are counted all the same and the next collection runs once, after the
    hook. Nothing is kept alive longer than that: the recorder's objects are not cyclic."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _psum(p: torch.Tensor) -> torch.Tensor:
    """The sum of a parameter, on its device (to see an update that bypasses versions)."""
    p = p.detach()
    wide = torch.float32 if p.device.type == "mps" else torch.float64
    return torch.sum(p, dtype=wide)


def _norm(g: torch.Tensor) -> float | torch.Tensor:
    """L2 norm of a gradient (``fingerprint_torch.norm``), where no statistics are taken
    (sentinel detail, or stats off)."""
    return fpt.norm(g.detach())


def _float(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.item()
    try:
        return json_float(float(x))
    except (TypeError, ValueError):
        return None


_json_float = json_float
_MODE_NAMES = 16
"""Most layer names ``eval_mode_layers`` / ``train_mode_layers`` list."""


def _is_norm(m: torch.nn.Module) -> bool:
    from torch.nn.modules import batchnorm

    return isinstance(m, getattr(batchnorm, "_BatchNorm", torch.nn.BatchNorm1d))


def _mode_layers(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The layers of ``module`` whose behaviour ``train()``/``eval()`` changes: dropout with
    p > 0 and batch norm that tracks running statistics, by their path."""
    from torch.nn.modules import batchnorm, dropout

    from reprobisect.runners.compile_torch import user_path

    drop = getattr(dropout, "_DropoutNd", torch.nn.Dropout)
    norm = getattr(batchnorm, "_BatchNorm", torch.nn.BatchNorm1d)
    out = []
    for path, m in module.named_modules():
        if (isinstance(m, drop) and m.p > 0) or (isinstance(m, norm) and m.track_running_stats):
            out.append((user_path(path) or type(m).__name__, m))
    return out

