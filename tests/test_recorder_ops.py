"""The CPU-checkable guard for recording at device speed: the number of device ops the
recorder issues per step must not grow with the number of parameter tensors.

A ``TorchDispatchMode`` counts every op that reaches a kernel (views and ``detach`` only
change metadata: they launch nothing and are not counted) during one training step,
plain and recorded; the recorder's ops are the difference. On the batched path (forced on
CPU here, the default on accelerators) parameters, gradients and optimizer state cost the
same number of ops for 10 parameter tensors and for 1,000; on the per-tensor torch path
they grow with the tensors, which the last test shows (so the guard can fail).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reprobisect import native
from reprobisect.runners import batched_torch as bt


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not func.is_view:
            self.n += 1
            self.ops[str(func)] = self.ops.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))


class _Many(torch.nn.Module):
    """``n`` parameter tensors in one module (no submodule forwards: activations stay one record)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(n)
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(3, generator=g)) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.stack(list(self.ps)).sum(0)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().sum().backward()
    opt.step()


def _recorder_ops(n: int, trace: Path) -> int:
    """Non-view ops the recorder adds to the third recorded step of a model with ``n`` tensors."""
    import reprobisect.torch as rt

    model = _Many(n)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.ones(3)
    _step(model, opt, x)  # Adam's state exists from here on
    plain = _Count()
    with plain:
        _step(model, opt, x)
    recorded = _Count()
    with rt.record(model, opt, trace=trace, steps=4):
        _step(model, opt, x)
        _step(model, opt, x)  # layouts are built once per set of shapes: count a later step
        with recorded:
            _step(model, opt, x)
        _step(model, opt, x)
    return recorded.n - plain.n


@pytest.fixture(scope="module")
def batched_counts(tmp_path_factory) -> tuple[int, int]:
    bt.force(True)
    try:
        tmp = tmp_path_factory.mktemp("ops")
        return _recorder_ops(10, tmp / "small"), _recorder_ops(1000, tmp / "large")
    finally:
        bt.force(None)


def test_recorder_ops_per_step_do_not_grow_with_the_number_of_tensors(batched_counts) -> None:
    small, large = batched_counts
    assert small > 0
    assert large == small, f"the recorder issued {small} ops a step for 10 parameter tensors, {large} for 1000"


@pytest.mark.slow
def test_the_guard_fails_on_the_per_tensor_torch_path(tmp_path: Path, monkeypatch) -> None:
    # no native kernel, batching off: each tensor costs its own ops, as on an accelerator before
    monkeypatch.setattr(native, "kernel", lambda: None)
    bt.force(False)
    try:
        small, large = _recorder_ops(10, tmp_path / "small"), _recorder_ops(1000, tmp_path / "large")
    finally:
        bt.force(None)
    assert large > small + 1000 * 3 * 3  # >= ~3 ops for each param, grad and Adam moment
