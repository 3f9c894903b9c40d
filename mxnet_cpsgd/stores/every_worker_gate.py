"""Hold pushes until every worker has come as far, without stopping compute.

``cpsgd`` with ``correction_delay=1, correction_start='all'`` starts the
correction's full-precision pushes only once every worker's previous round has
landed, so that the first workers' dense pushes do not share the links with the
last workers' pulls (docs/algorithms/cpsgd.md).
"""
import mxnet as mx
import numpy as np

from .key_layout import SIGNAL_KEY


class EveryWorkerGate:
    """A one-element synchronous round as a cross-worker signal.

    A synchronous server answers a push once every worker's push of that round
    has arrived, and MXNet pushes a single CPU array without copying it, so the
    push reads the array until that answer comes: an engine write to the array
    after the push waits for every worker.  Arrays that depend on the write (0
    added to their first element) are then not readable before it, so pushes of
    them issued afterwards start no earlier.  Nothing blocks the caller.

    Args:
        kv: the inner MXNet dist store; the constructor initialises the signal
            key, a collective call: every worker constructs its gate at the same
            point.
    """

    def __init__(self, kv):
        self._kv = kv
        self._signal = mx.nd.zeros((1,), dtype=np.float32)
        kv.init(SIGNAL_KEY, self._signal)

    def hold(self, arrays):
        """Arrays (to be pushed next) become writable-after-every-worker."""
        self._kv.push(SIGNAL_KEY, self._signal)
        self._signal[:] = 0  # waits for the answer to the push above
        for array in arrays:
            if array.size:
                head = array.reshape((-1,))[0:1]
                mx.nd.elemwise_add(head, self._signal, out=head)
