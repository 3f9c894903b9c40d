"""ImageNet RecordIO: checking the files and the sharded ``ImageRecordIter``
loaders with GluonCV's augmentation.
"""
import os
from typing import Optional

import mxnet as mx

from .base import DataError, DatasetInfo
from .loaders import DataIterLoader, FixedLengthLoader, check_batches


IMAGENET_FILES = ("train.rec", "train.idx", "val.rec", "val.idx")
IMAGENET_MEAN_RGB = (123.68, 116.779, 103.939)
IMAGENET_STD_RGB = (58.393, 57.12, 57.375)

# ----------------------------------------------------------------------------
# ImageNet RecordIO

def check_imagenet(data_dir: Optional[str]) -> str:
    """Check that ``train.rec``/``train.idx``/``val.rec``/``val.idx`` exist.

    Raises:
        DataError: naming the missing files and how to make them.
    """
    if not data_dir:
        raise DataError("imagenet: pass --data-dir, the directory holding %s"
                        % ", ".join(IMAGENET_FILES))
    missing = [f for f in IMAGENET_FILES if not os.path.isfile(os.path.join(data_dir, f))]
    if missing:
        raise DataError(
            "imagenet: missing %s in %s. Pack ImageNet into RecordIO files named %s "
            "(e.g. with MXNet's tools/im2rec.py or GluonCV's imagenet/im2rec.py, "
            "--pass-through or resized to 480 px shorter side) and pass that "
            "directory as --data-dir" % (", ".join(missing), os.path.abspath(data_dir),
                                         ", ".join(IMAGENET_FILES)))
    return data_dir


def _count_idx(path: str) -> int:
    with open(path) as f:
        return sum(1 for line in f if line.strip())

def imagenet_loaders(data_dir: Optional[str], batch_size: int, rank: int, num_workers: int,
              seed: int, val_shard: bool, num_data_workers: int, input_size: int):
    data_dir = check_imagenet(data_dir)
    num_train = _count_idx(os.path.join(data_dir, "train.idx"))
    num_val = _count_idx(os.path.join(data_dir, "val.idx"))
    per_worker = num_train // num_workers
    check_batches("imagenet", per_worker, batch_size, num_workers)
    num_batches = per_worker // batch_size
    norm = dict(mean_r=IMAGENET_MEAN_RGB[0], mean_g=IMAGENET_MEAN_RGB[1],
                mean_b=IMAGENET_MEAN_RGB[2], std_r=IMAGENET_STD_RGB[0],
                std_g=IMAGENET_STD_RGB[1], std_b=IMAGENET_STD_RGB[2])
    jitter, lighting = 0.4, 0.1
    train_iter = mx.io.ImageRecordIter(
        path_imgrec=os.path.join(data_dir, "train.rec"),
        path_imgidx=os.path.join(data_dir, "train.idx"),
        preprocess_threads=num_data_workers, shuffle=True, seed=seed + rank,
        batch_size=batch_size, data_shape=(3, input_size, input_size),
        rand_mirror=True, random_resized_crop=True,
        max_aspect_ratio=4. / 3., min_aspect_ratio=3. / 4.,
        max_random_area=1, min_random_area=0.08,
        brightness=jitter, saturation=jitter, contrast=jitter, pca_noise=lighting,
        num_parts=num_workers, part_index=rank, verbose=False, ctx="cpu", **norm)
    val_parts = (num_workers, rank) if val_shard else (1, 0)
    # ImageRecordIter's parts are about, not exactly, equal: an estimate for logging
    val_count = -(-num_val // num_workers) if val_shard else num_val

    def make_val_iter() -> mx.io.DataIter:
        return mx.io.ImageRecordIter(
            path_imgrec=os.path.join(data_dir, "val.rec"),
            path_imgidx=os.path.join(data_dir, "val.idx"),
            preprocess_threads=num_data_workers, shuffle=False, batch_size=batch_size,
            resize=int(round(input_size / 0.875)), data_shape=(3, input_size, input_size),
            num_parts=val_parts[0], part_index=val_parts[1], round_batch=True,
            verbose=False, ctx="cpu", **norm)

    train = FixedLengthLoader(train_iter, num_batches, batch_size)
    val = DataIterLoader(make_val_iter, val_count, batch_size)
    info = DatasetInfo("imagenet", 1000, (3, input_size, input_size), num_train, num_val,
                       train.num_samples, val_count)
    return train, val, info
