"""``--emulate-compute MS``: real training whose forward + backward take MS
milliseconds per iteration, as on an accelerator of that speed.

The real forward and backward run as always (real gradients, the same numbers as
without the flag); beside them, timed waits on MXNet's engine
(:mod:`kvstore_ext.engine_wait`) stretch them to the emulated schedule of
``cpsgd-bench --emulate-compute``: a third of MS for the forward pass and two thirds
for the backward pass, each layer's share in proportion to its forward FLOPs.

* forward: at the start of the iteration, one wait per layer in forward order that
  *reads* the layer's weights (it starts once the previous step's update of those
  weights is there) and plays the layer's forward share;
* backward: after the real backward was issued, one wait per layer in **reverse**
  order that *owns* the layer's gradients (it starts once the real backward wrote
  them) for its backward share, then releases them unchanged: the store's push,
  pull or all-reduce of a layer can start while the earlier layers' backward still
  "runs", as on a GPU.

The waits play as one stream, so the padded forward + backward ends MS ms after the
forward started, or later where the real compute of a layer took longer than its
emulated schedule (counted: :attr:`PaddedCompute.overrun_seconds`).  With
``--time-scale D`` every wait is D times longer (and the job's links should be D
times slower: time dilation, see docs/performance.md).
"""
import argparse
from typing import List, Sequence, Tuple

import mxnet as mx
from mxnet import gluon

from kvstore_ext.engine_wait import push_wait, timer
from . import models
from .layer_flops import layer_flops
from .options import UsageError

#: the forward pass's share of an iteration's compute (a backward costs about twice)
FORWARD_SHARE = 1.0 / 3.0


def layer_shares(model_name: str, classes: int, sample_shape: Sequence[int],
                 batch_size: int) -> List[Tuple[float, List[int]]]:
    """Each trainable layer's share of the compute (forward FLOPs), in forward
    order, with the indices of its parameters among the model's trainable ones
    (``collect_params`` order).

    Counted on a separate, zero-initialized copy of the model in predict mode: no
    random number is drawn and the trained model is not touched, so the training's
    numbers stay those of an unpadded run.

    Args:
        model_name: the model (:data:`models.MODELS`).
        classes: output classes.
        sample_shape: one sample's shape.
        batch_size: per-worker batch.

    Returns:
        ``[(share, [parameter index, ...])]``.
    """
    copy = models.get_model(model_name, classes=classes)
    copy.initialize(mx.init.Zero(), ctx=mx.cpu())
    layers = layer_flops(copy, sample_shape, batch_size, train_mode=False)
    index = {id(p): i for i, p in enumerate(
        p for p in copy.collect_params().values() if p.grad_req != "null")}
    total = sum(layer["flops"] for layer in layers) or 1.0
    return [(layer["flops"] / total, [index[id(p)] for p in layer["params"]])
            for layer in layers]


class PaddedCompute:
    """Pads each iteration's forward + backward to ``total_ms`` x ``time_scale``.

    Args:
        net: the trained model (its trainable parameters in ``collect_params`` order).
        model_name: its name, to count the layers' FLOPs on a copy.
        classes: output classes.
        sample_shape: one sample's shape.
        batch_size: per-worker batch.
        total_ms: emulated forward + backward time per iteration.
        time_scale: time dilation D >= 1 (every wait x D).
        ctx: the worker's one device.
    """

    def __init__(self, net: gluon.Block, model_name: str, classes: int,
                 sample_shape: Sequence[int], batch_size: int, total_ms: float,
                 time_scale: float, ctx: mx.Context):
        params = [p for p in net.collect_params().values() if p.grad_req != "null"]
        shares = layer_shares(model_name, classes, sample_shape, batch_size)
        counted = sorted(i for _, indices in shares for i in indices)
        if counted != list(range(len(params))):
            raise UsageError("--emulate-compute: the layers of %s hold %d trainable "
                             "parameters, the model %d" % (model_name, len(counted),
                                                          len(params)))
        seconds = total_ms * time_scale / 1e3
        self.ctx = ctx
        self.layers = []  # (params, forward s, backward s), forward order
        for share, indices in shares:
            self.layers.append(([params[i] for i in indices],
                                seconds * FORWARD_SHARE * share,
                                seconds * (1 - FORWARD_SHARE) * share))
        self._late_at_start = timer().late_seconds

    def forward(self) -> None:
        """Call before the real forward: the emulated forward waits."""
        for params, forward_s, _ in self.layers:
            push_wait(forward_s, [p.data(self.ctx) for p in params], [],
                      name="padded_forward")

    def backward(self) -> None:
        """Call after ``autograd.backward``: the emulated backward waits, which hold
        each layer's gradients until the layer's emulated backward is over."""
        for params, _, backward_s in reversed(self.layers):
            push_wait(backward_s, [], [p.grad(self.ctx) for p in params],
                      name="padded_backward", track_late=True)

    @property
    def overrun_seconds(self) -> float:
        """Seconds by which the real backward released gradients after the emulated
        schedule, summed since this object was made (0: the padding set the time)."""
        return timer().late_seconds - self._late_at_start


def padded_compute(args: argparse.Namespace, net: gluon.Block, model_name: str,
                   classes: int, sample_shape: Sequence[int],
                   ctx: List[mx.Context]):
    """The :class:`PaddedCompute` of ``--emulate-compute`` (None without the flag).

    Raises:
        UsageError: several devices per worker (one emulated stream per worker).
    """
    total_ms = getattr(args, "emulate_compute", None)
    if not total_ms:
        return None
    if len(ctx) != 1 or ctx[0].device_type != "cpu":
        raise UsageError("--emulate-compute pads the compute of one CPU device per worker")
    return PaddedCompute(net, model_name, classes, sample_shape, args.batch_size, total_ms,
                         getattr(args, "time_scale", 1.0) or 1.0, ctx[0])
