"""What ``bisect compare`` says over real traces, pinned: text and ``--json`` per case.

The comparison engine moved from one module into the ``reprobisect.core.compare`` package
(issue 35); these files were written by the code before the move, so the move is proven
output-preserving. Each case is a pair of real traces written through the writer API (no
framework): identical, diverged beyond the tolerance, within it, a renamed parameter (a
record missing on each side), shape and dtype mismatches, NaN by position, -0.0 against
0.0, tensors not stored (judged from stats), a step only one side holds, sentinel traces
and two-rank traces. Regenerate on purpose only:
``REPROBISECT_REGEN_GOLDEN=1 pytest tests/test_compare_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from reprobisect.cli import main
from reprobisect.trace import TraceWriter, record_array
from reprobisect.trace.ranks import assemble, rank_dir

GOLDEN = Path(__file__).parent / "golden" / "compare"
ENV = {"device": "cpu", "packages": {"torch": {"version": "2.13.0", "path": "/a/torch"}}, "host": {"hostname": "h1"}}
Row = tuple[str, str, np.ndarray, "str | None"]
Edit = Callable[[int, list[Row]], list[Row]]


def _rows(k: int) -> list[Row]:
    """One step's records in chain order (the same values for the same step, whatever the trace)."""
    rng = np.random.default_rng(100 + k)
    return [
        ("input", "x", rng.standard_normal((4, 8)).astype(np.float32), None),
        ("activation", "fc1", rng.standard_normal((4, 16)).astype(np.float32), "Linear"),
        ("activation", "act", np.maximum(rng.standard_normal((4, 16)), 0).astype(np.float32), "ReLU"),
        ("loss", "loss", np.float32(rng.standard_normal()), None),
        ("grad", "fc1.weight", rng.standard_normal((16, 8)).astype(np.float32), None),
        ("grad", "fc1.bias", rng.standard_normal(16).astype(np.float32), None),
        ("param", "fc1.weight", rng.standard_normal((16, 8)).astype(np.float32), None),
        ("param", "fc1.bias", rng.standard_normal(16).astype(np.float32), None),
    ]


def _trace(path: Path, edit: Edit | None = None, *, steps: int = 3, store: bool = True, env: dict | None = None,
           lr: Callable[[int], float] = lambda k: 0.1) -> str:
    """A full trace of ``steps`` steps; ``edit(step, rows)`` changes what a step records."""
    with TraceWriter(path, command=["python", "train.py"], environment=env or ENV) as w:
        for k in range(steps):
            w.begin_step(k)
            rows = _rows(k)
            for kind, name, a, module in edit(k, rows) if edit else rows:
                w.record(record_array(name, kind, a, module=module), a if store else None)
            w.end_step({"loss": float(k), "grad_norm": 2.0 + k, "lr": [lr(k)]}, batch_ids=[2 * k, 2 * k + 1])
    return str(path)


def _at(step: int, kind: str, name: str, change: Callable[[np.ndarray], np.ndarray]) -> Edit:
    """An edit: at ``step``, record ``kind/name`` as ``change(its array)``."""

    def edit(k: int, rows: list[Row]) -> list[Row]:
        return [(c, n, change(a.copy()) if (k, c, n) == (step, kind, name) else a, m) for c, n, a, m in rows]

    return edit


def _bump(delta: float, at=(2, 3)) -> Callable[[np.ndarray], np.ndarray]:
    def change(a: np.ndarray) -> np.ndarray:
        a[at] += a.dtype.type(delta)
        return a

    return change


def _set(at, value) -> Callable[[np.ndarray], np.ndarray]:
    def change(a: np.ndarray) -> np.ndarray:
        a[at] = value
        return a

    return change


def _renamed(k: int, rows: list[Row]) -> list[Row]:
    return [(c, "fc1.w" if (c, n) == ("param", "fc1.weight") else n, a, m) for c, n, a, m in rows]


