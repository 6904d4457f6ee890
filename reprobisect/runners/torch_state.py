"""Complete training state capture and restore for PyTorch: safetensors + JSON, never pickle.

(Signatures first; implementation follows.)
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

__all__ = ["Stateful", "capture_state", "load_state", "restore_state", "capture_rng", "restore_rng"]


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict`` (model, optimizer, scheduler, scaler...)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


def capture_rng(loader: Any = None) -> dict[str, Any]:
    """RNG state keyed by source: python, numpy, torch, torch.cuda, loader generators."""
    raise NotImplementedError


def restore_rng(state: Mapping[str, Any], loader: Any = None) -> None:
    """Set the RNGs from ``capture_rng``'s dict; missing keys are left alone."""
    raise NotImplementedError


def capture_state(writer: Any, step: int, objects: Mapping[str, Any], loader: Any = None) -> None:
    """Write the state of every Stateful object, the RNGs and the data position at ``step``."""
    raise NotImplementedError


def load_state(trace_or_path: Any, step: int) -> dict[str, Any]:
    """Read the state captured at ``step`` back into nested dicts (tensors as torch tensors)."""
    raise NotImplementedError


def restore_state(trace_or_path: Any, step: int, objects: Mapping[str, Any], loader: Any = None) -> None:
    """Load the state captured at ``step`` into freshly built objects and set every RNG."""
    raise NotImplementedError
