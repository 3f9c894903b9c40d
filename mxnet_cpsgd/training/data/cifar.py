"""CIFAR-10: the binary files read by ``gluon.data.vision.CIFAR10`` (checked
against their hashes), and the training augmentation.
"""
import os
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from .base import CIFAR10_DEFAULT_DIR, DataError
from .loaders import normalizer


CIFAR10_FILES = ("data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                 "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin")
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
    normalize = normalizer(mean, std)

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