def _sentinel(path: Path, *, lr_from: int | None = None) -> str:
    """A sentinel-detail trace (batch, loss, scalars, parameters after each step)."""
    with TraceWriter(path, command=["python", "train.py"], environment=ENV,
                     policy={"detail": "sentinel", "state_every": 3}) as w:
        for k in range(4):
            w.begin_step(k)
            rng = np.random.default_rng(k)
            ids = np.asarray([2 * k, 2 * k + 1], dtype=np.int64)
            recs = [("batch", "ids", ids), ("batch", "data[0]", rng.standard_normal((2, 2)).astype(np.float32)),
                    ("loss", "loss", np.float32(1.0 / (k + 1))),
                    ("param", "fc.weight", rng.standard_normal((4, 2)).astype(np.float32)),
                    ("param", "fc.bias", rng.standard_normal(4).astype(np.float32))]
            for kind, name, a in recs:
                w.record(record_array(name, kind, a), None)
            lr = 0.2 if lr_from is not None and k >= lr_from else 0.1
            w.end_step({"loss": 1.0, "grad_norm": 2.5 + k, "lr": [lr], "scaler_scale": 65536.0}, batch_ids=ids.tolist())
    return str(path)


def _shard(path: Path, rank: int, world: int, bump: bool) -> None:
    """One rank's shard: input, loss, a DDP bucket (in: this rank's gradient, out: the reduced
    one), grad, param; ``bump``: rank 1's input differs at step 1 and so does what it reduces."""
    w = TraceWriter(path, command=["python", "train.py"], environment={**ENV, "distributed": {"world_size": world}},
                    extra={"distributed": {"rank": rank, "local_rank": rank, "world_size": world,
                                           "backend": "gloo", "device": "cpu"}})
    for k in range(2):
        rng, common = np.random.default_rng(100 * k + rank), np.random.default_rng(k)
        arrays = [("input", "x", rng.standard_normal((2, 4)).astype(np.float32), None),
                  ("loss", "loss", np.float32(rng.standard_normal()), None),
                  ("collective", "ddp.bucket0/in", rng.standard_normal(15).astype(np.float32),
                   {"op": "ddp_allreduce", "bucket": 0, "io": "in"}),
                  ("collective", "ddp.bucket0/out", common.standard_normal(15).astype(np.float32),
                   {"op": "ddp_allreduce", "bucket": 0, "io": "out"}),
                  ("grad", "fc.weight", common.standard_normal((3, 4)).astype(np.float32), None),
                  ("param", "fc.weight", common.standard_normal((3, 4)).astype(np.float32), None)]
        w.begin_step(k)
        for kind, name, a, meta in arrays:
            reduced = name.endswith("/out") or kind in ("grad", "param")  # the same on every rank
            if bump and k == 1 and (rank == 1 or reduced):
                a = a + np.float32(0.5)
            w.record(record_array(name, kind, a, meta=meta), a)
        w.end_step({}, batch_ids=[k * world * 2 + rank * 2, k * world * 2 + rank * 2 + 1])
    w.close("complete", outcome={"status": "ok", "detail": "ok"})


def _ranked(path: Path, bump: bool = False) -> str:
    for r in range(2):
        _shard(rank_dir(path, r), r, 2, bump)
    assemble(path, command=["torchrun", "train.py"], outcome={"status": "ok", "detail": "done"})
    return str(path)


