"""The compressing all-reduce stores: the ``horovod`` store with a compressor.

:class:`CompressedHorovod` keeps everything of
:class:`~mxnet_cpsgd.stores.allreduce.horovod.Horovod` (rank 0's broadcast of the initial
weights, the optimizer on every worker, dense parameters only, several devices
summed first) and replaces the all-reduce of ``pushpull`` by its compressor's
rounds of communication.  ``pushpull(key, g)`` leaves in ``g`` the sum over the
workers of the decoded gradients, so ``trainer.step(B)`` applies
``Opt(w, sum_i decode(msg_i) / B)`` exactly as ``horovod`` and ``ssgd`` apply
``Opt(w, sum_i g_i / B)``.

Each key counts its own steps; the first ``warmup_steps`` of a key are plain
all-reduces (as ``horovod``), then the compressor takes over.

Nothing in ``pushpull`` waits: compression, the Horovod collectives (all-reduce,
or all-gather through :class:`~.collectives.Collectives`) and decompression are
all queued on MXNet's engine, ordered by their data.  Each key's compression
starts as soon as its gradient is ready (overlapping the rest of the backward
pass); with the knob ``exchange='per_step'`` (the default but for fp16) the step's
messages are exchanged as one grouped Horovod operation per round, collective and
dtype once the last key is pushed; with ``exchange='per_key'`` each key is
exchanged on its own at once.  See docs/algorithms/acpsgd.md, "What overlaps what".
"""
import os

from ... import config as config_mod
from .. import horovod as _hvd_store
from .collectives import Collectives
from .message import Message


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


