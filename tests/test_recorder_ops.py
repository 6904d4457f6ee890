"""The CPU-checkable guard for recording at device speed: the number of device ops the
recorder issues per step must not grow with the number of parameter tensors.

A ``TorchDispatchMode`` counts every op that reaches a kernel (views and ``detach`` only
change metadata: they launch nothing and are not counted) during one training step,
plain and recorded; the recorder's ops are the difference. On the batched path (forced on
CPU here, the default on accelerators) parameters, gradients and optimizer state cost the
same number of ops for 10 parameter tensors and for 1,000, at full and at sentinel detail
(the gradients' norms); on the per-tensor torch path
they grow with the tensors, which the second test shows (so the guard can fail). Module
outputs cost one op each on the batched path (a copy into a staging buffer; the copies are
fingerprinted together), against ~10 on the per-tensor path.
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


def _recorder_ops(n: int, trace: Path, model: torch.nn.Module | None = None, detail: str = "full") -> int:
    """Non-view ops the recorder adds to the third recorded step of a model with ``n``
    tensors (``_Many``, or ``model``) at ``detail``."""
    import reprobisect.torch as rt

    model = model if model is not None else _Many(n)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.ones(3)
    _step(model, opt, x)  # Adam's state exists from here on
    plain = _Count()
    with plain:
        _step(model, opt, x)
    recorded = _Count()
    with rt.record(model, opt, trace=trace, steps=4, detail=detail):
        _step(model, opt, x)
        _step(model, opt, x)  # layouts are built once per set of shapes: count a later step
        with recorded:
            _step(model, opt, x)
        _step(model, opt, x)
    return recorded.n - plain.n


def _deep(layers: int) -> torch.nn.Module:
    """``layers`` Linear layers in a row: each adds an activation (its output; its input is
    the last one's output, already fingerprinted) and two parameters."""
    torch.manual_seed(layers)
    return torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(layers)])


def _ops_per_layer(tmp: Path) -> float:
    return (_recorder_ops(0, tmp / "deep", _deep(40)) - _recorder_ops(0, tmp / "shallow", _deep(10))) / 30


@pytest.fixture(scope="module")
def batched_counts(tmp_path_factory) -> dict[str, tuple[int, int]]:
    # as on an accelerator: no native kernel (a tensor the batched path left out would cost
    # no torch ops through it, and the guard would not see it)
    bt.force(True)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(native, "kernel", lambda: None)
            tmp = tmp_path_factory.mktemp("ops")
            return {d: (_recorder_ops(10, tmp / f"small-{d}", detail=d), _recorder_ops(1000, tmp / f"large-{d}", detail=d))
                    for d in ("full", "sentinel")}
    finally:
        bt.force(None)


@pytest.mark.parametrize("detail", ["full", "sentinel"])
def test_recorder_ops_per_step_do_not_grow_with_the_number_of_tensors(batched_counts, detail: str) -> None:
    small, large = batched_counts[detail]
    assert small > 0
    assert large == small, f"the recorder issued {small} ops a step for 10 parameter tensors, {large} for 1000 ({detail})"


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


def test_an_activation_costs_one_op_on_the_batched_path(tmp_path: Path, monkeypatch) -> None:
    """Module outputs are staged (one copy each) and fingerprinted together at the step's end."""
    monkeypatch.setattr(native, "kernel", lambda: None)  # as on an accelerator
    bt.force(True)
    try:
        per_layer = _ops_per_layer(tmp_path)
    finally:
        bt.force(None)
    assert 0.5 <= per_layer <= 1.5, f"{per_layer} recorder ops per extra layer (one copy of its output expected)"


@pytest.mark.slow
def test_the_activation_guard_fails_on_the_per_tensor_torch_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(native, "kernel", lambda: None)
    bt.force(False)
    try:
        per_layer = _ops_per_layer(tmp_path)
    finally:
        bt.force(None)
    assert per_layer > 10  # an output's ~10 ops, and its two parameters' each step
