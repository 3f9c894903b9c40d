#!/usr/bin/env python
"""Train ResNet-20 or Inception-BN on CIFAR-10 with any of this project's algorithms.

CIFAR-10 is not downloaded: put the binary files (data_batch_1.bin ...
data_batch_5.bin, test_batch.bin from cifar-10-binary.tar.gz) in --data-dir
(default ~/.mxnet/datasets/cifar10), or use --synthetic for throughput runs.

Examples::

    python -m mxnet_cpsgd.launch -n 2 -s 1 -- \\
        python scripts/train_cifar.py --algorithm cpsgd --data-dir ~/data/cifar10
    python scripts/train_cifar.py --algorithm local --synthetic --max-iters 20

See docs/training.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mxnet_cpsgd.training import common, options  # noqa: E402

# GluonCV's CIFAR-10 recipe for ResNet-20 (per worker: batch 128 per device)
DEFAULTS = {
    "num_epochs": 200,
    "batch_size": 128,
    "lr": 0.1,
    "momentum": 0.9,
    "wd": 1e-4,
    "lr_decay": 0.1,
    "lr_decay_epoch": "100,150",
    "val_split": "shard",
}


def get_parser():
    """The script's argument parser (GluonCV style)."""
    return options.build_parser(
        "Train ResNet-20 / Inception-BN on CIFAR-10 with CP-SGD and related algorithms.",
        DEFAULTS, datasets=("cifar10",),
        models=("cifar_resnet20_v1", "cifar_inception_bn"))


if __name__ == "__main__":
    sys.exit(common.main(get_parser()))
