"""What the PyTorch recorder keeps alive, and that what it lets go of costs it nothing.

A recorded tensor must not be held to the step's end: an activation held past its
backward raises the step's peak memory, and on CPU the allocator then takes fresh pages
from the OS every step (11,000 page faults a step on the example transformer, more than
half of what recording added to its step). So every path takes everything a record needs
when the tensor is begun, NaN/Inf counts included: the native kernel in its one pass, the
torch-op path (an accelerator's, and a CPU's without the kernel) on the host only when the
sum is not finite, the batched path in its per-slot statistics. The counts are right on
every path.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from reprobisect import native
from reprobisect.runners import batched_torch as bt


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _records(trace: Path, step: int) -> dict[tuple[str, str], dict]:
    lines = [json.loads(line) for line in (trace / "steps.jsonl").read_text().splitlines()]
    return {(r["kind"], r["name"]): r for r in lines[step]["records"]}


@pytest.mark.parametrize("path", ["native", "ops"])
def test_an_activation_is_freed_when_the_forward_no_longer_needs_it(tmp_path: Path, monkeypatch, path: str) -> None:
    import reprobisect.torch as rt

    if path == "native" and native.kernel() is None:
        pytest.skip("no native kernel could be built here")
    if path == "ops":  # the torch-op path: what an accelerator runs
        monkeypatch.setattr(native, "kernel", lambda: None)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first: list[StorageWeakRef] = []
    # the first Linear's memory: ReLU saves its own result, not its input, so nothing of the
    # training needs it once ReLU has run (a weak reference to the memory, not the tensor
    # object: the recorder holds aliases)
    model[0].register_forward_hook(lambda m, a, out: first.append(StorageWeakRef(out.untyped_storage())))
    with rt.record(model, opt, trace=tmp_path / "t", steps=2):
        for _ in range(2):
            opt.zero_grad()
            loss = model(torch.ones(4, 8)).square().mean()
            gc.collect()
            assert first[-1].expired(), "the recorder kept an activation alive after the forward was done with it"
            loss.backward()
            opt.step()
    assert ("activation", "0") in _records(tmp_path / "t", 1)  # it was recorded all the same


@pytest.mark.parametrize("path", ["native", "ops", "batched"])
def test_nan_and_inf_are_counted_on_every_path(tmp_path: Path, monkeypatch, path: str) -> None:
    import reprobisect.torch as rt

    if path == "native" and native.kernel() is None:
        pytest.skip("no native kernel could be built here")
    if path == "ops":
        monkeypatch.setattr(native, "kernel", lambda: None)
    bt.force(True if path == "batched" else None)
    try:
        model = _model()
        odd = torch.zeros(16)
        odd[:3], odd[3] = float("nan"), float("inf")
        model.register_parameter("odd", torch.nn.Parameter(odd))  # unused: no gradient, never updated
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.ones(4, 8)
        x[0, :2], x[1, 0] = float("nan"), float("-inf")
        with rt.record(model, opt, trace=tmp_path / "t", steps=1):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    finally:
        bt.force(None)
    recs = _records(tmp_path / "t", 0)
    odd_stats = recs[("param", "odd")]["stats"]
    assert (odd_stats["nan"], odd_stats["inf"]) == (3, 1)
    x_stats = recs[("input", "input")]["stats"]
    assert (x_stats["nan"], x_stats["inf"]) == (2, 1)
    assert recs[("activation", "0")]["stats"]["nan"] >= 8  # the first row, at least
    assert recs[("grad", "0.weight")]["stats"]["nan"] > 0