def _cases(root: Path) -> dict[str, tuple[str, str, list[str], int]]:
    """name -> (trace A, trace B, extra compare flags, exit status)."""
    a = _trace(root / "a")
    env2 = {**ENV, "packages": {"torch": {"version": "2.14.0", "path": "/a/torch"}}}
    return {
        "identical": (a, _trace(root / "same"), [], 0),
        "diverged": (a, _trace(root / "grad", _at(1, "grad", "fc1.weight", _bump(1e-3))), [], 1),
        "diverged_auto_default": (a, _trace(root / "env2", _at(1, "activation", "fc1", _bump(1e-2)), env=env2), [], 1),
        "within_tolerance": (a, _trace(root / "tiny", _at(1, "param", "fc1.weight", _bump(1e-6))),
                             ["--tolerance", "default"], 0),
        "within_tolerance_bitwise": (a, _trace(root / "tiny2", _at(1, "param", "fc1.weight", _bump(1e-6))), [], 1),
        "explicit_override": (a, _trace(root / "grad2", _at(0, "grad", "fc1.bias", _bump(1e-4, at=(3,)))),
                              ["--atol", "1e-3", "--override", "grad/*=bitwise"], 1),
        "renamed_param": (a, _trace(root / "renamed", _renamed), [], 1),
        "shape": (a, _trace(root / "shape", _at(2, "activation", "act", lambda x: x[:, :8].copy())), [], 1),
        "dtype": (a, _trace(root / "dtype", _at(0, "activation", "act", lambda x: x.astype(np.float16))), [], 1),
        "nan_same_position": (_trace(root / "nan_a", _at(1, "activation", "fc1", _set((1, 2), np.nan))),
                              _trace(root / "nan_b", _at(1, "activation", "fc1", _set((1, 2), np.nan))),
                              ["--tolerance", "default"], 0),
        "nan_moved": (_trace(root / "nan_c", _at(1, "activation", "fc1", _set((1, 2), np.nan))),
                      _trace(root / "nan_d", _at(1, "activation", "fc1", _set((3, 5), np.nan))),
                      ["--tolerance", "default"], 1),
        "negative_zero_bitwise": (_trace(root / "z_a", _at(0, "grad", "fc1.bias", _set((5,), 0.0))),
                                  _trace(root / "z_b", _at(0, "grad", "fc1.bias", _set((5,), -0.0))), [], 1),
        "negative_zero_default": (_trace(root / "z_c", _at(0, "grad", "fc1.bias", _set((5,), 0.0))),
                                  _trace(root / "z_d", _at(0, "grad", "fc1.bias", _set((5,), -0.0))),
                                  ["--tolerance", "default"], 0),
        "not_stored": (_trace(root / "ns_a", store=False),
                       _trace(root / "ns_b", _at(1, "grad", "fc1.weight", _bump(5.0)), store=False),
                       ["--tolerance", "default"], 1),
        "not_stored_tiny": (_trace(root / "ns_c", store=False),
                            _trace(root / "ns_d", _at(1, "grad", "fc1.weight", _bump(1e-6)), store=False),
                            ["--tolerance", "default"], 1),
        "missing_step": (a, _trace(root / "short", steps=2), [], 1),
        "lr_differs": (a, _trace(root / "lr", _at(1, "param", "fc1.weight", _bump(1e-2)), lr=lambda k: 0.1 * (k + 1)),
                       [], 1),
        "sentinel": (_sentinel(root / "sa"), _sentinel(root / "sb", lr_from=2), [], 1),
        "sentinel_vs_full": (_sentinel(root / "sc"), _trace(root / "full4", steps=4), [], 1),
        "ranks_agree": (_ranked(root / "ra"), _ranked(root / "rb"), [], 0),
        "ranks_diverged": (_ranked(root / "rc"), _ranked(root / "rd", bump=True), [], 1),
        "ranks_vs_flat": (_ranked(root / "re"), _trace(root / "flat", steps=2), [], 1),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> tuple[Path, dict[str, tuple[str, str, list[str], int]]]:
    root = tmp_path_factory.mktemp("cmp")
    return root, _cases(root)


def _check(name: str, text: str, root: Path) -> None:
    text = text.replace(str(root), "<tmp>")
    path = GOLDEN / name
    if os.environ.get("REPROBISECT_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden {path}; write it with REPROBISECT_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name} changed"


def test_every_case_has_its_goldens(cases):
    """Each case's text and JSON are pinned, and no golden is left without a case."""
    _, built = cases
    want = {f"{n}.{ext}" for n in built for ext in ("txt", "json")}
    if not os.environ.get("REPROBISECT_REGEN_GOLDEN"):
        assert {p.name for p in GOLDEN.iterdir()} == want


@pytest.mark.parametrize("name", [
    "identical", "diverged", "diverged_auto_default", "within_tolerance", "within_tolerance_bitwise",
    "explicit_override", "renamed_param", "shape", "dtype", "nan_same_position", "nan_moved",
    "negative_zero_bitwise", "negative_zero_default", "not_stored", "not_stored_tiny", "missing_step",
    "lr_differs", "sentinel", "sentinel_vs_full", "ranks_agree", "ranks_diverged", "ranks_vs_flat",
])
def test_compare_output_is_pinned(cases, name, capsys):
    root, built = cases
    a, b, flags, code = built[name]
    assert main(["compare", a, b, *flags]) == code
    out = capsys.readouterr()
    assert out.err == ""
    _check(f"{name}.txt", out.out, root)
    assert main(["compare", a, b, *flags, "--json"]) == code
    _check(f"{name}.json", capsys.readouterr().out, root)
