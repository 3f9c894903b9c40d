"""The compressor contract shared by signsgd, topk, powersgd and acpsgd.

A compressor turns one key's gradient into one or more rounds of
communication (GRACE's compress / communicate / decompress, with rounds)::

    msg = compressor.compress(key, grad, step)          # -> Message
    while True:
        collectives.exchange(msg)                        # all-reduce or all-gather
        out = compressor.decompress(key, msg, step)      # -> NDArray or Message
        if not isinstance(out, Message):
            break                                        # out: sum over workers
        msg = out                                        # another round (PowerSGD's Q)

Every call only *enqueues* MXNet engine operations and Horovod operations; nothing
waits, so the rounds of one key overlap the backward pass of the keys still being
computed and Horovod fuses the messages of keys that are ready together.

``decompress`` returns the sum over all workers of the decoded gradients (the
store's contract: ``pushpull`` leaves ``sum_i decode(msg_i)``), shaped like the
gradient.  Error feedback lives in :attr:`memory`
(:class:`~.memory.ErrorFeedback`).
"""
import zlib

import numpy as np
import mxnet as mx

from .memory import ErrorFeedback
from .message import ALLREDUCE, Message

#: base of the seeds of the initial low-rank factors (powersgd, acpsgd)
FACTOR_SEED = 20190


def factor_seed(key, which):
    """Seed of the initial factor ``which`` ('p' or 'q') of ``key``: the same on
    every worker, so the factors start identical without a broadcast.

    ``crc32("<which>:<key>") + FACTOR_SEED`` modulo 2**32.
    """
    return (zlib.crc32(("%s:%s" % (which, key)).encode()) + FACTOR_SEED) % 2 ** 32


def initial_factor(key, which, rows, rank, ctx, dtype="float32"):
    """Standard-normal ``(rows, rank)`` matrix from ``RandomState(factor_seed(key, which))``."""
    rng = np.random.RandomState(factor_seed(key, which))
    return mx.nd.array(rng.standard_normal((rows, rank)), ctx=ctx, dtype=dtype)


class Compressor:
    """Base class; subclasses set :attr:`name` and :attr:`defaults` (and may set
    :attr:`default_exchange`) and implement
    :meth:`compress` and :meth:`decompress`.

    Args:
        config: the resolved :class:`~mxnet_cpsgd.stores.config.AlgorithmConfig`.
        num_workers: M, the number of Horovod processes.
    """

    #: registered store name
    name = None
    #: knob -> default value: every knob of the compressor itself (the store adds
    #: ``exchange``, see :attr:`default_exchange`)
    defaults = {}
    #: default of the knob ``exchange`` for this compressor's stores (itself and
    #: ``cpsgd_<name>``): ``'per_step'`` (one grouped exchange per step and round)
    #: or ``'per_key'`` (each key exchanged as soon as it is pushed)
    default_exchange = "per_step"
    #: attributes holding per-key NDArrays that a resumed run needs (low-rank
    #: factors); the error-feedback memory is saved besides them
    state_attrs = ()

    def __init__(self, config, num_workers):
        self.config = config
        self.num_workers = int(num_workers)
        self.memory = ErrorFeedback()

    def compress(self, key, tensor, step):
        """First message of ``key`` at compressed step ``step`` (0 = first after warm-up)."""
        raise NotImplementedError

    def decompress(self, key, message, step):
        """Sum over workers (an NDArray shaped like the gradient) or the next Message."""
        raise NotImplementedError

    def get_states(self):
        """Per-key state as numpy arrays: the error memory and :attr:`state_attrs`."""
        state = {"memory": {k: v.asnumpy() for k, v in self.memory.items()}}
        for attr in self.state_attrs:
            state[attr] = {k: v.asnumpy() for k, v in getattr(self, attr).items()}
        return state

    def set_states(self, state, ctx):
        """Restore what :meth:`get_states` returned (arrays created on ``ctx``)."""
        self.memory.clear()
        for k, v in state["memory"].items():
            self.memory.store(k, mx.nd.array(v, ctx=ctx, dtype=v.dtype))
        for attr in self.state_attrs:
            setattr(self, attr, {k: mx.nd.array(v, ctx=ctx, dtype=v.dtype)
                                 for k, v in state[attr].items()})

    # helpers for subclasses
    @staticmethod
    def dense(tensor, tag="dense"):
        """A message that all-reduces ``tensor`` uncompressed (in place)."""
        return Message([tensor], ALLREDUCE, tag, {"shape": tensor.shape})
