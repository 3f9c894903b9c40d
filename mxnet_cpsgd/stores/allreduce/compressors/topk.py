"""Top-k sparsification with error feedback (Stich et al. 2018; Aji & Heafield 2017).

Per key, with ``d`` elements, ``k = max(1, floor(ratio * d + 0.5))``::

    p = g + e
    I = indices of the k largest |p|       (MXNet topk, int32)
    e = p with the entries at I set to 0

Message: ``p[I]`` (float32) and ``I`` (int32), all-gathered; every worker
scatter-adds every worker's values into a zero tensor.
"""
import math

import mxnet as mx

from .base import Compressor
from .message import ALLGATHER, Message


def topk_count(ratio, d):
    """``k = max(1, floor(ratio * d + 0.5))`` (round half up), at most ``d``."""
    return min(d, max(1, int(math.floor(ratio * d + 0.5))))


class TopK(Compressor):
    """Top-k compressor (see the module docstring)."""

    name = "topk"
    defaults = {"ratio": 0.01, "warmup_steps": 0}

    def compress(self, key, tensor, step):
        d = tensor.size
        k = topk_count(self.config.ratio, d)
        p = self.memory.add_to(key, tensor.reshape((-1,)))
        idx = mx.nd.topk(mx.nd.abs(p), k=k, ret_typ="indices", dtype="int32")
        values = mx.nd.take(p, idx)
        sent = mx.nd.scatter_nd(values, idx.reshape((1, k)), shape=(d,))
        self.memory.store(key, p - sent)
        return Message([values, idx], ALLGATHER, "topk",
                       {"shape": tensor.shape, "d": d, "k": k})

    def decompress(self, key, message, step):
        st = message.state
        d, k = st["d"], st["k"]
        values, idx = message.outputs                       # (M*k,), (M*k,)
        parts = []
        for w in range(self.num_workers):
            v = mx.nd.slice_axis(values, axis=0, begin=w * k, end=(w + 1) * k)
            i = mx.nd.slice_axis(idx, axis=0, begin=w * k, end=(w + 1) * k)
            # indices are distinct within one worker's message
            parts.append(mx.nd.scatter_nd(v, i.reshape((1, k)), shape=(d,)))
        total = parts[0] if len(parts) == 1 else mx.nd.add_n(*parts)
        return total.reshape(st["shape"])
