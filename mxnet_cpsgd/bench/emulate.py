"""An emulated accelerator for ``cpsgd-bench --emulate-compute MS``.

The forward and backward passes of the model are replaced by *waits* on
MXNet's engine that together take MS milliseconds and produce gradients of the
model's real shapes; everything else (the store, its servers, compression,
ps-lite or Gloo, the emulated network) is real.  The waits sleep (they do not
burn the host's CPU), so on a machine with few shared cores the communication
path gets the CPU it would have next to a GPU.

How one iteration is emulated
-----------------------------
The model's *layers* are the blocks that own trainable parameters
(Conv2D, BatchNorm, Dense, ...), in the order a forward pass calls them.  Each
layer gets a share of the time **in proportion to its forward FLOPs**,
counted from one real forward pass of a single sample with hooks, times the
batch (Conv2D/Dense: 2 x multiply-adds of its output; BatchNorm and anything
else: 4 operations per output value):
a third of MS for the forward pass, two thirds for the backward pass (a
backward costs about twice its forward).

* forward: one engine operation per layer in forward order that *reads* the
  layer's weights (so it waits for the previous step's update of exactly those
  weights, as a real forward does) and sleeps its forward share; the last one
  yields the "loss";
* backward: one engine operation per layer in **reverse** order that sleeps
  its backward share and then writes the layer's gradients (fixed random
  values of the real shapes): each layer's gradients become ready in turn,
  and ``gluon.Trainer`` / the store's per-key push, pull or all-reduce can
  start on them while the "backward" of the earlier layers still runs.

The operations play as one stream, in the order they were pushed, like the
single compute stream of a GPU: one runs when the engine has started it (its
inputs are ready) and the previous one has finished, so the next iteration's
forward follows the last backward.  They are *asynchronous* engine operations
(:mod:`kvstore_ext.engine_wait`) pushed with MXNet's
C API (``MXEnginePushAsyncND``): the engine thread that starts one only hands
its completion callback to a timer thread and is free again at once; the timer
thread sleeps until the layer's time is up, copies the layer's gradient values
into the gradient arrays (the operation owns them until it completes) and
completes the operation.  So a "computing" layer blocks neither the engine's
worker threads nor the store's communication, and costs almost no CPU.

Limits: the gradient *values* are the same every iteration (fine for timing,
meaningless for accuracy; value-dependent compressors such as top-k or a
threshold see the same data every step); activations are not allocated (the
worker's memory is the parameters, gradients and the stores' buffers only);
FLOPs are a proxy for a layer's time (memory-bound layers such as BatchNorm
take relatively longer on a real GPU); a real GPU's host-device copies and
kernel-launch overheads are not modelled.
"""
from typing import List

import numpy as np

import mxnet as mx

from kvstore_ext.engine_wait import data_pointer as _data_pointer
from kvstore_ext.engine_wait import push_wait  # noqa: F401  (part of this module's API)
from mxnet_cpsgd.training.layer_flops import layer_flops  # noqa: F401  (idem)


class EmulatedCompute:
    """Forward + backward of ``net`` as MS milliseconds of engine waits.

    Args:
        net: the initialized, *non-hybridized* model.
        sample_shape: one sample's shape.
        batch_size: per-worker batch (only for the FLOPs count).
        total_ms: forward + backward time per iteration.
        seed: seed of the fixed gradient values.
    """

    FORWARD_SHARE = 1.0 / 3.0

    def __init__(self, net, sample_shape, batch_size: int, total_ms: float, seed: int = 0,
                 ctx=None):
        self.ctx = ctx or mx.cpu()
        self.layers = layer_flops(net, sample_shape, batch_size, self.ctx)
        self.total_ms = float(total_ms)
        total_flops = sum(layer["flops"] for layer in self.layers) or 1.0
        rng = np.random.RandomState(seed)
        for layer in self.layers:
            share = layer["flops"] / total_flops
            layer["share"] = share
            layer["forward_ms"] = self.total_ms * self.FORWARD_SHARE * share
            layer["backward_ms"] = self.total_ms * (1 - self.FORWARD_SHARE) * share
            layer["values"] = [mx.nd.array(1e-2 * rng.standard_normal(p.shape), ctx=self.ctx,
                                           dtype=p.dtype) for p in layer["params"]]
        mx.nd.waitall()
        for layer in self.layers:
            layer["copies"] = []
            for p, value in zip(layer["params"], layer["values"]):
                grad = p.grad(self.ctx)
                assert grad.stype == "default" and value.dtype == grad.dtype
                layer["copies"].append((_data_pointer(grad), _data_pointer(value),
                                        value.size * value.dtype(0).itemsize))

    def describe(self) -> List[dict]:
        """Per layer: name, parameter count, FLOPs share, forward/backward ms."""
        return [{"name": l["name"], "params": sum(int(np.prod(p.shape)) for p in l["params"]),
                 "share": l["share"], "forward_ms": l["forward_ms"],
                 "backward_ms": l["backward_ms"]} for l in self.layers]

    def iteration(self):
        """Issue one emulated forward + backward; returns the "loss" (an NDArray
        that becomes readable when the forward pass ends)."""
        loss = mx.nd.empty((1,), ctx=self.ctx)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            weights = [p.data(self.ctx) for p in layer["params"]]
            push_wait(layer["forward_ms"] / 1e3, weights, [loss] if i == last else [],
                      name="emulated_forward")
        for layer in reversed(self.layers):
            grads = [p.grad(self.ctx) for p in layer["params"]]
            push_wait(layer["backward_ms"] / 1e3, [], grads,
                      layer["copies"], name="emulated_backward")
            for p in layer["params"]:
                # gluon.Trainer refuses gradients no backward wrote since the
                # last step; the flag lives on the parameter's data array
                p.data(self.ctx)._fresh_grad = True
        return loss
