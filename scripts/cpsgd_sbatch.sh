#!/bin/bash
# A Slurm batch script that runs a cpsgd-launch job on the nodes it is given:
# copy it, adjust the #SBATCH lines (or give them to sbatch), and submit
#
#     sbatch cpsgd_sbatch.sh [cpsgd-launch options] -- python train.py ARGS...
#
# e.g.  sbatch -N 4 cpsgd_sbatch.sh --max-restarts 3 -- python train.py --checkpoint-dir ckpt
#
# cpsgd-launch runs on the first node with the scheduler; one server per node
# and one worker per task (-s and -n override), every one a job step (srun).
# The working directory and the interpreter must be the same path on every node
# (a shared file system); CPSGD_PYTHON picks the interpreter (default python3).
#SBATCH --job-name=cpsgd
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
set -euo pipefail
if [ $# -eq 0 ]; then
    echo "usage: sbatch $0 [cpsgd-launch options] -- COMMAND ARGS..." >&2
    exit 2
fi
exec "${CPSGD_PYTHON:-python3}" -m mxnet_cpsgd.launch --launcher slurm "$@"
