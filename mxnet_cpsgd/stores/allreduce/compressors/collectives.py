"""Horovod collectives that never block the Python thread.

``hvd.grouped_allreduce_`` is asynchronous already: it queues a Horovod
operation on MXNet's engine.  ``hvd.allgather`` in Horovod 0.28.1 is not: its
output's size is unknown to the caller, so it waits (``wait_to_read``) until the
data has arrived.  The compressors know every all-gather's output size
(M times the input), so :meth:`Collectives.exchange` allocates the outputs with
their final shape and calls Horovod's C entry point
``horovod_mxnet_allgather_async`` itself, without the wait: the engine orders
later reads of the outputs after the all-gather, exactly as for all-reduce.
"""
import ctypes

import mxnet as mx
from mxnet.base import c_handle_array, c_str, check_call

from .message import ALLGATHER, ALLREDUCE

SUPPORTED_HOROVOD = ("0.28.1",)


class Collectives:
    """Asynchronous all-reduce (sum) and all-gather for :class:`~.message.Message`.

    Args:
        hvd: the imported ``horovod.mxnet`` (initialised).
        prefix: prefix of the Horovod operation names (unique per store).
    """

    def __init__(self, hvd, prefix):
        import horovod
        from horovod.mxnet import mpi_ops
        version = getattr(horovod, "__version__", "?")
        self._lib = getattr(mpi_ops, "MPI_MXNET_LIB_CTYPES", None)
        self._process_set = getattr(mpi_ops, "global_process_set", None)
        if version not in SUPPORTED_HOROVOD or self._lib is None or self._process_set is None:
            raise RuntimeError(
                "the compressing Horovod stores call horovod_mxnet_allgather_async of "
                "horovod %s; found horovod %s" % (", ".join(SUPPORTED_HOROVOD), version))
        self._hvd = hvd
        self._prefix = prefix
        self.size = hvd.size()

    def exchange(self, message, key, priority=0):
        """Queue the collective of ``message``; sets ``message.outputs``."""
        name = "%s.%s.%s" % (self._prefix, message.tag, key)
        if message.op == ALLREDUCE:
            self._hvd.grouped_allreduce_(message.tensors, op=self._hvd.Sum, name=name,
                                         priority=priority)
            message.outputs = message.tensors
        elif message.op == ALLGATHER:
            outs = [mx.nd.zeros((self.size * t.shape[0],) + t.shape[1:], ctx=t.context,
                                dtype=t.dtype) for t in message.tensors]
            # one operation per tensor: a grouped all-gather of tensors of different
            # dtypes (uint8 signs + float32 scale) breaks Gloo's framing in 0.28.1
            # ("op.preamble.length <= op.nbytes"); Horovod still fuses separate
            # all-gathers of one dtype that are ready in the same cycle
            for j, (t, o) in enumerate(zip(message.tensors, outs)):
                self.allgather_into([t], [o], "%s.%d" % (name, j), priority)
            message.outputs = outs
        else:  # pragma: no cover - Message checks op
            raise ValueError(message.op)
        return message

    def exchange_group(self, messages, name, priority=0):
        """Queue the collectives of several messages of one round as one grouped
        Horovod operation per (collective, dtype); sets every ``message.outputs``.
        ``name`` must differ between rounds that can be in flight together.

        (A grouped all-gather mixing dtypes breaks Gloo's framing in 0.28.1.)
        """
        groups = {}
        for m in messages:
            if m.op == ALLGATHER:
                m.outputs = [mx.nd.zeros((self.size * t.shape[0],) + t.shape[1:],
                                         ctx=t.context, dtype=t.dtype) for t in m.tensors]
            else:
                m.outputs = m.tensors
            for t, o in zip(m.tensors, m.outputs):
                groups.setdefault((m.op, str(t.dtype)), []).append((t, o))
        for (op, dtype), pairs in sorted(groups.items()):
            full = "%s.%s.%s.%s" % (self._prefix, name, op, dtype)
            tensors = [t for t, _ in pairs]
            if op == ALLREDUCE:
                self._hvd.grouped_allreduce_(tensors, op=self._hvd.Sum, name=full,
                                             priority=priority)
            else:
                self.allgather_into(tensors, [o for _, o in pairs], full, priority)
        return messages

    def allgather_into(self, tensors, outputs, name, priority=0):
        """All-gather ``tensors`` into pre-shaped ``outputs`` without waiting."""
        check_call(self._lib.horovod_mxnet_allgather_async(
            c_handle_array(tensors), c_handle_array(outputs), c_str(name),
            ctypes.c_int(priority), ctypes.c_int(self._process_set.process_set_id),
            ctypes.c_int(len(tensors))))
