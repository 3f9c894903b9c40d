"""Sharding a data set across workers and batching it: in-memory arrays,
synthetic tensors, and wrappers of MXNet data iterators with a fixed number of
batches per epoch.
"""
from typing import Callable, Iterator, Optional, Sequence, Tuple

import numpy as np

import mxnet as mx

from .base import DataError


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
    check_rank(rank, num_workers)
    order = (np.random.RandomState(seed).permutation(num_samples) if shuffle
             else np.arange(num_samples))
    per_worker = num_samples // num_workers
    return order[rank * per_worker:(rank + 1) * per_worker].astype(np.int64)


def strided_indices(num_samples: int, rank: int, num_workers: int) -> np.ndarray:
    """Indices ``rank, rank + num_workers, ...`` (validation shards; keeps every sample)."""
    check_rank(rank, num_workers)
    return np.arange(rank, num_samples, num_workers, dtype=np.int64)


def holdout_indices(num_samples: int, fraction: float = 0.1) -> np.ndarray:
    """The training samples held out for picking hyper-parameters: every
    ``round(1 / fraction)``-th sample, starting at the last of the first stride.

    Fixed (no seed): every run of a grid, whatever its seed or worker count, is
    scored on the same samples, and none of them is trained on.
    """
    if not 0 < fraction < 1:
        raise ValueError("need 0 < fraction < 1, got %r" % (fraction,))
    stride = int(round(1 / fraction))
    return np.arange(stride - 1, num_samples, stride, dtype=np.int64)


def check_rank(rank: int, num_workers: int) -> None:
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

    def skip_epoch(self) -> None:
        """Draw what one epoch draws from the loader's random stream, without
        building batches (but running the transform, which draws too), so that a
        resumed run sees the later epochs in the order an uninterrupted one does."""
        if not self.shuffle:
            return
        order = self._rng.permutation(len(self.data))
        if self.transform is not None:
            for b in range(len(self)):
                idx = np.sort(order[b * self.batch_size:(b + 1) * self.batch_size])
                self.transform(self.data[idx], self._rng)

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


def check_batches(name: str, per_worker: int, batch_size: int, num_workers: int) -> None:
    if per_worker // batch_size < 1:
        raise DataError(
            "%s: each of the %d workers gets %d training samples, fewer than one batch "
            "of %d; use a smaller --batch-size or fewer workers"
            % (name, num_workers, per_worker, batch_size))

def normalizer(mean: Sequence[float], std: Sequence[float]
                ) -> Callable[[np.ndarray, np.random.RandomState], np.ndarray]:
    mean_a = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    std_a = np.asarray(std, np.float32).reshape(1, -1, 1, 1)

    def transform(batch: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        return (batch.astype(np.float32) / 255.0 - mean_a) / std_a
    return transform
