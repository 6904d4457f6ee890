#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export RAY_AUTH_MODE=disabled DVC_NO_ANALYTICS=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONHASHSEED=0
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
