"""Worker of tests/test_real_models.py: one worker raises mid-training.

Usage: python raising_worker.py STORE [RAISER]

STORE is one of the project's stores, or "dist_sync" for MXNet's own store
(this script then never imports mxnet_cpsgd). The worker whose launcher index
(MXNET_CPSGD_WORKER_INDEX, or DMLC_TASK_ID under MXNet's tools/launch.py) is
RAISER (default 0) prints "RAISE pid <pid> at <unix time>" and raises
ValueError at iteration 5; the others keep training and block in the next round.
A worker still running after 120 s exits with code 3.
"""
import os
import sys
import time

import mxnet as mx
from mxnet import autograd, gluon

STORE = sys.argv[1]
RAISER = sys.argv[2] if len(sys.argv) > 2 else "0"
if STORE != "dist_sync":
    import mxnet_cpsgd  # noqa: F401  registers the stores

INDEX = os.environ.get("MXNET_CPSGD_WORKER_INDEX", os.environ.get("DMLC_TASK_ID"))
KNOBS = {"cpsgd": {"warmup_steps": 2}}

net = gluon.nn.Dense(3, in_units=4)
net.initialize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                        kvstore=STORE, compression_params=KNOBS.get(STORE))
started = time.time()
t = 0
while time.time() - started < 120:
    with autograd.record():
        loss = net(mx.nd.ones((2, 4))).sum()
    loss.backward()
    trainer.step(2)
    if t == 5 and INDEX == RAISER:
        print("RAISE pid %d at %.3f" % (os.getpid(), time.time()), flush=True)
        raise ValueError("boom at iteration %d" % t)
    mx.nd.waitall()
    t += 1
print("worker %s still running after 120 s" % INDEX, flush=True)
sys.exit(3)
