"""EF-SignSGD (Karimireddy, Rebjock, Stich, Jaggi, ICML 2019): scaled sign with error feedback.

Per key, with ``d`` elements and residual ``e`` (zero at first)::

    p = g + e
    c = (||p||_1 / d) * sign(p)          sign(0) -> +1
    e = p - c

Message: the signs packed 8 per byte (uint8, bit 7 of byte j is element 8j)
and the scale (one float32); both are all-gathered, and every worker decodes
and sums ``sum_i scale_i * sign_i``.
"""
import math

import mxnet as mx

from .base import Compressor
from .message import ALLGATHER, Message

_BIT_WEIGHTS = [128.0, 64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0]


class SignSGD(Compressor):
    """EF-SignSGD compressor (see the module docstring)."""

    name = "signsgd"
    defaults = {"warmup_steps": 0}

    def __init__(self, config, num_workers):
        super().__init__(config, num_workers)
        self._weights = {}

    def _bit_weights(self, ctx, dtype):
        w = self._weights.get((ctx, dtype))
        if w is None:
            w = self._weights[(ctx, dtype)] = mx.nd.array(_BIT_WEIGHTS, ctx=ctx, dtype=dtype)
        return w

    def compress(self, key, tensor, step):
        d = tensor.size
        p = self.memory.add_to(key, tensor.reshape((-1,)))
        scale = mx.nd.norm(p, ord=1).reshape((1,)) / d
        bits = p >= 0                                       # 1.0 where sign is +1
        self.memory.store(key, p - mx.nd.broadcast_mul(bits * 2 - 1, scale))
        nbytes = int(math.ceil(d / 8.0))
        if nbytes * 8 != d:
            bits = mx.nd.concat(bits, mx.nd.zeros((nbytes * 8 - d,), ctx=p.context,
                                                  dtype=p.dtype), dim=0)
        packed = mx.nd.dot(bits.reshape((nbytes, 8)), self._bit_weights(p.context, p.dtype))
        packed = packed.astype("uint8")
        return Message([packed, scale], ALLGATHER, "sign",
                       {"shape": tensor.shape, "d": d, "nbytes": nbytes})

    def decompress(self, key, message, step):
        st = message.state
        m, d, nbytes = self.num_workers, st["d"], st["nbytes"]
        packed, scales = message.outputs                     # (M*nbytes,), (M,)
        x = packed.astype(scales.dtype).reshape((m, nbytes, 1))
        w = self._bit_weights(x.context, x.dtype).reshape((1, 1, 8))
        bits = mx.nd.floor(mx.nd.broadcast_div(x, w)) % 2    # (M, nbytes, 8)
        bits = bits.reshape((m, nbytes * 8))
        if nbytes * 8 != d:
            bits = mx.nd.slice_axis(bits, axis=1, begin=0, end=d)
        signs = bits * 2 - 1
        total = mx.nd.sum(mx.nd.broadcast_mul(signs, scales.reshape((m, 1))), axis=0)
        return total.reshape(st["shape"])
