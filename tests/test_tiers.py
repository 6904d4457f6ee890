"""The fast tier (``./scripts/test.sh --fast``): what it leaves out, from marks and measured durations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import DURATIONS, FAST_LIMIT_S, _too_slow

ROOT = Path(__file__).resolve().parents[1]


def test_a_test_or_a_module_fixture_over_the_limit_is_left_out():
    over, under = FAST_LIMIT_S + 0.5, FAST_LIMIT_S / 4
    durations = {
        "tests/test_a.py::test_quick": {"setup": under, "call": under},
        "tests/test_a.py::test_slow_call": {"setup": 0.0, "call": over},
        "tests/test_b.py::test_first": {"setup": over, "call": 0.0},  # a module fixture paid here
        "tests/test_b.py::test_second": {"setup": 0.0, "call": under},
    }
    tests, modules = _too_slow(durations)
    assert tests == {"tests/test_a.py::test_slow_call", "tests/test_b.py::test_first"}
    assert modules == {"tests/test_b.py"}


def test_the_durations_file_covers_the_suite_and_the_tier_leaves_out_the_heavy_parts():
    measured = json.loads(DURATIONS.read_text())
    assert len(measured) > 1500
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--fast",
                          "tests/test_executor_ray.py", "tests/test_bugreports.py", "tests/test_search.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    kept = [ln for ln in out.splitlines() if "::" in ln]
    assert kept and all(ln.startswith("tests/test_search.py::") for ln in kept), kept[:5]
