#!/usr/bin/env bash
# An earlier run of the script left ckpts/last.ckpt in the folder (as in the thread: a second
# run in the same folder), so the runs under test write last-v1.ckpt beside it.
set -euo pipefail
python train.py --max_steps 2 >/dev/null 2>&1
test -f ckpts/last.ckpt
