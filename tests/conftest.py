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


# --- running on several workers (pytest-xdist; scripts/test.sh passes -n 2) ---
# Each test module runs whole on one worker, so its module-scoped fixtures (recorded runs,
# repositories, a Ray cluster) are built once. The modules that start Ray share one scope: two
# local Ray instances on one machine can find each other, so they never run at the same time.
# (A scheduler of our own, not ``--dist loadgroup``: pytest 9.2 ignores the node-id suffix that
# xdist 3.8's loadgroup relies on.)
_RAY_MODULES = {"test_executor_ray", "test_audit"}


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if path.rsplit("/", 1)[-1].removesuffix(".py") in _RAY_MODULES else path

    return ModuleScheduling(config, log)
