"""Worker of tests/test_bad_input.py: a misconfiguration that is only detectable
inside a job.

Usage (inside a job): python bad_input_worker.py float16
    trains a float16 net with kvstore='cpsgd' (2-bit compression needs float32).
"""
import sys

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd  # noqa: F401 - registers the stores


def main(mode):
    assert mode == "float16", mode
    net = gluon.nn.Dense(3, in_units=4)
    net.initialize()
    net.cast("float16")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore="cpsgd", compression_params={"threshold": 0.5})
    with autograd.record():
        loss = net(mx.nd.ones((2, 4), dtype="float16")).sum()
    loss.backward()
    trainer.step(2)
    mx.nd.waitall()
    print("trained a float16 net with cpsgd: no error raised")


if __name__ == "__main__":
    main(sys.argv[1])
