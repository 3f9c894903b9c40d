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
forward follows the last backward.  They are *asynchronous* engine operations pushed with MXNet's
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
import ctypes
import threading
import time
from typing import List

import mxnet as mx
from mxnet import gluon
from mxnet.base import _LIB, check_call

# void (*EngineAsyncFunc)(void* run_context, void* on_complete, void* param)
_ASYNC_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# engine::CallbackOnComplete: {void (*callback_)(Engine*, void*, const Error*); Engine*; void*}
_ON_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class _CallbackOnComplete(ctypes.Structure):
    _fields_ = [("callback", ctypes.c_void_p), ("engine", ctypes.c_void_p),
                ("param", ctypes.c_void_p)]


class _Context(ctypes.Structure):  # mxnet::Context {DeviceType dev_type; int32 dev_id}
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


class _Timer:
    """One thread that plays the emulated operations as one stream, in the
    order they were pushed: an operation runs when it has started on the engine
    (its inputs are ready) and the previous one's time is up, whichever is
    later, for its time; then its copies are done and it is completed.

    Deadlines count from the previous operation's *deadline*, not from when this
    thread got around to it, so the engine's and this thread's wake-up latency
    does not add up over the ~100 operations of an iteration."""

    def __init__(self):
        self._cond = threading.Condition()
        self._pending = {}   # id -> (seconds, copies), pushed, not yet started
        self._started = {}   # id -> (started at, callback, seconds, copies)
        self._next_push = 0
        self._head = 0       # the next operation to play
        self._last_deadline = 0.0
        self._thread = threading.Thread(target=self._run, name="emulated-compute",
                                        daemon=True)
        self._thread.start()
        self.func = _ASYNC_FUNC(self._on_start)

    def register(self, seconds, copies):
        """An id for the operation about to be pushed (push order = play order)."""
        with self._cond:
            op_id = self._next_push
            self._next_push += 1
            self._pending[op_id] = (seconds, copies)
        return op_id

    def _on_start(self, run_context, on_complete, param):
        # on an engine worker thread: record and return at once
        now = time.monotonic()
        cb = _CallbackOnComplete.from_address(on_complete)
        saved = (cb.callback, cb.engine, cb.param)
        op_id = param or 0
        with self._cond:
            seconds, copies = self._pending.pop(op_id)
            self._started[op_id] = (now, saved, seconds, copies)
            self._cond.notify()

    def _run(self):
        while True:
            with self._cond:
                while self._head not in self._started:
                    self._cond.wait()
                started, saved, seconds, copies = self._started.pop(self._head)
                self._head += 1
            deadline = max(started, self._last_deadline) + seconds
            self._last_deadline = deadline
            wait = deadline - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            for dst, src, nbytes in copies:
                ctypes.memmove(dst, src, nbytes)
            callback, engine, cb_param = saved
            _ON_COMPLETE(callback)(engine, cb_param, None)


_TIMER = []


def _timer():
    if not _TIMER:
        _TIMER.append(_Timer())
    return _TIMER[0]


def _data_pointer(array):
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(ptr)))
    return ptr.value


def push_wait(seconds, reads, writes, copies=(), name="emulated"):
    """Push one asynchronous engine operation that reads ``reads``, owns
    ``writes`` and completes ``seconds`` after it starts (after doing
    ``copies``)."""
    timer = _timer()
    op_id = timer.register(seconds, list(copies))
    ctx = _Context(1, 0)  # cpu(0)
    const = (ctypes.c_void_p * max(1, len(reads)))(*[a.handle.value for a in reads])
    mut = (ctypes.c_void_p * max(1, len(writes)))(*[a.handle.value for a in writes])
    check_call(_LIB.MXEnginePushAsyncND(
        timer.func, ctypes.c_void_p(op_id), None, ctypes.byref(ctx),
        const, ctypes.c_int(len(reads)), mut, ctypes.c_int(len(writes)),
        None, ctypes.c_int(0), ctypes.c_char_p(name.encode()), ctypes.c_bool(False)))


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def layer_flops(net: gluon.Block, sample_shape, batch_size: int, ctx=None) -> List[dict]:
    """The layers (blocks owning trainable parameters) in forward order with
    their forward FLOPs for a batch of ``batch_size``, from one real forward
    pass of a *non-hybridized* ``net`` (initialized) with hooks.  Returns
    ``[{"name", "params", "flops"}]``.

    The pass runs on one sample and the counts are multiplied by the batch:
    every count is linear in the batch, and a batch-32 pass of ResNet-50 would
    hold 3.3 GB of activations in every emulated worker.
    """
    ctx = ctx or mx.cpu()
    order, handles = [], []

    def hook(block, inputs, output):
        out = output[0] if isinstance(output, (list, tuple)) else output
        outputs = _prod(out.shape)
        weight = block._reg_params.get("weight")
        kind = type(block).__name__
        if weight is not None and kind.startswith("Conv"):
            spatial = _prod(out.shape[2:])
            flops = 2 * _prod(weight.shape) * spatial * out.shape[0]
        elif weight is not None and kind == "Dense":
            flops = 2 * _prod(weight.shape) * out.shape[0]
        else:
            flops = 4 * outputs
        order.append((block, flops))

    def visit(block):
        params = [p for p in block._reg_params.values() if p.grad_req != "null"]
        if params:
            handles.append(block.register_forward_hook(hook))
        for child in block._children.values():
            visit(child)

    visit(net)
    try:
        # inside record(), as models.initialize does: outside it MXNet 1.9.1's
        # MKL-DNN build leaves the weights in a layout the kvstore cannot send
        with mx.autograd.record():
            out = net(mx.nd.zeros((1,) + tuple(sample_shape), ctx=ctx))
        out.wait_to_read()
        del out  # frees the pass's activations
    finally:
        for h in handles:
            h.detach()
    layers, seen = [], set()
    for block, flops in order:
        if id(block) in seen:
            continue
        seen.add(id(block))
        params = [p for p in block._reg_params.values() if p.grad_req != "null"]
        layers.append({"name": block.name, "params": params,
                       "flops": float(flops) * batch_size})
    covered = {id(p) for layer in layers for p in layer["params"]}
    missing = [p.name for p in net.collect_params().values()
               if p.grad_req != "null" and id(p) not in covered]
    if missing:
        raise RuntimeError("emulated compute: parameters not used in the forward pass: %s"
                           % ", ".join(missing))
    return layers


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
        import numpy as np
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
        return [{"name": l["name"], "params": sum(_prod(p.shape) for p in l["params"]),
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
