"""Worker of tests/test_store_names.py: the epoch logic of MXNet's image-classification fit.py.

Usage (inside a job): fit_logic_worker.py NAME

Written here from what example/image-classification/common/fit.py (MXNet 1.9.1)
does with ``--kv-store NAME``: it creates the store with ``mx.kvstore.create``,
takes ``ceil(int(num_examples / num_workers) / batch_size)`` batches as the epoch
size, wraps the training iterator in ``mx.io.ResizeIter`` of that size only when
NAME contains "dist" and not "async", and steps the learning rate (a
``MultiFactorScheduler``) after ``epoch size x step epoch`` updates.  Trains a
small softmax model with ``Module.fit`` for NUM_EPOCHS and prints
"FIT <json>": the batches of each epoch and, per batch, the rate the schedule
gives that update.
"""
import json
import math
import sys

import mxnet as mx
import numpy as np

import mxnet_cpsgd  # noqa: F401  (the line `python -m mxnet_cpsgd.run` adds)

NUM_EXAMPLES, BATCH, NUM_EPOCHS, LR, LR_FACTOR, LR_STEP_EPOCH = 256, 16, 2, 0.1, 0.1, 1

name = sys.argv[1]
kv = mx.kvstore.create(name)
epoch_size = math.ceil(int(NUM_EXAMPLES / kv.num_workers) / BATCH)
rng = np.random.RandomState(0)
x = rng.rand(NUM_EXAMPLES, 8).astype(np.float32)
train = mx.io.NDArrayIter(x, (x.sum(axis=1) > 4).astype(np.float32), BATCH)
if "dist" in name and "async" not in name:
    train = mx.io.ResizeIter(train, epoch_size)
schedule = mx.lr_scheduler.MultiFactorScheduler(step=[epoch_size * LR_STEP_EPOCH],
                                                factor=LR_FACTOR, base_lr=LR)
rates = mx.lr_scheduler.MultiFactorScheduler(step=[epoch_size * LR_STEP_EPOCH],
                                             factor=LR_FACTOR, base_lr=LR)

data = mx.sym.Variable("data")
net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fc"),
                           name="softmax")
mod = mx.mod.Module(net, context=mx.cpu())
batches = [0] * NUM_EPOCHS
lr_by_batch = []


def on_batch(param):
    batches[param.epoch] += 1
    # the servers give update u (1-based, one per batch) the schedule's rate at u
    lr_by_batch.append([param.epoch, rates(len(lr_by_batch) + 1)])


mod.fit(train, num_epoch=NUM_EPOCHS, kvstore=kv, optimizer="sgd",
        optimizer_params={"learning_rate": LR, "momentum": 0.9, "lr_scheduler": schedule},
        batch_end_callback=on_batch)
print("FIT " + json.dumps({"rank": kv.rank, "type": kv.type, "epoch_size": epoch_size,
                           "batches": batches, "lr": lr_by_batch}), flush=True)
