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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    import json

    durations = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    slow_tests, slow_modules = _too_slow(durations)
    keep, drop = [], []
    for item in items:
        marked = any(item.get_closest_marker(m) for m in _FAST_EXCLUDED_MARKS)
        measured = item.nodeid in slow_tests or _module(item.nodeid) in slow_modules
        (drop if marked or measured else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_TIMES: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TIMES.setdefault(report.nodeid, {})[report.when] = round(report.duration, 3)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.getoption("--store-durations", default=False) or not _TIMES:
        return
    import json

    old = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    old.update(_TIMES)
    tmp = DURATIONS.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(old.items())), indent=0) + "\n")
    tmp.replace(DURATIONS)
