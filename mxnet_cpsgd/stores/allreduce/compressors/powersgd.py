"""PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019), rank r, warm start, error feedback.

Per key, the gradient viewed as a matrix ``(n, m) = (shape[0], -1)``, rank
``r = min(rank, n, m)``; a key is compressed when it has at least 2 dimensions
and ``r * (n + m) < n * m / 2`` (compression by more than 2x), else it is
all-reduced uncompressed.  For a compressed key, with residual ``E`` (zero at
first) and ``Q`` (seeded, identical on every worker; afterwards the previous
step's mean Q: warm start)::

    A = G + E
    P = A Q                 all-reduce (sum) P
    P = orth(P)             Gram-Schmidt with epsilon
    Q = A^T P               all-reduce (sum) Q  -> Q_sum
    out = P Q_sum^T         the sum over workers of P Q_i^T (the store's result)
    E = A - out / M         as in epfml/powersgd (the mean approximation)
    Q <- Q_sum / M          warm start of the next step
"""
import mxnet as mx

from .base import Compressor, initial_factor
from .message import ALLREDUCE, Message
from .orthogonalize import orthogonalize


def matrix_shape(shape):
    """``(shape[0], prod(shape[1:]))``; None for 0-D or 1-D shapes."""
    if len(shape) < 2:
        return None
    m = 1
    for s in shape[1:]:
        m *= s
    return shape[0], m


def powersgd_rank(rank, shape):
    """The rank used for ``shape`` or None when PowerSGD sends it uncompressed."""
    nm = matrix_shape(shape)
    if nm is None:
        return None
    n, m = nm
    r = min(rank, n, m)
    if r * (n + m) >= n * m / 2.0:
        return None
    return r


class PowerSGD(Compressor):
    """PowerSGD compressor (see the module docstring)."""

    name = "powersgd"
    defaults = {"rank": 4, "warmup_steps": 0}
    state_attrs = ("_q",)

    def __init__(self, config, num_workers):
        super().__init__(config, num_workers)
        self._q = {}

    def compress(self, key, tensor, step):
        r = powersgd_rank(self.config.rank, tensor.shape)
        if r is None:
            return self.dense(tensor)
        n, m = matrix_shape(tensor.shape)
        a = self.memory.add_to(key, tensor.reshape((n, m)))
        q = self._q.get(key)
        if q is None:
            q = initial_factor(key, "q", m, r, tensor.context, tensor.dtype)
        p = mx.nd.dot(a, q)
        return Message([p], ALLREDUCE, "p", {"shape": tensor.shape, "a": a})

    def decompress(self, key, message, step):
        st = message.state
        if message.tag == "dense":
            return message.outputs[0]
        if message.tag == "p":
            p = orthogonalize(message.outputs[0])
            q = mx.nd.dot(st["a"], p, transpose_a=True)
            st["p"] = p
            return Message([q], ALLREDUCE, "q", st)
        q_sum = message.outputs[0]
        out = mx.nd.dot(st["p"], q_sum, transpose_b=True)
        self.memory.store(key, st["a"] - out / self.num_workers)
        self._q[key] = q_sum / self.num_workers
        return out.reshape(st["shape"])
