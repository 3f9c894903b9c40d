"""Worker of tests/test_real_models.py: string keys, a reused store, a misspelt name.

Usage (inside a 2-worker job): python api_worker.py

Prints one line "RESULT <json>" with what each case did:
  misspelt:   the error of gluon.Trainer(..., kvstore='topk_typo') on one device
  str_broadcast / str_pushpull: the errors of string keys on a store in use
  p_final:    weights after 3 steps of Trainer 1 (ssgd, SGD lr 0.1)
  q_start:    weights of Trainer 2's new parameter after its broadcast
  q_final:    after 3 steps of Trainer 2 on the same store (SGD lr 0.05, momentum 0.9)
  reuse_shape / reuse_settings: the errors of two Trainers the store cannot serve
On rank r the loss is sum(w * (r + 1) * [1, 2, 3, 4]), so the gradient is constant.
"""
import json

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_cpsgd


def error(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - reported to the test
        return "%s: %s" % (type(err).__name__, err)
    return None


def train(trainer, param, rank, steps):
    coeff = mx.nd.array([1, 2, 3, 4]) * (rank + 1)
    for _ in range(steps):
        with autograd.record():
            loss = (param.data() * coeff).sum()
        loss.backward()
        trainer.step(1)
    mx.nd.waitall()


def main():
    result = {}
    lone = gluon.Parameter("lone", shape=(4,))
    lone.initialize()
    result["misspelt"] = error(lambda: gluon.Trainer([lone], "sgd", kvstore="topk_typo")
                               ._init_kvstore())

    store = mxnet_cpsgd.create("ssgd")
    rank = store.rank
    p = gluon.Parameter("p", shape=(4,), init=mx.init.Constant(0.5))
    p.initialize()
    trainer1 = gluon.Trainer([p], "sgd", {"learning_rate": 0.1}, kvstore=store)
    train(trainer1, p, rank, 3)
    result["p_final"] = p.data().asnumpy().tolist()

    w = mx.nd.zeros((4,))
    result["str_broadcast"] = error(lambda: store.broadcast("w", w, out=w))
    result["str_pushpull"] = error(lambda: store.pushpull("w", [w], out=[w]))

    q = gluon.Parameter("q", shape=(4,), init=mx.init.Zero())
    q.initialize()
    trainer2 = gluon.Trainer([q], "sgd", {"learning_rate": 0.05, "momentum": 0.9},
                             kvstore=store)
    trainer2._init_kvstore()
    trainer2._init_params()
    mx.nd.waitall()
    result["q_start"] = q.data().asnumpy().tolist()
    train(trainer2, q, rank, 3)
    result["q_final"] = q.data().asnumpy().tolist()

    wide = gluon.Parameter("wide", shape=(5,))
    wide.initialize()
    result["reuse_shape"] = error(
        lambda: gluon.Trainer([wide], "sgd", kvstore=store)._init_kvstore())
    result["reuse_settings"] = error(
        lambda: gluon.Trainer([q], "sgd", kvstore=store,
                              compression_params={"warmup_steps": 3})._init_kvstore())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
