"""Worker of the reference tests: trains a small Gluon model and records every step.

Run as a worker of a distributed job (scheduler + servers + workers), with one
argument: a JSON spec (see ``tests/workers/jobutil.py``)::

    {"kvstore": "cpsgd",            # a registered store, 'dist_sync', 'dist_async',
                                    # or 'stock_2bit' (raw dist_sync + MXNet 2-bit,
                                    # manual push/pull loop: what BIT-SGD must equal)
     "knobs": {...} | null,         # the Trainer's compression_params
     "optimizer": {"learning_rate": .., "momentum": .., "wd": ..},
     "heads": [{"kind": "mlp", "in": 6, "hidden": 5, "out": 3,
                "loss": "squared", "target": "random"|"teacher",
                "active_inputs": null | [columns with nonzero inputs]},
               {"kind": "linear", "in": 4, "out": 2, "loss": "linear"}],
     "iterations": 20, "batch": 4, "seed": 7, "x_scale": 1.0,
     "record_grads": true, "final_sync": false,
     "devices": 1,                  # CPU contexts per worker; the batch is split evenly
     "device_ids": [1, 0],          # optional: which mx.cpu(i), in order (first = the
                                    # parameter's first device, where stores keep buffers)
     "lr_schedule": null | {"step": [update counts], "factor": f},  # MultiFactorScheduler
     "freeze": null | {"at": t, "params": [names]},  # grad_req='null' from iteration t
     "out": "/some/dir"}

Every head is its own block with its own inputs and targets; all heads share one
Trainer, so one job trains (and records) them together.  The loss summed over a
batch is ``0.5 * sum((f(x) - y)**2)`` ("squared") or ``sum(y * f(x))`` ("linear":
its gradient does not depend on the weights).  ``f`` is ``Dense(out)`` ("linear")
or ``Dense(out)(tanh(Dense(hidden)(x)))`` ("mlp"), both with bias.

Data: worker rank ``r`` (the store's rank) draws its batches from
``RandomState(seed * 1000 + r + 1)``, so workers get different data; initial
weights come from ``RandomState(seed)`` and are the same on every worker.

Output ``<out>/rank<r>.npz``: ``x<h>``/``y<h>`` (iterations, batch, ...) per head,
``w:<param>`` (iterations + 1, ...): the worker's weights before the first step and
after every step, and with ``record_grads`` ``g:<param>`` (iterations, ...): the
gradient MXNet computed (summed over the batch) at the weights the step started
from (with several devices: summed over them; every device must hold the same
weights after every step, or the worker fails).  With ``final_sync`` the workers meet at a barrier after training and take
one more step with zero gradients, whose pull brings the final global weights;
they are saved as ``final:<param>``.  ``<out>/rank<r>.json`` holds the metadata.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd  # noqa: F401  (registers the stores)


def make_head(index, spec, ctx):
    prefix = "h%d_" % index
    if spec["kind"] == "linear":
        net = gluon.nn.Dense(spec["out"], in_units=spec["in"], prefix=prefix + "out_")
    elif spec["kind"] == "mlp":
        net = gluon.nn.HybridSequential(prefix=prefix)
        with net.name_scope():
            net.add(gluon.nn.Dense(spec["hidden"], in_units=spec["in"], activation="tanh",
                                   prefix="hid_"))
            net.add(gluon.nn.Dense(spec["out"], in_units=spec["hidden"], prefix="out_"))
    else:
        raise ValueError("unknown head kind %r" % spec["kind"])
    net.initialize(mx.init.Zero(), ctx=ctx)
    rng = np.random.RandomState([spec.get("init_seed", 0), index])
    for name, param in sorted(net.collect_params().items()):
        scale = 0.5 if name.endswith("weight") else 0.1
        param.set_data(mx.nd.array(rng.uniform(-scale, scale, param.shape).astype(np.float32)))
    return net


def make_data(spec, heads, rank):
    iters, batch = spec["iterations"], spec["batch"]
    rng = np.random.RandomState(spec["seed"] * 1000 + rank + 1)
    data = []
    for index, head in enumerate(heads):
        x = rng.randn(iters, batch, head["in"]) * spec.get("x_scale", 1.0)
        if head.get("active_inputs") is not None:
            mask = np.zeros(head["in"])
            mask[head["active_inputs"]] = 1.0
            x = x * mask
        if head.get("target", "random") == "teacher":
            # the same linear teacher on every worker: a problem worth learning
            teacher = np.random.RandomState([spec["seed"], index, 99]).randn(
                head["in"], head["out"]) / np.sqrt(head["in"])
            y = x.dot(teacher) + 0.01 * rng.randn(iters, batch, head["out"])
        else:
            y = rng.randn(iters, batch, head["out"])
        data.append((x.astype(np.float32), y.astype(np.float32)))
    return data


def head_loss(net, head, x, y):
    out = net(x)
    y = y.as_in_context(out.context)
    if head.get("loss", "squared") == "squared":
        return 0.5 * ((out - y) ** 2).sum()
    if head["loss"] == "linear":
        return (out * y).sum()
    raise ValueError("unknown loss %r" % head["loss"])


def main():
    spec = json.loads(sys.argv[1])
    mx.random.seed(spec["seed"])
    heads = spec["heads"]
    for i, head in enumerate(heads):
        head.setdefault("init_seed", spec["seed"])
    ctx = [mx.cpu(d) for d in spec.get("device_ids") or range(spec.get("devices", 1))]
    nets = [make_head(i, h, ctx) for i, h in enumerate(heads)]
    params = gluon.ParameterDict()
    for net in nets:
        params.update(net.collect_params())
    names = list(params.keys())
    batch = spec["batch"]
    opt_args = dict(spec["optimizer"])
    if spec.get("lr_schedule"):
        # a MultiFactorScheduler on the Trainer's optimizer (the servers run it)
        opt_args["lr_scheduler"] = mx.lr_scheduler.MultiFactorScheduler(
            step=list(spec["lr_schedule"]["step"]), factor=spec["lr_schedule"]["factor"],
            base_lr=opt_args["learning_rate"])

    kvstore = spec["kvstore"]
    trainer = None
    raw_kv = None
    if kvstore == "stock_2bit":
        # stock MXNet 2-bit: a gluon.Trainer cannot drive it in 1.9.1 (pushpull is not
        # supported with compression), so this is the manual push-then-pull loop
        raw_kv = mx.kv.create("dist_sync")
        raw_kv.set_gradient_compression(dict(spec["knobs"]))
        raw_kv.set_optimizer(mx.optimizer.SGD(rescale_grad=1.0 / batch, **opt_args))
        for i, name in enumerate(names):
            raw_kv.init(i, params[name].data())
        mx.nd.waitall()
        raw_kv._barrier()
        for i, name in enumerate(names):
            raw_kv.pull(i, out=params[name].data())
        mx.nd.waitall()
        rank, num_workers = raw_kv.rank, raw_kv.num_workers
    else:
        trainer = gluon.Trainer(params, "sgd", opt_args, kvstore=kvstore,
                                compression_params=spec.get("knobs"))
        # the data depend on the rank, which is only known once the store exists;
        # create it the way trainer.step() would (rescale first, then the store)
        trainer._check_and_rescale_grad(1.0 / batch)
        trainer._init_kvstore()
        store = trainer._kvstore
        if store is None or "dist" not in store.type:
            raise RuntimeError("kvstore %r did not give a distributed store (%r)"
                               % (kvstore, store))
        rank, num_workers = store.rank, store.num_workers

    data = make_data(spec, heads, rank)
    iters = spec["iterations"]
    weights = {n: np.zeros((iters + 1,) + params[n].shape, np.float32) for n in names}
    grads = {n: np.zeros((iters,) + params[n].shape, np.float32) for n in names} \
        if spec.get("record_grads") else None
    for n in names:
        weights[n][0] = params[n].data().asnumpy()

    freeze = spec.get("freeze")
    if freeze:
        unknown = sorted(set(freeze["params"]) - set(names))
        if unknown:
            raise ValueError("freeze names unknown parameters %s (have %s)" % (unknown, names))
    for t in range(iters):
        if freeze and t == freeze["at"]:
            for n in freeze["params"]:
                params[n].grad_req = "null"
        with autograd.record():
            losses = []
            for d, c in enumerate(ctx):  # device d gets its share of the batch
                part = slice(d * batch // len(ctx), (d + 1) * batch // len(ctx))
                losses += [head_loss(net, head, mx.nd.array(x[t][part], ctx=c),
                                     mx.nd.array(y[t][part], ctx=c))
                           for net, head, (x, y) in zip(nets, heads, data)]
        autograd.backward(losses)
        if grads is not None:
            for n in names:
                if params[n].grad_req != "null":
                    grads[n][t] = sum(g.asnumpy() for g in params[n].list_grad())
        if trainer is not None:
            trainer.step(batch)
        else:
            for i, n in enumerate(names):
                raw_kv.push(i, params[n].grad(), priority=-i)
                raw_kv.pull(i, out=params[n].data(), priority=-i)
        for n in names:
            copies = [a.asnumpy() for a in params[n].list_data()]
            for d, other in enumerate(copies[1:], 1):
                if not np.array_equal(copies[0], other):
                    raise AssertionError("after step %d the weights of %s differ between "
                                         "devices 0 and %d" % (t, n, d))
            weights[n][t + 1] = copies[0]

    mx.nd.waitall()
    final = {}
    if spec.get("final_sync"):
        store = trainer._kvstore
        getattr(store, "_kv", store)._barrier()
        for n in names:
            params[n].zero_grad()
        trainer.step(batch)
        for n in names:
            final["final:" + n] = params[n].data().asnumpy()
        mx.nd.waitall()

    out = spec["out"]
    arrays = {}
    for h, (x, y) in enumerate(data):
        arrays["x%d" % h] = x
        arrays["y%d" % h] = y
    arrays.update({"w:" + n: a for n, a in weights.items()})
    if grads is not None:
        arrays.update({"g:" + n: a for n, a in grads.items()})
    arrays.update(final)
    np.savez(os.path.join(out, "rank%d.npz" % rank), **arrays)
    meta = {"rank": rank, "num_workers": num_workers, "params": names,
            "store_type": trainer._kvstore.type if trainer is not None else raw_kv.type}
    config = getattr(trainer._kvstore, "config", None) if trainer is not None else None
    if config is not None:
        meta["config"] = {k: getattr(config, k) for k in config.__dataclass_fields__}
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump(meta, f)
    print("worker rank %d of %d done (%s)" % (rank, num_workers, meta["store_type"]))


if __name__ == "__main__":
    main()
