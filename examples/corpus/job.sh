#!/usr/bin/env bash
# A cluster job script around one training command: a peer-corpus script.
#
# Style imitated: the sbatch/qsub job scripts of HPC clusters (strict bash, environment
# set up, a log line, the training command with its arguments, a post-processing line).
# Written for this corpus. It runs the corpus script named by TRAIN_SCRIPT (default
# mingpt_trainer.py, whose DataLoader workers are processes too) with the job's arguments;
# reprobisect records the one python process that trains (the workers leave nothing):
#
#     bisect capture -o job.trace -- bash job.sh --seed 3
set -euo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "job: starting training on $(hostname)"
python "${TRAIN_SCRIPT:-mingpt_trainer.py}" "$@"
echo "job: done"
