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
