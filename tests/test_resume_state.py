"""Data order that holds its own state (torchdata's StatefulDataLoader, a sampler with
``state_dict``) is captured and restored through the ``Stateful`` protocol."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reprobisect.runners.torch_state import capture_state, load_state, restore_state  # noqa: E402
from reprobisect.trace import TraceWriter  # noqa: E402


def _ids(batches):
    return [b.tolist() for b in batches]


def test_stateful_dataloader_position_round_trips(tmp_path):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ds = list(range(20))

    def make():
        return sdl.StatefulDataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))

    loader = make()
    it = iter(loader)
    [next(it) for _ in range(2)]
    with TraceWriter(tmp_path / "t") as w:
        capture_state(w, 1, {}, loader=loader, when="now")
    want = _ids(it)
    saved = load_state(tmp_path / "t", 1)["data"]
    assert "loader" in saved["stateful"]
    fresh = make()
    restore_state(tmp_path / "t", 1, {}, loader=fresh)
    assert _ids(fresh) == want and len(want) == 3


class CountingSampler(torch.utils.data.Sampler):
    """A sampler that knows where it is (``state_dict``): it resumes itself."""

    def __init__(self, n):
        self.n, self.pos = n, 0

    def __iter__(self):
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1
        self.pos = 0

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.pos = sd["pos"]


def test_a_stateful_sampler_is_restored_instead_of_replaying_the_epoch(tmp_path):
    def make():
        return torch.utils.data.DataLoader(list(range(12)), batch_size=3, sampler=CountingSampler(12))

    loader = make()
    it = iter(loader)
    next(it)
    with TraceWriter(tmp_path / "t") as w:
        capture_state(w, 0, {}, loader=loader, when="now")
    want = _ids(it)
    fresh = make()
    state = restore_state(tmp_path / "t", 0, {}, loader=fresh)
    assert state["data"]["stateful"]["sampler"] == {"pos": 3}
    assert _ids(fresh) == want == [[3, 4, 5], [6, 7, 8], [9, 10, 11]]
