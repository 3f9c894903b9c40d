"""Worker of tests/test_resume.py: train a small Gluon model, checkpoint, resume.

Every worker trains the same two-layer net on its own data stream: the batch of
iteration t on the worker of rank r is drawn from ``RandomState(1000 + 100*r + t)``,
so an uninterrupted run and a stopped-and-resumed run see exactly the same
batches.  Files are keyed by the store's rank (ps-lite assigns ranks itself, so
worker index and rank may differ between two jobs).

Usage (inside a job)::

    python resume_worker.py --algo cpsgd --knobs '{"warmup_steps": 4}' --iters 10 \
        --out DIR [--save-at 3 7] [--resume-from K [--ckpt-dir DIR] [--no-load-states]]

Writes to DIR:
    final-rank{r}.npz        the worker's parameters after --iters iterations
    ckpt-{K}-rank{r}.params  net.save_parameters after iteration K (--save-at)
    ckpt-{K}-rank{r}.states  trainer.save_states after iteration K (--save-at)
    reloaded-rank{r}.states  trainer.save_states right after load_states (--resume-from)
Checkpoints are read from --ckpt-dir (default DIR).
"""
import argparse
import json
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_cpsgd


BATCH = 8
IN_UNITS = 6


def build_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(12, in_units=IN_UNITS, activation="tanh"))
    net.add(gluon.nn.Dense(3, in_units=12))
    mx.random.seed(7)
    net.initialize(mx.init.Xavier())
    return net


def batch(rank, t):
    rng = np.random.RandomState(1000 + 100 * rank + t)
    x = rng.randn(BATCH, IN_UNITS).astype(np.float32)
    y = rng.randn(BATCH, 3).astype(np.float32)
    return mx.nd.array(x), mx.nd.array(y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", required=True)
    parser.add_argument("--knobs", default="{}")
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-at", type=int, nargs="*", default=[])
    parser.add_argument("--resume-from", type=int, default=0)
    parser.add_argument("--ckpt-dir", default=None, help="where to resume from (default --out)")
    parser.add_argument("--no-load-states", action="store_true")
    args = parser.parse_args()

    store = mxnet_cpsgd.create(mxnet_cpsgd.AlgorithmConfig(args.algo, **json.loads(args.knobs)))
    rank = store.rank  # joins the job
    net = build_net()
    start = args.resume_from
    ckpt = os.path.join(args.ckpt_dir or args.out, "ckpt-%d-rank%d" % (start, rank))
    if start:
        net.load_parameters(ckpt + ".params")
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.05, "momentum": 0.9}, kvstore=store)
    if start and not args.no_load_states:
        trainer.load_states(ckpt + ".states")
        trainer.save_states(os.path.join(args.out, "reloaded-rank%d.states" % rank))

    loss_fn = gluon.loss.L2Loss()
    for t in range(start, args.iters):
        x, y = batch(rank, t)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(BATCH)
        if t + 1 in args.save_at:
            mx.nd.waitall()
            name = os.path.join(args.out, "ckpt-%d-rank%d" % (t + 1, rank))
            net.save_parameters(name + ".params")
            trainer.save_states(name + ".states")
    mx.nd.waitall()
    weights = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    np.savez(os.path.join(args.out, "final-rank%d.npz" % rank), **weights)
    print("rank %d done after %d iterations" % (rank, args.iters))


if __name__ == "__main__":
    main()
