#!/usr/bin/env bash
# Set up .venv if needed, then run the whole test suite (extra args go to pytest).
#   ./scripts/test.sh            everything (CI), on every core (pytest-xdist, a module per worker)
#   ./scripts/test.sh --fast     the inner loop: no slow/Ray/torchrun/heavy test (tests/conftest.py)
#   ./scripts/test.sh --store-durations   a full run that refreshes tests/durations.json for --fast
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export RAY_AUTH_MODE=disabled DVC_NO_ANALYTICS=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONHASHSEED=0
# REPROBISECT_TEST_JOBS=1 runs in one process (a debugger, -x, -s); default: the cores, at most 4
jobs=${REPROBISECT_TEST_JOBS:-$(n=$(nproc 2>/dev/null || echo 1); [ "$n" -gt 4 ] && n=4; echo "$n")}
par=()
[ "$jobs" -gt 1 ] && par=(-n "$jobs" --dist loadfile --no-loadscope-reorder)
exec .venv/bin/python -m pytest -q -p no:cacheprovider "${par[@]}" "$@"
