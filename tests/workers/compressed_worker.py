"""Worker of tests/test_compressors.py: one horovodrun process, several trainings.

Usage: ``compressed_worker.py OUT_DIR RUNS_JSON`` where RUNS_JSON is a list of
``{"label": str, "kvstore": name, "knobs": dict, "group_per_step": bool,
"freeze": [names with grad_req='null'], "route": "params" | "env" | "config"}``
(how the knobs reach the store: the Trainer's ``compression_params`` (default),
``MXNET_CPSGD_<KNOB>`` variables set during the run, or
``mxnet_cpsgd.create(AlgorithmConfig(...))``; with
``"api": true``: check the
store's ``pushpull`` semantics directly instead of training, see :func:`check_api`;
``"resume_at": R``: after R steps save the Trainer's states, build the network and
Trainer afresh, load the states and train on).  For every run, in order, the
process builds the same small network (Conv2D -> tanh -> Dense -> tanh -> Dense,
so it has 4-D, 2-D and 1-D parameters) from ``RandomState(SEED)`` (the same on
every rank), trains it for ITERATIONS steps of ``trainer.step(BATCH)`` with SGD
(momentum, wd) on rank-dependent random data (``RandomState(1000 + rank)``), and
records, per step, the weights before the step and the gradient MXNet computed
there (summed over the batch, before ``pushpull``), plus the final weights.

Output: ``OUT_DIR/<label>-rank<r>.npz`` with ``w:<param>`` of shape
``(ITERATIONS + 1, ...)``, ``g:<param>`` of shape ``(ITERATIONS, ...)`` and
``keys``: the parameter names in the Trainer's key order; ``exchanges``: the
slots of the store's last exchanges (``'step'`` for a step's grouped exchange, a
key for a key exchanged on its own); for the
``cpsgd_<compressor>`` stores also ``W:<param>``, the store's global weights W
after each step (index 0: the initial weights).
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd  # registers the stores

ITERATIONS = 12
BATCH = 4
SEED = 3
OPTIMIZER = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}
IN_SHAPE = (2, 6, 6)
OUT = 5


def make_net():
    net = gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(gluon.nn.Conv2D(8, kernel_size=3, in_channels=2, activation="tanh",
                                prefix="conv_"))
        net.add(gluon.nn.Flatten())
        net.add(gluon.nn.Dense(24, in_units=8 * 4 * 4, activation="tanh", prefix="hid_"))
        net.add(gluon.nn.Dense(OUT, in_units=24, prefix="out_"))
    net.initialize(mx.init.Zero())
    rng = np.random.RandomState(SEED)
    for name, param in sorted(net.collect_params().items()):
        param.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, param.shape).astype(np.float32)))
    return net


def _trainer(run, net):
    params = net.collect_params()
    for name in run.get("freeze", ()):
        params[name].grad_req = "null"
    kvstore = run["kvstore"]
    knobs = run.get("knobs") or None
    if run.get("route") == "config":
        kvstore = mxnet_cpsgd.create(mxnet_cpsgd.AlgorithmConfig(kvstore, **(knobs or {})))
        knobs = None
    if "group_per_step" in run:
        kvstore = mx.kv.create(kvstore)
        kvstore.group_per_step = run["group_per_step"]
    return gluon.Trainer(params, "sgd", dict(OPTIMIZER), kvstore=kvstore,
                         compression_params=knobs)


def _exchange_slots(store):
    """What the store's last exchanges were keyed by: 'step' (grouped) or keys."""
    slots = {s[0] if isinstance(s, tuple) else s for s in getattr(store, "_in_flight", {})}
    return np.array(sorted(str(s) for s in slots))


def _global_weights(trainer, names):
    """The CP store's W of every parameter, by name."""
    store = trainer._kvstore
    return {p.name: store._slots[i].glob.asnumpy() for i, p in enumerate(trainer._params)
            if p.name in names}


def train(run, rank, out_dir):
    if run.get("route") != "env":
        return _train(run, rank, out_dir)
    # every knob as MXNET_CPSGD_<KNOB>, set while the store is built and configured
    env = {"MXNET_CPSGD_" + k.upper(): str(v) for k, v in run["knobs"].items()}
    os.environ.update(env)
    try:
        return _train(dict(run, knobs=None), rank, out_dir)
    finally:
        for name in env:
            del os.environ[name]


