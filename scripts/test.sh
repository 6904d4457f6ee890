#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export RAY_AUTH_MODE=disabled DVC_NO_ANALYTICS=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONHASHSEED=0
# two workers (pytest-xdist), each test module whole on one of them (tests/conftest.py's
# scheduler; Ray's modules share one scope): most of the suite waits on subprocesses, so two
# workers fill both cores. REPROBISECT_TEST_WORKERS=0 runs everything in this process.
workers=${REPROBISECT_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" "$@"
