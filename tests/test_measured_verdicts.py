"""A verdict is measured, and the first cause comes first (issue 36, items 3 and 5).

Item 3: under a value tolerance, bits that differ with no tensor stored on either side are
``inconclusive`` ("bits differ, size not measured") unless the recorded stats prove the
difference beyond the tolerance (then ``diverged``, measured from the stats) or NaN/Inf
counts differ; never an unmeasured DIVERGED. ``compare`` exits 1 (not agree); a probe
judging ``match``/``repro`` says ``skip`` (125), never ``bad``. Under the bitwise
tolerance a bit difference is the measure.

Item 5: when step 0's initial parameters differ and so do its batch IDs, the walk names
the initialisation first (it happens before the first batch is drawn) and the data order
as what followed it, in the text and in ``--json``.

Every trace is written through the writer API (no framework); the CLI is the real one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from reprobisect.cli import main
from reprobisect.core.compare import compare_paths
from reprobisect.core.compare.tolerance import Tolerance
from reprobisect.core.outcome import Outcome
from reprobisect.core.verdict import classify
from reprobisect.trace import TraceWriter, record_array

ENV = {"device": "cpu", "host": {"hostname": "h1"}}
Change = Callable[[int, str, str, np.ndarray], np.ndarray]


def _same(k: int, kind: str, name: str, a: np.ndarray) -> np.ndarray:
    return a


def _trace(path: Path, change: Change = _same, *, store: bool = False, steps: int = 3, init: bool = False,
           ids: Callable[[int], list[int]] = lambda k: [2 * k, 2 * k + 1]) -> str:
    """A trace of ``steps`` steps (input, loss, grad, param); ``change`` edits a record's array;
    ``init``: step 0 records the initial parameters first, as the recorders do."""
    with TraceWriter(path, command=["python", "train.py"], environment=ENV) as w:
        for k in range(steps):
            w.begin_step(k)
            rng = np.random.default_rng(10 + k)
            rows = [("input", "x", rng.standard_normal((4, 8)).astype(np.float32)),
                    ("loss", "loss", np.float32(1.0 + rng.standard_normal() ** 2)),
                    ("grad", "w", rng.standard_normal((16, 8)).astype(np.float32)),
                    ("param", "w", rng.standard_normal((16, 8)).astype(np.float32))]
            if init and k == 0:
                rows.insert(0, ("init", "w", np.random.default_rng(7).standard_normal((16, 8)).astype(np.float32)))
            for kind, name, a in rows:
                a = change(k, kind, name, a.copy())
                w.record(record_array(name, kind, a), a if store else None)
            w.end_step({"loss": float(k), "lr": [0.1]}, batch_ids=ids(k))
    return str(path)


def _bump(step: int, kind: str, delta: float, name: str = "w") -> Change:
    def change(k: int, c: str, n: str, a: np.ndarray) -> np.ndarray:
        if (k, c, n) == (step, kind, name):
            a[2, 3] += a.dtype.type(delta)
        return a

    return change


def _nan(k: int, c: str, n: str, a: np.ndarray) -> np.ndarray:
    if (k, c, n) == (1, "grad", "w"):
        a[0, 0] = np.nan
    return a


DEFAULT = ["--tolerance", "default"]


# ------------------------------------------------------------------ item 3: measured or inconclusive


def test_unmeasured_bits_are_inconclusive_not_diverged(tmp_path, capsys):
    a = _trace(tmp_path / "a")
    b = _trace(tmp_path / "b", _bump(1, "grad", 1e-6))
    comp = compare_paths(a, b, tolerance=Tolerance(mode="default"))
    assert comp.verdict == "inconclusive" and not comp
    assert comp.first.verdict == "inconclusive" and comp.unmeasured == comp.divergences == 1
    assert main(["compare", a, b, *DEFAULT]) == 1  # not agreement: exit 1, as audit's inconclusive fails
    out = capsys.readouterr().out
    assert "DIVERGED" not in out
    assert out.splitlines()[-1] == ("verdict: INCONCLUSIVE at step 1 (grad w): bits differ, size not measured "
                                    "(no tensor stored); re-run with --full-steps 1 or compare --zoom")
    assert main(["compare", a, b, *DEFAULT, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "inconclusive" and data["unmeasured"] == 1
    assert data["first"]["diff"]["detail"] == "bits differ, size not measured (no tensor stored)"


def test_the_same_difference_measured_from_tensors_is_within_tolerance(tmp_path, capsys):
    """One question, one answer: stored, the tiny difference measures as close (agree)."""
    a = _trace(tmp_path / "a", store=True)
    b = _trace(tmp_path / "b", _bump(1, "grad", 1e-6), store=True)
    assert main(["compare", a, b, *DEFAULT]) == 0
    assert "verdict: AGREE" in capsys.readouterr().out


def test_stats_that_prove_the_difference_give_a_measured_divergence(tmp_path, capsys):
    a = _trace(tmp_path / "a")
    b = _trace(tmp_path / "b", _bump(1, "grad", 50.0))  # the max moves by far more than any tolerance allows
    comp = compare_paths(a, b, tolerance=Tolerance(mode="default"))
    assert comp.verdict == "diverged" and comp.unmeasured == 0
    assert comp.first.diff.source == "stats"
    assert "more than any within-tolerance change allows" in comp.first.diff.detail
    assert main(["compare", a, b, *DEFAULT]) == 1
    assert "verdict: DIVERGED at step 1 (grad w)" in capsys.readouterr().out


def test_nan_counts_apart_are_a_measured_divergence(tmp_path):
    comp = compare_paths(_trace(tmp_path / "a"), _trace(tmp_path / "b", _nan), tolerance=Tolerance(mode="default"))
    assert comp.verdict == "diverged"
    assert comp.first.diff.detail.startswith("NaN/Inf counts differ (NaN 0 vs 1")


def test_bitwise_tolerance_measures_by_bits(tmp_path):
    comp = compare_paths(_trace(tmp_path / "a"), _trace(tmp_path / "b", _bump(1, "grad", 1e-6)),
                         tolerance=Tolerance(mode="bitwise"))
    assert comp.verdict == "diverged" and comp.unmeasured == 0


def test_a_later_measured_divergence_makes_it_diverged_and_is_named(tmp_path, capsys):
    def both(k: int, c: str, n: str, a: np.ndarray) -> np.ndarray:
        return _bump(2, "param", 50.0)(k, c, n, _bump(1, "grad", 1e-6)(k, c, n, a))

    a, b = _trace(tmp_path / "a"), _trace(tmp_path / "b", both)
    comp = compare_paths(a, b, tolerance=Tolerance(mode="default"))
    assert comp.verdict == "diverged" and comp.first.verdict == "inconclusive"
    assert comp.first_measured is not None and (comp.first_measured.step, comp.first_measured.kind) == (2, "param")
    assert main(["compare", a, b, *DEFAULT]) == 1
    out = capsys.readouterr().out
    assert ("  (the first difference is not measured; the first one measured beyond the tolerance: "
            "step 2 · param · w · from stats:") in out


class _Done:
    """A probe's result as ``classify`` reads it: an ok run and its trace."""

    def __init__(self, trace: str) -> None:
        self.outcome, self.trace_dir, self.spec = Outcome("ok"), trace, None


