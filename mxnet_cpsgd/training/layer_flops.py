"""Forward FLOPs per layer of a Gluon model, the proxy for each layer's share of an
emulated accelerator's time (``cpsgd-bench --emulate-compute``, the training
scripts' ``--emulate-compute``).

The layers are the blocks that own trainable parameters (Conv2D, BatchNorm, Dense,
...), in the order a forward pass calls them.  Conv2D/Dense count 2 x
multiply-adds of their output; BatchNorm and anything else 4 operations per output
value.
"""
from typing import List

import mxnet as mx
from mxnet import gluon


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def layer_flops(net: gluon.Block, sample_shape, batch_size: int, ctx=None,
                train_mode: bool = True) -> List[dict]:
    """The layers (blocks owning trainable parameters) in forward order with
    their forward FLOPs for a batch of ``batch_size``, from one real forward
    pass of a *non-hybridized* ``net`` (initialized) with hooks.  Returns
    ``[{"name", "params", "flops"}]``.

    The pass runs on one sample and the counts are multiplied by the batch:
    every count is linear in the batch, and a batch-32 pass of ResNet-50 would
    hold 3.3 GB of activations in every emulated worker.

    Args:
        net: the model (initialized, not hybridized).
        sample_shape: one sample's shape.
        batch_size: the batch the counts are for.
        ctx: the device of the pass (default CPU).
        train_mode: run the pass in training mode, recorded (a model that trains
            next needs that, see below); False: predict mode, which draws no random
            numbers (dropout) and leaves BatchNorm's running statistics alone.
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
        if train_mode:
            with mx.autograd.record():
                out = net(mx.nd.zeros((1,) + tuple(sample_shape), ctx=ctx))
        else:
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
