"""Worker of tests/test_real_models.py: big parameters, evaluation between steps.

Usage (inside a job): python real_model_worker.py STORE STATES_DIR

A model with two parameters of more than 1e6 elements (a 512x512x3x3
convolution and a 1,048,576-element dense layer), a small one frozen from the
start and a bias frozen half-way, trained for ITERATIONS steps of SGD with
momentum (so the store keeps optimizer-state mirrors and cuts the big
parameters into chunks). After every step an evaluation forward runs outside
autograd.record(): MKL-DNN then holds the convolution weights in its own layout
while the store's pulls for the next step may still be writing them, which
aborted workers before ("Check failed: !is_view"). Half-way every worker
saves its states and loads them back (collective). Compressed and local-update
stores get warmup_steps=2, so both their warm-up and their later rounds run.

Prints "CHECKSUM <rank> <sum of every weight>" and "done" at the end.
"""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_cpsgd

ITERATIONS = 6
KNOBS = {"bitsgd": {"threshold": 0.05}, "cpsgd": {"warmup_steps": 2, "correction_period": 2,
                                                  "threshold": 0.05},
         "odsgd": {"warmup_steps": 2}, "ssdsgd": {"warmup_steps": 2, "sync_period": 2},
         "localsgd": {"sync_period": 2}}


class Net(gluon.nn.Block):
    def __init__(self):
        super().__init__()
        self.conv = gluon.nn.Conv2D(512, 3, in_channels=512, padding=1)  # 2,359,296 weights
        self.frozen = gluon.nn.Conv2D(512, 1, in_channels=512, use_bias=False)
        self.dense = gluon.nn.Dense(128, in_units=512 * 4 * 4)          # 1,048,576 weights

    def forward(self, x):
        return self.dense(self.frozen(self.conv(x)))


def main(store_name, states_dir):
    mx.random.seed(7)
    net = Net()
    net.initialize(mx.init.Xavier())
    net.frozen.weight.grad_req = "null"
    store = mxnet_cpsgd.create(store_name, **KNOBS.get(store_name, {}))
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 1e-4, "momentum": 0.9}, kvstore=store)
    rank = store.rank
    x = mx.nd.random.uniform(shape=(1, 512, 4, 4), ctx=mx.cpu()) + rank
    for t in range(ITERATIONS):
        with autograd.record():
            loss = net(x).square().mean()
        loss.backward()
        trainer.step(1)
        net(x).wait_to_read()  # evaluation-style forward, outside autograd.record()
        if t == ITERATIONS // 2:
            net.dense.bias.grad_req = "null"
            path = os.path.join(states_dir, "rank%d.states" % rank)
            trainer.save_states(path)
            trainer.load_states(path)
            net(x).wait_to_read()
    mx.nd.waitall()
    total = sum(float(p.data().asnumpy().astype(np.float64).sum())
                for p in net.collect_params().values())
    print("CHECKSUM %d %.10e" % (rank, total), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
