#!/usr/bin/env bash
# Set up .venv if needed, then run the main job on its embedded default: `bisect demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/bisect demo "$@"
