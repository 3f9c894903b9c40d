"""Worker of the Module-API tests: LeNet-5 on mnist-5k through MXNet's Module API.

One argument, a JSON spec::

    {"kvstore": "cpsgd" | "ssgd" | "bitsgd" | "dist_sync" | ...,
     "mode": "fit"       # mod.fit(kvstore=<name as a string>), as a user writes it
           | "steps"     # mod.forward_backward + mod.update: what fit does per batch,
                         #   recording the weights and gradients of every step
           | "classic",  # the store driven by hand: kv.init / kv.push / kv.pull with
                         #   the parameter names as keys (Module only computes gradients)
     "iterations": 6, "batch": 16, "seed": 3,
     "optimizer": {"learning_rate": .., "momentum": .., "wd": ..},
     "save_at": null | s,  # fit mode: save the optimizer states after s batches, then
                           # after fit load them and run batches s.. again
     "out": "/dir"}

Knobs of the store come from MXNET_CPSGD_* in the environment.  Every worker trains
on its own slice of the first ``iterations * batch * M`` digits (rank r takes every
M-th, starting at r).  Output ``<out>/rank<r>.npz``: ``final:<param>``; in steps and
classic modes also ``w:<param>`` (iterations + 1, ...) and ``g:<param>`` (iterations,
...) (gradients summed over the batch); fit mode: ``initial:<param>``, and with
save_at ``resumed:<param>``.
``<out>/rank<r>.json``: the parameter names (in Module order) and, in classic mode,
the messages of the calls the store must refuse.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

import mxnet_cpsgd  # noqa: F401  (registers the stores)
from mxnet_cpsgd.training.data.mnist import load_mnist_5k
from mxnet_cpsgd.training.models import LeNet5


def lenet_symbol():
    """The project's Gluon LeNet-5 as a symbol, with a softmax cross-entropy output."""
    net = LeNet5(classes=10, prefix="lenet_")
    net.hybridize()
    return mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")


def data_iter(spec, rank, num_workers):
    x, y = load_mnist_5k()
    n = spec["iterations"] * spec["batch"] * num_workers
    x = (x[:n].astype(np.float32) / 255.0)[rank::num_workers]
    y = y[:n].astype(np.float32)[rank::num_workers]
    return mx.io.NDArrayIter(x, y, spec["batch"], shuffle=False, label_name="softmax_label")


def make_module(spec):
    """LeNet-5 bound for training, every worker with the same initial weights."""
    mod = mx.mod.Module(lenet_symbol(), context=mx.cpu())
    mod.bind(data_shapes=[("data", (spec["batch"], 1, 28, 28))],
             label_shapes=[("softmax_label", (spec["batch"],))])
    mx.random.seed(spec["seed"])
    mod.init_params(mx.init.Xavier(magnitude=2.0))
    return mod


def snapshot(mod):
    args, _ = mod.get_params()
    return {n: args[n].asnumpy() for n in mod._param_names}


def batch_list(it):
    it.reset()
    return list(it)


def run_fit(spec, kv, mod, it, rank, rec):
    saved = os.path.join(spec["out"], "states%d" % rank)

    def maybe_save(param):
        if spec.get("save_at") and param.nbatch + 1 == spec["save_at"]:
            mod.save_optimizer_states(saved)

    for n, w in snapshot(mod).items():
        rec["initial:" + n] = w
    # as example/image-classification's fit.py: the store created by name, passed to fit
    mod.fit(it, num_epoch=1, kvstore=kv, optimizer="sgd",
            optimizer_params=spec["optimizer"], batch_end_callback=maybe_save)
    for n, w in snapshot(mod).items():
        rec["final:" + n] = w
    if spec.get("save_at"):
        # back to the saved step (weights, server state, counters), same batches again
        mod.load_optimizer_states(saved)
        for batch in batch_list(it)[spec["save_at"]:]:
            mod.forward_backward(batch)
            mod.update()
        for n, w in snapshot(mod).items():
            rec["resumed:" + n] = w


def record_weights(mod, rec, names):
    for i, n in enumerate(names):
        rec.setdefault("w:" + n, []).append(mod._exec_group.param_arrays[i][0].asnumpy())


def run_steps(spec, mod, it, rec):
    names = mod._param_names
    record_weights(mod, rec, names)
    for t, batch in enumerate(batch_list(it)):
        mod.forward_backward(batch)
        for i, n in enumerate(names):
            rec.setdefault("g:" + n, []).append(mod._exec_group.grad_arrays[i][0].asnumpy())
        mod.update()
        record_weights(mod, rec, names)
    for n in names:
        rec["final:" + n] = rec["w:" + n][-1]


def refused(call):
    try:
        call()
    except Exception as err:  # noqa: B902 - the message is what the test reads
        return "%s: %s" % (type(err).__name__, err)
    return None


