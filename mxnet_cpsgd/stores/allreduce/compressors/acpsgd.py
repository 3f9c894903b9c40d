"""ACP-SGD (Zhang, Shi, Chu, Li et al., "Evaluation and Optimization of Gradient
Compression for Distributed Deep Learning", arXiv 2306.08881): alternate
compressed power iterations, one all-reduce per step.

As the authors' code does it (github.com/lzhangbv/acpsgd, acpsgd.py, commit
ec75a2a; line numbers in docs/algorithms/acpsgd.md).  Per key with at least 2
dimensions, ``(n, m) = (shape[0], -1)``, ``r = min(rank, n, m)``; ``P`` and
``Q`` start seeded and identical on every worker, ``E`` at zero.  Compressed
steps alternate, starting with a P step::

    P step:  Q = orth(Q);  A = G + E;  P = A Q;  E = A - P Q^T
             all-reduce (sum) P -> P_sum;   out = P_sum Q^T;  keep P = P_sum
    Q step:  P = orth(P);  A = G + E;  Q = A^T P;  E = A - P Q^T
             all-reduce (sum) Q -> Q_sum;   out = P Q_sum^T;  keep Q = Q_sum

``out`` is the sum over workers of the decoded gradients (the other factor
is the same on every worker).  1-D keys are all-reduced uncompressed every step.
"""
import mxnet as mx

from .base import Compressor, initial_factor
from .message import ALLREDUCE, Message
from .orthogonalize import orthogonalize
from .powersgd import matrix_shape


def acpsgd_rank(rank, shape):
    """The rank used for ``shape`` or None for an uncompressed (1-D) key."""
    nm = matrix_shape(shape)
    if nm is None:
        return None
    return min(rank, nm[0], nm[1])


class ACPSGD(Compressor):
    """ACP-SGD compressor (see the module docstring)."""

    name = "acpsgd"
    defaults = {"rank": 4, "warmup_steps": 0}
    state_attrs = ("_p", "_q")

    def __init__(self, config, num_workers):
        super().__init__(config, num_workers)
        self._p = {}
        self._q = {}

    def _factors(self, key, n, m, r, ctx, dtype):
        if key not in self._p:
            self._p[key] = initial_factor(key, "p", n, r, ctx, dtype)
            self._q[key] = initial_factor(key, "q", m, r, ctx, dtype)
        return self._p[key], self._q[key]

    def compress(self, key, tensor, step):
        r = acpsgd_rank(self.config.rank, tensor.shape)
        if r is None:
            return self.dense(tensor)
        n, m = matrix_shape(tensor.shape)
        p, q = self._factors(key, n, m, r, tensor.context, tensor.dtype)
        a = self.memory.add_to(key, tensor.reshape((n, m)))
        if step % 2 == 0:
            q = orthogonalize(q)
            p = mx.nd.dot(a, q)
            self._q[key] = q
            tag = "p"
        else:
            p = orthogonalize(p)
            q = mx.nd.dot(a, p, transpose_a=True)
            self._p[key] = p
            tag = "q"
        self.memory.store(key, a - mx.nd.dot(p, q, transpose_b=True))
        return Message([p if tag == "p" else q], ALLREDUCE, tag,
                       {"shape": tensor.shape, "p": p, "q": q})

    def decompress(self, key, message, step):
        st = message.state
        if message.tag == "dense":
            return message.outputs[0]
        total = message.outputs[0]
        if message.tag == "p":
            self._p[key] = total
            out = mx.nd.dot(total, st["q"], transpose_b=True)
        else:
            self._q[key] = total
            out = mx.nd.dot(st["p"], total, transpose_b=True)
        return out.reshape(st["shape"])
