"""Shared test setup: a private HOME and quiet, analytics-free tools for every test.

Set at import so subprocesses started by tests (launcher, git, Ray workers) inherit it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="reprobisect-test-home-"))
os.environ.update(
    {
        "HOME": str(_HOME),
        "KERAS_HOME": str(_HOME / ".keras"),
        "MPLCONFIGDIR": str(_HOME / ".mpl"),
        "RAY_AUTH_MODE": "disabled",
        "DVC_NO_ANALYTICS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "GIT_AUTHOR_NAME": "Test Author",
        "GIT_AUTHOR_EMAIL": "author@example.com",
        "GIT_COMMITTER_NAME": "Test Author",
        "GIT_COMMITTER_EMAIL": "author@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
)
(_HOME / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


# ---------------------------------------------------------------- the fast tier
#
# ``./scripts/test.sh --fast`` (pytest ``--fast``) is the inner loop: unit tests and the
# fake-executor tests, no real training run of a heavy framework, no Ray cluster, no
# torchrun. A test is left out when it is marked ``slow``/``ray``/``cuda``/``heavy``, or when
# tests/durations.json (written by a full run with ``--store-durations``) says it, or the
# module fixtures it shares, took more than FAST_LIMIT_S. A new test not in the file runs
# until the next full run measures it.

DURATIONS = Path(__file__).parent / "durations.json"
FAST_LIMIT_S = 2.0
_FAST_EXCLUDED_MARKS = ("slow", "ray", "cuda", "heavy")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "heavy: trains a heavy framework for real or needs torchrun (not in the fast tier)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("reprobisect")
    group.addoption("--fast", action="store_true", help="the fast tier: skip slow, Ray, torchrun and heavy tests")
    group.addoption("--store-durations", action="store_true",
                    help=f"write every test's duration to {DURATIONS.name} (after a full run)")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _too_slow(durations: dict[str, dict[str, float]]) -> tuple[set[str], set[str]]:
    """(test ids over the limit, modules whose shared fixtures alone are over it)."""
    slow_tests = {k for k, v in durations.items() if v.get("setup", 0) + v.get("call", 0) > FAST_LIMIT_S}
    slow_modules = {_module(k) for k, v in durations.items() if v.get("setup", 0) > FAST_LIMIT_S}
    return slow_tests, slow_modules


def _durations() -> dict[str, dict[str, float]]:
    import json

    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--fast"):
        _keep_fast(config, items)
    if getattr(config.option, "dist", "no") != "no":
        _heaviest_modules_first(items)


def _keep_fast(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_tests, slow_modules = _too_slow(_durations())
    keep, drop = [], []
    for item in items:
        marked = any(item.get_closest_marker(m) for m in _FAST_EXCLUDED_MARKS)
        measured = item.nodeid in slow_tests or _module(item.nodeid) in slow_modules
        (drop if marked or measured else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# ---------------------------------------------------------------- two workers (pytest-xdist)
#
# ./scripts/test.sh runs the suite on every core with ``--dist loadfile --no-loadscope-reorder``:
# a module stays on one worker (its module-scoped fixtures, e.g. the one Ray cluster of
# test_executor_ray, are set up once), and the modules go out heaviest first (measured in
# tests/durations.json) so no worker is left alone with a long module at the end. Every
# worker collects and sorts the same way, as xdist requires.

_UNMEASURED_S = 30.0  # a module the durations file has not measured yet: assume a middling one


def _heaviest_modules_first(items: list[pytest.Item]) -> None:
    cost: dict[str, float] = {}
    for nodeid, times in _durations().items():
        cost[_module(nodeid)] = cost.get(_module(nodeid), 0.0) + sum(times.values())
    rank = {m: (-cost.get(m, _UNMEASURED_S), m) for m in {_module(i.nodeid) for i in items}}
    items.sort(key=lambda item: rank[_module(item.nodeid)])  # stable: a module keeps its own order


_TIMES: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TIMES.setdefault(report.nodeid, {})[report.when] = round(report.duration, 3)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.getoption("--store-durations", default=False) or not _TIMES:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller gets every report and writes once
        return
    import json

    old = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    old.update(_TIMES)
    tmp = DURATIONS.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(old.items())), indent=0) + "\n")
    tmp.replace(DURATIONS)
