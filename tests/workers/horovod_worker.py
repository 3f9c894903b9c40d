"""Worker of tests/test_horovod.py: the same small Gluon training under three stores.

Usage: ``horovod_worker.py MODE INIT OUT_DIR``, MODE one of

* ``ssgd``: a worker of a parameter-server job (mxnet_cpsgd.launch), kvstore 'ssgd';
* ``kvstore``: a process of ``horovodrun --gloo``, ``kvstore='horovod'`` (by name);
* ``trainer``: a process of ``horovodrun --gloo``,
  ``mxnet_cpsgd.stores.allreduce.horovod.distributed_trainer``;
* ``api``: a process of ``horovodrun --gloo`` (or a single process): checks the
  store's KVStore methods directly (INIT and OUT_DIR are ignored).

Every mode trains the same MLP (Dense(8, tanh) -> Dense(3), squared loss) with
SGD (momentum, wd) for ITERATIONS steps of ``trainer.step(BATCH)``; worker rank
``r`` draws its batches from ``RandomState(1000 + r)``.  INIT chooses the
initial weights: ``same`` (``RandomState(0)`` on every rank) or ``rank``
(``RandomState(r)``: only the store's broadcast of rank 0's weights makes the
ranks agree).  Each rank writes its final weights to
``OUT_DIR/<mode>-<init>-rank<r>.npz`` and prints one ``done`` line.

Note: ``gluon.Trainer`` creates its store and broadcasts rank 0's weights at the
first ``trainer.step``, i.e. after the first backward, for ``ssgd`` and
``horovod`` alike; with INIT ``rank`` every worker's first gradient is taken at
its own initial weights (identically in both).  The ``trainer`` mode calls
``hvd.broadcast_parameters`` before the first forward instead, so it is only
comparable with the others under INIT ``same``.
"""
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd  # noqa: F401  (registers the stores)

ITERATIONS = 12
BATCH = 5
IN, HIDDEN, OUT = 6, 8, 3
OPTIMIZER = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}


def make_net(seed):
    net = gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(gluon.nn.Dense(HIDDEN, in_units=IN, activation="tanh", prefix="hid_"))
        net.add(gluon.nn.Dense(OUT, in_units=HIDDEN, prefix="out_"))
    net.initialize(mx.init.Zero())
    rng = np.random.RandomState(seed)
    for name, param in sorted(net.collect_params().items()):
        param.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, param.shape).astype(np.float32)))
    return net


def check_api():
    """The store's methods on 1 or more processes; every rank r contributes r + 1."""
    from mxnet_cpsgd.stores.allreduce.horovod import Horovod
    store = mx.kv.create("horovod")
    assert isinstance(store, Horovod) and store.type == "horovod"
    rank, size = store.rank, store.num_workers
    total = size * (size + 1) / 2  # sum over ranks of rank + 1
    assert store.is_capable("optimizer") is False
    try:
        store.is_capable("magic")
        raise AssertionError("unknown capability accepted")
    except ValueError:
        pass
    # broadcast: rank 0's value reaches every output on every rank
    outs = [mx.nd.zeros((2, 3)), mx.nd.zeros((2, 3))]
    store.broadcast(0, mx.nd.full((2, 3), rank + 7), out=outs)
    for o in outs:
        assert (o.asnumpy() == 7).all(), o
    # in-place all-reduce of one gradient
    g = mx.nd.full((4,), rank + 1)
    store.pushpull(1, g)
    assert (g.asnumpy() == total).all(), g
    # two devices per worker: summed locally first, every device gets the total
    g0 = mx.nd.full((3,), rank + 1, ctx=mx.cpu(0))
    g1 = mx.nd.full((3,), 10 * (rank + 1), ctx=mx.cpu(1))
    store.pushpull(2, [g0, g1])
    for a in (g0, g1):
        assert (a.asnumpy() == 11 * total).all(), a
    # out=: the inputs stay, the outputs get the sum
    v = mx.nd.full((5,), rank + 1)
    o0, o1 = mx.nd.zeros((5,)), mx.nd.zeros((5,))
    store.pushpull(3, v, out=[o0, o1])
    assert (v.asnumpy() == rank + 1).all() and (o0.asnumpy() == total).all() \
        and (o1.asnumpy() == total).all()
    # lists of keys
    a, b = mx.nd.full((2,), rank + 1), mx.nd.full((6,), 2 * (rank + 1))
    store.pushpull([4, 5], [a, b])
    assert (a.asnumpy() == total).all() and (b.asnumpy() == 2 * total).all()
    # float64 and repeated rounds of the same key
    d = mx.nd.full((3,), rank + 1, dtype="float64")
    for _ in range(3):
        store.pushpull(6, d)
        mx.nd.waitall()
    assert (d.asnumpy() == total * size ** 2).all(), d  # later rounds multiply by size
    for bad in (lambda: store.pushpull(7, mx.nd.zeros((4, 2)).tostype("row_sparse")),
                lambda: store.set_optimizer(mx.optimizer.SGD()),
                lambda: store.save_optimizer_states("/nonexistent")):
        try:
            bad()
            raise AssertionError("accepted")
        except (ValueError, RuntimeError):
            pass
    print("api ok rank=%d size=%d" % (rank, size), flush=True)


def main():
    if sys.argv[1] == "api":
        check_api()
        return
    mode, init, out_dir = sys.argv[1:4]
    seed_of = {"same": lambda rank: 0, "rank": lambda rank: rank}[init]
    mx.random.seed(7)
    if mode == "ssgd":
        store = mx.kv.create("ssgd")
        rank = store.rank
        net = make_net(seed_of(rank))
        trainer = gluon.Trainer(net.collect_params(), "sgd", dict(OPTIMIZER), kvstore=store)
    elif mode == "kvstore":
        import horovod.mxnet as hvd
        hvd.init()
        rank = hvd.rank()
        net = make_net(seed_of(rank))
        trainer = gluon.Trainer(net.collect_params(), "sgd", dict(OPTIMIZER),
                                kvstore="horovod")
    elif mode == "trainer":
        import horovod.mxnet as hvd
        from mxnet_cpsgd.stores.allreduce.horovod import distributed_trainer
        hvd.init()
        rank = hvd.rank()
        net = make_net(seed_of(rank))
        params = net.collect_params()
        hvd.broadcast_parameters(params, root_rank=0)
        trainer = distributed_trainer(params, "sgd", dict(OPTIMIZER))
    else:
        raise SystemExit("unknown mode %r" % mode)

    rng = np.random.RandomState(1000 + rank)
    x = rng.randn(ITERATIONS, BATCH, IN).astype(np.float32)
    y = rng.randn(ITERATIONS, BATCH, OUT).astype(np.float32)
    for t in range(ITERATIONS):
        with autograd.record():
            loss = 0.5 * ((net(mx.nd.array(x[t])) - mx.nd.array(y[t])) ** 2).sum()
        loss.backward()
        trainer.step(BATCH)
    mx.nd.waitall()

    store = trainer._kvstore
    if mode == "kvstore":
        # the name reached the Horovod store, and the Trainer updates locally
        assert store is not None and store.type == "horovod", store
        assert trainer._update_on_kvstore is False
        assert store.rank == rank and store.num_workers == 2
    elif mode == "ssgd":
        assert store.num_workers == 2
    weights = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    np.savez(os.path.join(out_dir, "%s-%s-rank%d.npz" % (mode, init, rank)), **weights)
    print("done mode=%s init=%s rank=%d store=%s"
          % (mode, init, rank, store.type if store else None),
          flush=True)


if __name__ == "__main__":
    main()