class CompressedHorovod(_hvd_store.Horovod):
    """A Horovod store whose ``pushpull`` compresses (subclasses set
    :attr:`compressor_class`).

    Args:
        config: an :class:`~mxnet_cpsgd.stores.config.AlgorithmConfig` for this store,
            a dict of knobs, or None.  Knobs also come from ``MXNET_CPSGD_*``
            and from the Trainer's ``compression_params`` (highest precedence).
    """

    compressor_class = None
    #: an assignment to :attr:`group_per_step`, or None (the knob decides)
    _group_override = None

    def __init__(self, config=None):
        name = self.store_name()
        self._explicit = config_mod.store_knobs(name, config)
        # validate before importing Horovod: a bad knob fails without it
        self._config = config_mod.resolve(name, self.knob_defaults(), self._explicit,
                                          os.environ)
        try:
            hvd = _hvd_store._import_horovod()
        except ImportError as err:
            raise ImportError(str(err).replace("kvstore '%s'" % _hvd_store.NAME,
                                               "kvstore '%s'" % name, 1)) from None
        _hvd_store.init_horovod(hvd)
        self._hvd = hvd
        self._prefix = "mxnet_cpsgd.%d" % _hvd_store._instances[0]
        _hvd_store._instances[0] += 1
        self._collectives = Collectives(hvd, self._prefix)
        self._configure()
        self._steps = {}
        self._in_flight = {}
        self._keys = set()
        self._pending = []

    @classmethod
    def store_name(cls):
        """The registered name (``kvstore=``)."""
        return cls.compressor_class.name

    @classmethod
    def knob_defaults(cls):
        """knob -> default: every knob the store accepts."""
        return dict(cls.compressor_class.defaults,
                    exchange=cls.compressor_class.default_exchange)

    def _configure(self):
        """Build the compressor from the resolved config (again when it changes)."""
        self._compressor = self.compressor_class(self._config, self._hvd.size())

    @property
    def group_per_step(self):
        """True (knob ``exchange='per_step'``, every compressor's default but fp16's):
        the compressed messages of a step are held until the step's last key is
        pushed (every key the Trainer broadcast, or the end of
        ``Trainer._allreduce_grads``), then exchanged as one grouped Horovod
        operation per round and dtype.  False
        (``exchange='per_key'``): every key is exchanged on its own as soon as it
        is pushed (pipelined with the backward pass; Horovod fuses what is ready
        in the same cycle).

        Read from the resolved knob; assigning the attribute (before the first
        ``pushpull``, as scripts/measure_overlap.py does) overrides the knob until
        ``compression_params`` set ``exchange`` again.  See
        docs/algorithms/acpsgd.md, "What overlaps what"."""
        if self._group_override is not None:
            return self._group_override
        return self._config.exchange != "per_key"

    @group_per_step.setter
    def group_per_step(self, value):
        self._group_override = bool(value)

    @property
    def type(self):
        return self.store_name()

    @property
    def compressor(self):
        """The :class:`~.base.Compressor` (error-feedback memory, factors)."""
        return self._compressor

    def set_gradient_compression(self, compression_params):
        """Apply the Trainer's ``compression_params`` (validated like the other stores)."""
        config_mod.check_compression_params(compression_params)
        if any(self._steps.values()):
            raise RuntimeError("kvstore '%s': set compression_params before the first "
                               "pushpull" % self.type)
        merged = dict(self._explicit, **compression_params)
        self._config = config_mod.resolve(self.type, self.knob_defaults(), merged, os.environ)
        if "exchange" in compression_params:  # the newer choice wins over an assignment
            self._group_override = None
        self._configure()

    def pushpull(self, key, value, out=None, priority=0):
        """Sum over workers of the decoded compressed gradients into ``out``
        (default: ``value``).  Asynchronous: only queues engine operations."""
        if _hvd_store.split_keys(self, key, value, out, priority):
            return
        key = _as_list(key)[0]
        buf, outs = _hvd_store.sum_devices(key, value, out)

        count = self._steps.get(key, 0)
        self._steps[key] = count + 1
        warmup = self._config.warmup_steps or 0
        if count < warmup:
            self._hvd.allreduce_(buf, op=self._hvd.Sum, name="%s.grad.%s" % (self._prefix, key),
                                 priority=priority)
            for o in outs[1:]:
                buf.copyto(o)
            return
        step = count - warmup
        item = _Pending(key, buf, outs[1:], step, priority,
                        self._compressor.compress(key, buf, step))
        if not self.group_per_step:
            self._run([item], key)
            return
        self._pending.append(item)
        if len(self._pending) >= len(self._keys):
            self.end_of_step()

    def end_of_step(self):
        """Exchange the messages held for the current step (one group per round).

        Called by the store when every broadcast key has been pushed and by
        ``gluon.Trainer._allreduce_grads`` after its last ``pushpull`` (so a
        parameter with ``grad_req='null'`` does not hold the group back).
        """
        if self._pending:
            pending, self._pending = self._pending, []
            self._run(pending, "step")

    def broadcast(self, key, value, out, priority=0):
        """As ``horovod``; also records the keys (one group per step needs them)."""
        self._keys.update(_as_list(key))
        super().broadcast(key, value, out, priority)

    def _run(self, items, slot):
        """Exchange and decompress ``items`` (one key, or the step's group) round by
        round; write every result into its key's buffer."""
        sent = []
        rounds = 0
        while items:
            if len(items) == 1:
                self._collectives.exchange(items[0].message, items[0].key, items[0].priority)
            else:
                self._collectives.exchange_group([i.message for i in items],
                                                 "group%d" % rounds)
            rounds += 1
            following = []
            for it in items:
                sent.append((it.message.tensors, it.message.outputs))
                result = self._compressor.decompress(it.key, it.message, it.step)
                if isinstance(result, Message):
                    it.message = result
                    following.append(it)
                    continue
                if result is not it.buf:
                    result.copyto(it.buf)
                for o in it.outs:
                    it.buf.copyto(o)
            items = following
        # Horovod's queued operations hold raw pointers to these NDArrays, and MXNet
        # frees an NDArray with its Python object: keep the arrays of the last two
        # steps; before letting older ones go, wait for their collectives (in a
        # training loop they finished long ago, so this does not block: step t+1's
        # weights depend on them)
        older, last = self._in_flight.get(slot, (None, None))
        for _, outputs in older or ():
            for a in outputs:
                a.wait_to_read()
        self._in_flight[slot] = (last, sent)


class _Pending:
    """One key's compressed step on its way through the rounds of communication."""

    __slots__ = ("key", "buf", "outs", "step", "priority", "message")

    def __init__(self, key, buf, outs, step, priority, message):
        self.key, self.buf, self.outs = key, buf, outs
        self.step, self.priority, self.message = step, priority, message


def _install_step_end_hook():
    """Make ``gluon.Trainer._allreduce_grads`` call ``end_of_step()`` on stores that
    have it, after its last ``pushpull`` (idempotent)."""
    from mxnet import gluon
    current = gluon.Trainer._allreduce_grads
    if getattr(current, "_mxnet_cpsgd_step_end", False):
        return

    def _allreduce_grads(self):
        current(self)
        end = getattr(self._kvstore, "end_of_step", None)
        if end is not None:
            end()

    _allreduce_grads._mxnet_cpsgd_step_end = True
    _allreduce_grads.__wrapped__ = current
    gluon.Trainer._allreduce_grads = _allreduce_grads


_install_step_end_hook()


def store_class(compressor):
    """The registered store class of ``compressor`` (named like it, lower case)."""
    cls = type(compressor.__name__, (CompressedHorovod,), {
        "compressor_class": compressor,
        "__doc__": "kvstore '%s': %s\n\n%s" % (
            compressor.name, (compressor.__doc__ or "").strip(), CompressedHorovod.__doc__),
        "__module__": __name__,
    })
    return cls
