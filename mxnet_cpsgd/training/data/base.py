"""What every data source shares: the data set names, the error for missing or
malformed files, the description of a loaded data set, default directories and
normalisation constants.
"""
import os
from dataclasses import dataclass
from typing import Optional, Tuple


MNIST_DATASETS = ("mnist-5k", "mnist", "fashion-mnist")
FASHION_MNIST_SYSTEM_DIR = "/usr/share/datasets/fashion-mnist"
MNIST_DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".mxnet", "datasets", "mnist")
CIFAR10_DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".mxnet", "datasets", "cifar10")

MEAN_STD = {
    "mnist-5k": ((0.1307,), (0.3081,)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
}

class DataError(RuntimeError):
    """A data set is missing, incomplete or malformed; the message says how to fix it."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the training loop needs to know about a data set.

    Args:
        name: data set name, e.g. ``'mnist-5k'``.
        num_classes: number of classes.
        shape: shape of one sample, ``(C, H, W)``.
        num_train: training samples in the whole set (all workers).
        num_val: validation samples in the whole set.
        train_per_worker: training samples each worker uses per epoch (after
            sharding and dropping the remainder).
        val_per_worker: validation samples this worker evaluates.
    """
    name: str
    num_classes: int
    shape: Tuple[int, int, int]
    num_train: int
    num_val: int
    train_per_worker: int
    val_per_worker: int


def default_data_dir(dataset: str) -> Optional[str]:
    """The directory a data set is read from when ``--data-dir`` is not given."""
    if dataset == "fashion-mnist":
        return FASHION_MNIST_SYSTEM_DIR
    if dataset == "mnist":
        return MNIST_DEFAULT_DIR
    if dataset == "cifar10":
        return CIFAR10_DEFAULT_DIR
    return None