def test_a_probe_with_only_unmeasured_differences_is_skipped_not_bad(tmp_path):
    ref = _trace(tmp_path / "ref")
    v = classify(_Done(_trace(tmp_path / "tiny", _bump(1, "grad", 1e-6))), "match", ref, "default")
    assert v.verdict == "skip" and v.exit_code == 125
    assert v.reason.startswith("inconclusive: differs from the reference in bits at step 1, grad 'w'")
    assert "--full-steps 1" in v.reason
    big = classify(_Done(_trace(tmp_path / "big", _bump(1, "grad", 50.0))), "match", ref, "default")
    assert big.verdict == "bad" and big.exit_code == 1


# ------------------------------------------------------------------ item 5: the first cause comes first


def _init_changed(k: int, c: str, n: str, a: np.ndarray) -> np.ndarray:
    return a + np.float32(0.5) if c in ("init", "param") else a


def _shuffled(k: int) -> list[int]:
    return [2 * k + 1, 2 * k] if k == 0 else [2 * k, 2 * k + 1]


def test_a_changed_init_is_named_first_and_the_data_order_as_what_followed(tmp_path, capsys):
    a = _trace(tmp_path / "a", init=True, store=True)
    b = _trace(tmp_path / "b", _init_changed, init=True, store=True, ids=_shuffled)
    comp = compare_paths(a, b)
    assert (comp.first.step, comp.first.kind, comp.first.name) == (0, "init", "w")
    order = [d for d in comp.next if d.kind == "batch"]
    assert order and order[0].localization == "followed_init" and not order[0].origin
    assert main(["compare", a, b]) == 1
    out = capsys.readouterr().out
    assert "verdict: DIVERGED at step 0 (init w)" in out
    assert ("    ↳ then the data order differs too (step 0: batch IDs differ (first at position 0: 0 vs 1)): it followed the "
            "initialisation — did the initialisation draw from the global RNG before the loader shuffled?") in out
    assert main(["compare", a, b, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["first"]["kind"] == "init"
    assert data["next"][0]["kind"] == "batch" and data["next"][0]["localization"] == "followed_init"


def test_the_data_order_alone_is_still_the_first_divergence(tmp_path):
    comp = compare_paths(_trace(tmp_path / "a", init=True), _trace(tmp_path / "b", init=True, ids=_shuffled))
    assert (comp.first.kind, comp.first.localization, comp.first.origin) == ("batch", "first", True)


@pytest.mark.parametrize("check", ["repro"])
def test_seeds_style_bitwise_compare_names_the_init(tmp_path, check):
    """``seeds`` and ``audit`` compare bitwise through ``compare_results``: the init comes first there too."""
    from reprobisect.core.verdict import compare_results

    comp = compare_results(_trace(tmp_path / "a", init=True), _trace(tmp_path / "b", _init_changed, init=True,
                                                                      ids=_shuffled), "bitwise")
    assert comp.first.kind == "init"
    v = classify(_Done(str(tmp_path / "b")), check, _Done(str(tmp_path / "a")), "bitwise")
    assert v.verdict == "bad" and "step 0, init 'w'" in v.reason
