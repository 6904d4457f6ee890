#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (extra args go to pytest).
#   ./scripts/test.sh            everything (CI): ~25 minutes on 2 cores
#   ./scripts/test.sh --fast     the inner loop: no slow/Ray/torchrun/heavy test (tests/conftest.py)
#   ./scripts/test.sh --store-durations   a full run that refreshes tests/durations.json for --fast
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export RAY_AUTH_MODE=disabled DVC_NO_ANALYTICS=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONHASHSEED=0
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
