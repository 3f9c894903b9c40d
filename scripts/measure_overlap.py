#!/usr/bin/env python
"""Does a store's ``pushpull`` overlap the backward pass?  (Horovod stores)

Run under ``horovodrun -np 2 -H localhost:2 --gloo python scripts/measure_overlap.py``.
For every store (``--stores``), LeNet-5 trains on random MNIST-shaped batches; per
step the script measures, on rank 0:

* ``step_return``: how long ``trainer.step(B)`` takes to return to Python (all
  ``pushpull`` calls queued);
* ``step``: from the start of the forward pass until every updated weight is ready
  (``mx.nd.waitall``), i.e. the whole iteration;
* ``compute``: the same iteration without communication (``pushpull`` of a local
  store: ``kvstore=None``).

Variants: ``<name>`` holds a step's compressed messages until its last key and
exchanges them as one grouped Horovod operation per round and dtype (the
default); ``<name>+per-key`` exchanges every key as soon as it is pushed
(``store.group_per_step = False``); for the all-gather stores (``signsgd``,
``topk``) ``<name>+blocking`` replaces the asynchronous all-gather by Horovod's
own ``hvd.allgather`` (which waits in the calling thread), i.e. a per-key
blocking design in gluon's key order.
Medians over ``--steps`` steps after ``--skip`` warm-up steps.  Times on a shared
machine are noisy: compare rows of one run only.
"""
import argparse
import statistics
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd  # noqa: F401
from mxnet_cpsgd.training import models


def blocking_allgather(store):
    hvd = store._hvd

    def allgather_into(tensors, outputs, name, priority=0):
        for t, o in zip(tensors, outputs):
            hvd.allgather(t, name=name).copyto(o)   # waits until the data has arrived
    store._collectives.allgather_into = allgather_into


def run(name, args, rank):
    mx.random.seed(1)
    net = models.get_model("lenet", 10)
    models.initialize(net, (1, 28, 28), [mx.cpu()])
    store = name.split("+")[0]
    kv = None
    if store != "compute":
        kv = mx.kv.create(store)
        kv.group_per_step = not name.endswith(("+per-key", "+blocking"))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(rank)
    x = mx.nd.array(rng.rand(args.batch, 1, 28, 28))
    y = mx.nd.array(rng.randint(0, 10, args.batch))
    ret, full = [], []
    for i in range(args.skip + args.steps):
        mx.nd.waitall()
        t0 = time.time()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        t1 = time.time()
        trainer.step(args.batch)
        t2 = time.time()
        mx.nd.waitall()
        t3 = time.time()
        if i == 0 and name.endswith("+blocking"):
            blocking_allgather(trainer._kvstore)
        if i >= args.skip:
            ret.append(t2 - t1)
            full.append(t3 - t0)
    return statistics.median(ret) * 1e3, statistics.median(full) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stores", default="compute,horovod,signsgd,signsgd+per-key,"
                                       "signsgd+blocking,topk,topk+per-key,topk+blocking,"
                                       "powersgd,powersgd+per-key,acpsgd,acpsgd+per-key")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    import horovod.mxnet as hvd
    hvd.init()
    rank = hvd.rank()
    rows = [(name,) + run(name, args, rank) for name in args.stores.split(",")]
    if rank == 0:
        print("%-18s %16s %10s" % ("store", "step_return ms", "step ms"))
        for name, r, f in rows:
            print("%-18s %16.2f %10.2f" % (name, r, f))


if __name__ == "__main__":
    main()