def _train(run, rank, out_dir):
    net = make_net()
    params = net.collect_params()
    names = sorted(params)
    trainer = _trainer(run, net)
    cp = run["kvstore"].startswith("cpsgd_")
    rng = np.random.RandomState(1000 + rank)
    x = rng.randn(ITERATIONS, BATCH, *IN_SHAPE).astype(np.float32)
    y = rng.randn(ITERATIONS, BATCH, OUT).astype(np.float32)
    ws = {n: [] for n in names}
    gs = {n: [] for n in names}
    globs = {n: [params[n].data().asnumpy()] for n in names} if cp else {}
    for t in range(ITERATIONS):
        if t == run.get("resume_at"):
            states = os.path.join(out_dir, "%s-rank%d.states" % (run["label"], rank))
            trainer.save_states(states)
            net = make_net()          # other weights until load_states restores them
            for p in net.collect_params().values():
                p.set_data(p.data() * 0 + 7)
            params = net.collect_params()
            trainer = _trainer(run, net)
            trainer.load_states(states)
        for n in names:
            ws[n].append(params[n].data().asnumpy())
        with autograd.record():
            loss = 0.5 * ((net(mx.nd.array(x[t])) - mx.nd.array(y[t])) ** 2).sum()
        loss.backward()
        for n in names:
            gs[n].append(params[n].grad().asnumpy() if params[n].grad_req != "null"
                         else np.zeros(params[n].shape, np.float32))
        trainer.step(BATCH)
        if cp:
            for n, w in _global_weights(trainer, names).items():
                globs[n].append(w)
    mx.nd.waitall()
    for n in names:
        ws[n].append(params[n].data().asnumpy())
    store = trainer._kvstore
    assert store is not None and store.type == run["kvstore"], store
    assert trainer._update_on_kvstore is cp
    arrays = {"w:" + n: np.stack(ws[n]) for n in names}
    arrays.update({"W:" + n: np.stack(globs[n]) for n in globs})
    # the Trainer's key of every parameter (its index in trainer._params)
    arrays["keys"] = np.array([p.name for p in trainer._params])
    arrays["exchanges"] = _exchange_slots(store)
    arrays.update({"g:" + n: np.stack(gs[n]) for n in names})
    np.savez(os.path.join(out_dir, "%s-rank%d.npz" % (run["label"], rank)), **arrays)
    print("done %s rank=%d" % (run["label"], rank), flush=True)


def check_api(run, rank, size):
    """pushpull semantics of a store whose result is the exact sum (topk ratio=1,
    powersgd with a large rank): devices summed first, ``out=``, lists of keys,
    float64; every rank r contributes r + 1."""
    store = mx.kv.create(run["kvstore"])
    store.set_gradient_compression(run.get("knobs") or {})
    total = size * (size + 1) / 2.0
    g0 = mx.nd.full((3, 4), rank + 1, ctx=mx.cpu(0))
    g1 = mx.nd.full((3, 4), 10 * (rank + 1), ctx=mx.cpu(1))
    store.pushpull(0, [g0, g1])
    for a in (g0, g1):
        assert (a.asnumpy() == 11 * total).all(), a
    v = mx.nd.full((5, 2), rank + 1)
    o0, o1 = mx.nd.zeros((5, 2)), mx.nd.zeros((5, 2))
    store.pushpull(1, v, out=[o0, o1])
    assert (v.asnumpy() == rank + 1).all()
    assert (o0.asnumpy() == total).all() and (o1.asnumpy() == total).all()
    a, b = mx.nd.full((2,), rank + 1), mx.nd.full((6, 3), 2 * (rank + 1), dtype="float64")
    store.pushpull([2, 3], [a, b])
    assert (a.asnumpy() == total).all() and (b.asnumpy() == 2 * total).all(), (a, b)
    print("api ok %s rank=%d" % (run["label"], rank), flush=True)


def main():
    out_dir, runs = sys.argv[1], json.loads(sys.argv[2])
    import horovod.mxnet as hvd
    hvd.init()
    mx.random.seed(7)
    for run in runs:
        if run.get("api"):
            check_api(run, hvd.rank(), hvd.size())
        else:
            train(run, hvd.rank(), out_dir)


if __name__ == "__main__":
    main()