def run_classic(spec, kv, mod, it, rec, meta):
    names = mod._param_names
    weights = [mod._exec_group.param_arrays[i][0] for i in range(len(names))]
    grads = [mod._exec_group.grad_arrays[i][0] for i in range(len(names))]
    meta["refused"] = {"pull_before_init": refused(
        lambda: kv.pull(names[0], out=mx.nd.zeros(weights[0].shape)))}
    kv.init(names, weights)  # rank 0's weights for everybody
    kv.pull(names, out=weights)
    meta["refused"]["push_before_set_optimizer"] = refused(
        lambda: kv.push(names[0], grads[0]))
    opt = mx.optimizer.create("sgd", rescale_grad=1.0 / (spec["batch"] * kv.num_workers),
                              param_idx2name=dict(enumerate(names)), **spec["optimizer"])
    kv.set_optimizer(opt)
    for i, n in enumerate(names):
        rec["w:" + n] = [weights[i].asnumpy()]
    for batch in batch_list(it):
        mod.forward_backward(batch)
        for i, n in enumerate(names):
            rec.setdefault("g:" + n, []).append(grads[i].asnumpy())
        for i, n in enumerate(names):  # one key at a time, as model.py does
            kv.push(n, grads[i], priority=-i)
            kv.pull(n, out=weights[i], priority=-i)
        for i, n in enumerate(names):
            rec["w:" + n].append(weights[i].asnumpy())
    # a pull with no push before it: the servers' weights
    glob = [mx.nd.zeros(w.shape) for w in weights]
    kv.pull(names, out=glob)
    for i, n in enumerate(names):
        rec["final:" + n] = rec["w:" + n][-1]
        rec["global:" + n] = glob[i].asnumpy()
    kv.push(names[0], grads[0])
    meta["refused"].update(
        push_twice=refused(lambda: kv.push(names[0], grads[0])),
        row_sparse_pull=refused(lambda: kv.row_sparse_pull(
            names[0], out=weights[0], row_ids=mx.nd.array([0]))),
        sparse_init=refused(lambda: kv.init("sparse", mx.nd.zeros((4, 2)).tostype(
            "row_sparse"))),
        new_key_after_start=refused(lambda: kv.init("late", mx.nd.zeros((2,)))))
    # arrays of another shape or dtype than the key's (names[1] has no push open)
    shape = tuple(weights[1].shape)
    wrong = shape[::-1] if shape[::-1] != shape else shape + (1,)
    meta["shapes"] = [list(shape), list(wrong)]
    meta["refused"].update(
        push_wrong_shape=refused(lambda: kv.push(names[1], mx.nd.zeros(wrong))),
        pull_wrong_shape=refused(lambda: kv.pull(names[1], out=mx.nd.zeros(wrong))),
        pushpull_wrong_shape=refused(lambda: kv.pushpull(
            names[1], mx.nd.zeros(wrong), out=mx.nd.zeros(wrong))),
        push_wrong_dtype=refused(lambda: kv.push(names[1], mx.nd.zeros(shape,
                                                                      dtype="float64"))))
    kv.pull(names[0], out=weights[0])
    kv.barrier()


def record_layout(kv, meta):
    """Elements each server carries per round, and the servers of each parameter."""
    from mxnet_cpsgd.stores.key_layout import server_of
    servers = int(os.environ["DMLC_NUM_SERVER"])
    layout = kv._layout
    meta["layout"] = type(layout).__name__
    meta["server_loads"] = layout.server_loads(servers)
    meta["servers_of"] = {str(i): sorted({server_of(c.key, servers) for c in chunks})
                          for i, chunks in layout.chunks.items()}


def main():
    spec = json.loads(sys.argv[1])
    num_workers = int(os.environ["DMLC_NUM_WORKER"])
    rec, meta = {}, {}
    mod = make_module(spec)
    if spec["mode"] == "steps":
        # the store by name, as a user passes it (one device: MXNet alone would use none)
        mod.init_optimizer(kvstore=spec["kvstore"], optimizer="sgd",
                           optimizer_params=spec["optimizer"])
        kv = mod._kvstore
        meta["store"] = type(kv).__name__ if kv is not None else None
        run_steps(spec, mod, data_iter(spec, kv.rank, num_workers), rec)
    else:
        kv = mx.kv.create(spec["kvstore"])
        it = data_iter(spec, kv.rank, num_workers)
        if spec["mode"] == "fit":
            run_fit(spec, kv, mod, it, kv.rank, rec)
        else:
            run_classic(spec, kv, mod, it, rec, meta)
    meta["params"] = list(mod._param_names)
    if spec.get("record_layout"):
        record_layout(kv, meta)
    np.savez(os.path.join(spec["out"], "rank%d.npz" % kv.rank),
             **{k: np.asarray(v) for k, v in rec.items()})
    with open(os.path.join(spec["out"], "rank%d.json" % kv.rank), "w") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    main()
