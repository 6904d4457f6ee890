#!/usr/bin/env bash
# The checks that need a GPU, in one call on a GPU machine whose python already has torch
# (run from the repository root; no install: PYTHONPATH points at this checkout).
# Writes logs under ${OUT:-out/device}. CI has no GPU: there tests/test_cuda.py skips.
set -uo pipefail
out=${OUT:-out/device}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 REPROBISECT_CACHE_DIR=${REPROBISECT_CACHE_DIR:-/tmp/rb-cache}
{ nvidia-smi -L; python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'; nproc; grep -m1 "model name" /proc/cpuinfo; } 2>&1 | tee "$out/machine.txt"
python3 -m reprobisect.native -v 2>&1 | tee "$out/native.txt"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_fingerprint.py tests/test_batched_fingerprint.py tests/test_recorder_ops.py 2>&1 | tee "$out/tests.txt" | tail -25
# issue 12's figures: per model full / sentinel / detect_anomaly / floor ratios, then the
# fingerprint throughput as a fraction of a same-run device-to-device copy of the same bytes
timeout 200 python3 scripts/bench/bench_recorder.py --device cuda --rounds 3 --steps 4 --json 2>&1 | tee "$out/bench_cuda.json"
timeout 60 python3 scripts/bench/bench_recorder.py --device cuda --throughput 2>&1 | tee "$out/throughput_cuda.json"
timeout 150 python3 scripts/bench/bench_recorder.py --rounds 2 --steps 3 2>&1 | tee "$out/bench_cpu.txt"
