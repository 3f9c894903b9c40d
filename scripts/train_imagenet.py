#!/usr/bin/env python
"""Train ResNet-50 v1 on ImageNet (RecordIO) with any of this project's algorithms.

ImageNet is not downloaded: pack it into train.rec/train.idx/val.rec/val.idx
(MXNet's tools/im2rec.py or GluonCV's im2rec.py) in --data-dir, or use
--synthetic for throughput runs.

Examples::

    python -m mxnet_cpsgd.launch -n 4 -s 4 -H hosts -- \\
        python scripts/train_imagenet.py --algorithm cpsgd --gpus 0 --data-dir /data/rec
    python scripts/train_imagenet.py --algorithm local --synthetic --max-iters 5 \\
        --batch-size 8

See docs/training.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mxnet_cpsgd.training import common, options  # noqa: E402

# GluonCV's ResNet-50 v1 recipe (lr 0.1 per 256 images, cosine) with a per-worker
# batch of 32 (the CP-SGD paper's setting): lr = 0.1 * 32 / 256 per worker; the
# servers sum the workers' gradients, so M workers step with lr * M for batch 32 * M
DEFAULTS = {
    "num_epochs": 120,
    "batch_size": 32,
    "lr": 0.0125,
    "momentum": 0.9,
    "wd": 1e-4,
    "lr_mode": "cosine",
    "lr_decay_epoch": "40,60",
    "val_split": "shard",
    "synthetic_batches": 20,
}


def get_parser():
    """The script's argument parser (GluonCV style)."""
    parser = options.build_parser(
        "Train ResNet-50 v1 on ImageNet with CP-SGD and related algorithms.",
        DEFAULTS, datasets=("imagenet",), models=("resnet50_v1",))
    parser.add_argument("--input-size", type=int, default=224,
                        help="size of the input crop")
    return parser


if __name__ == "__main__":
    sys.exit(common.main(get_parser()))
