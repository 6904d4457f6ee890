"""The PyTorch recorder's CUDA memory figures: ``scalars.cuda_memory_allocated``/``_reserved``.

Only when CUDA is initialised: no CUDA call is made otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from reprobisect.runners.chain import Observer, register_observer

__all__ = ["DeviceMemoryObserver"]


class DeviceMemoryObserver(Observer):
    """The CUDA allocator's figures at the step's end."""

    def step_scalars(self, scalars: dict[str, Any]) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            scalars["cuda_memory_allocated"] = int(torch.cuda.memory_allocated())
            scalars["cuda_memory_reserved"] = int(torch.cuda.memory_reserved())


register_observer("torch", "memory", DeviceMemoryObserver, rank=40)
