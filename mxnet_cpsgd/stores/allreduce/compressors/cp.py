"""CP-SGD around any compressor, on the all-reduce transport: ``cpsgd_<compressor>``.

What a step does is the CP-SGD policy's (:class:`~mxnet_cpsgd.stores.policies.cpsgd.CPSGD`,
asked per key and step, as the parameter-server store asks it); how the bytes
move is Horovod (this store, built on :class:`~.store.CompressedHorovod`); what
the bytes are is the compressor's.  Per key ``k`` and iteration ``t``:

* the global weights ``W`` live on every worker; the store updates them with
  the Trainer's optimizer on the all-reduced (decoded) gradient, identically on
  every worker: ``W_{t+1} = Opt_g(W_t, sum_i x_t^i)``;
* warm-up (``Pull.SYNC``): ``x = g`` dense and the worker trains on ``W_{t+1}``;
* after warm-up (``Local.FROM_GLOBAL``): the worker trains on
  ``L_{t+1} = Opt_l(W_t, g_t^i)`` (its own full-precision gradient), which waits
  for nothing of step ``t``'s exchange; ``x`` is the compressor's message
  (``Push.COMPRESSED``) or, on a correction step (``Push.DENSE``), the plain
  gradient, sent uncompressed;
* ``momentum_path='worker'``: every worker keeps u (docs/algorithms/cpsgd.md,
  :mod:`~mxnet_cpsgd.stores.worker_momentum`) and u takes g's place in what is
  compressed or sent dense (and, by default, in the local step); Opt_g is the
  Trainer's optimizer without momentum and weight decay;
* on a correction step the error memory follows the 2-bit store's rule with
  ``correction_residual='carry'`` (not added, not reset; Tugraph/CD-SGD,
  src/kvstore/kvstore_dist.h lines 451-457), or with ``'fold'`` is sent with the
  gradient (``x = g + e``) and emptied.  Compressor state besides the memory
  (PowerSGD's warm-start Q, ACP-SGD's P/Q alternation) only moves on
  compressed steps.

Everything is queued on MXNet's engine: ``pushpull`` returns at once, the local
update is queued before the exchange that overwrites the gradient buffer and
before the update of ``W``, so the next forward/backward waits only for the
exchange of the step before.
"""
import pickle

import mxnet as mx
import numpy as np

from ... import worker_momentum
from ...local_optimizer import LocalOptimizer
from ...policies.base import Local, Payload, Pull, Push
from ...policies.cpsgd import CPSGD
from .. import horovod as _hvd_store
from .message import ALLREDUCE, Message
from .store import CompressedHorovod

_STATES_FORMAT = "mxnet-cpsgd-cp-allreduce-states-1"
#: steps whose collectives may be in flight together (Horovod names cycle through them)
_IN_FLIGHT = 4
#: knobs of the CP-SGD policy that belong to the 2-bit parameter-server store only
_PS_ONLY = ("type", "threshold", "correction_delay")


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


class _Slot:
    """Per key: ``glob`` (W), ``send`` (own gradient, then the exchange's result),
    ``weights`` (the worker's L, the Trainer's parameter array)."""

    def __init__(self, weights):
        self.weights = weights
        self.glob = weights.copy()
        self.send = mx.nd.zeros(weights.shape, ctx=weights.context, dtype=weights.dtype)


class _Item:
    __slots__ = ("key", "slot", "outs", "plan", "priority", "step", "message", "local")

    def __init__(self, key, slot, outs, plan, priority, step, message, local):
        self.key, self.slot, self.outs, self.plan = key, slot, outs, plan
        self.priority, self.step, self.message = priority, step, message
        self.local = local  # what the local step reads: send (g, or u), or a copy of g


class CPAllreduce(CompressedHorovod):
    """``cpsgd_<compressor>``: CP-SGD's local update and k-step correction around a
    compressor on Horovod (see the module docstring).  Subclasses set
    :attr:`compressor_class`; the step schedule is :attr:`policy_class`'s.

    Args:
        config: an :class:`~mxnet_cpsgd.stores.config.AlgorithmConfig` for this store,
            a dict of knobs, or None (knobs also from ``MXNET_CPSGD_*`` and the
            Trainer's ``compression_params``).
    """

    step_policy_class = CPSGD

    @classmethod
    def store_name(cls):
        return "cpsgd_" + cls.compressor_class.name

    @classmethod
    def knob_defaults(cls):
        knobs = {k: v for k, v in cls.step_policy_class.defaults.items() if k not in _PS_ONLY}
        # the policy's warm-up replaces the compressor's own
        knobs.update((k, v) for k, v in cls.compressor_class.defaults.items()
                     if k != "warmup_steps")
        knobs["correction_residual"] = "carry"
        knobs["exchange"] = cls.compressor_class.default_exchange
        return knobs

    def __init__(self, config=None):
        super().__init__(config)
        self._optimizer = None
        self._updater = None     # Opt_g on W (gluon.Trainer.load_states reads .optimizer)
        self._local = None       # Opt_l
        self._slots = {}
        self._compressed_steps = {}

    def _configure(self):
        super()._configure()
        self._policy = self.step_policy_class(self._config)
        self._worker_momentum = worker_momentum.for_config(self._config)

    @staticmethod
    def is_capable(capability):
        # the store runs the optimizer (on W, on every worker): update_on_kvstore
        return capability.lower() == mx.kv.KVStoreBase.OPTIMIZER

    def set_optimizer(self, optimizer):
        """Opt_g: the Trainer's optimizer on W; Opt_l: the policy's local optimizer."""
        self._optimizer = optimizer
        opt_g = optimizer
        if self._worker_momentum is not None:
            # Opt_g without momentum and weight decay: a copy (the pickle drops param_dict)
            opt_g = pickle.loads(pickle.dumps(optimizer))
            opt_g.param_dict = optimizer.param_dict
            self._worker_momentum.adopt(optimizer, self.num_workers, opt_g)
        self._updater = mx.optimizer.get_updater(opt_g)
        set_keys = getattr(self._policy, "set_keys", None)
        if set_keys is not None:  # a policy whose schedule depends on the parameters
            set_keys({i: int(np.prod(p.shape)) for i, p in optimizer.param_dict.items()})
        self._local = LocalOptimizer(optimizer, self.num_workers,
                                     **self._policy.local_settings(self.num_workers))

    def broadcast(self, key, value, out, priority=0):
        """Rank 0's value into ``out`` and into this worker's W."""
        if self._optimizer is None:
            raise RuntimeError("kvstore '%s' needs update_on_kvstore=True: it runs the "
                               "optimizer itself (do not pass update_on_kvstore=False or "
                               "set MXNET_UPDATE_ON_KVSTORE=0)" % self.type)
        keys = _as_list(key)
        if len(keys) != 1:
            for k, v, o in zip(keys, _as_list(value), _as_list(out)):
                self.broadcast(k, v, o, priority)
            return
        key = keys[0]
        super().broadcast(key, value, out, priority)
        target = _as_list(out)[0]
        slot = self._slots.get(key)
        if slot is None:
            self._slots[key] = _Slot(target)
            self._steps[key] = 0
            self._compressed_steps[key] = 0
        else:  # a second Trainer on this store: its arrays become L
            slot.weights = target
            target.copyto(slot.glob)

    # -------------------------------------------------------------- pushpull
    def pushpull(self, key, value, out=None, priority=0):
        """One CP-SGD iteration of ``key``; ``out`` receives the weights the next
        forward/backward uses.  Asynchronous: only queues engine operations."""
        if out is None:
            raise RuntimeError("kvstore '%s' needs update_on_kvstore=True: pushpull "
                               "without out= is not supported" % self.type)
        if _hvd_store.split_keys(self, key, value, out, priority):
            return
        key = _as_list(key)[0]
        slot = self._slots.get(key)
        if slot is None:
            raise RuntimeError("key %r was not initialised (broadcast) before pushpull"
                               % (key,))
        grads = _as_list(value)
        _hvd_store._check_dense(key, grads)
        if len(grads) > 1:
            mx.nd.add_n(*[g.as_in_context(slot.send.context) for g in grads], out=slot.send)
        else:
            grads[0].copyto(slot.send)
        plan = self._policy.plan(self._steps[key], key)
        self._check_plan(plan)
        local = slot.send
        if self._worker_momentum is not None:  # send u, not g (compressed or dense)
            local = self._worker_momentum.update(key, slot.send, slot.glob, self._steps[key],
                                                 slot.send)
        step, message = None, None
        if plan.push is Push.COMPRESSED:
            step = self._compressed_steps[key]
            self._compressed_steps[key] = step + 1
            message = self._compressor.compress(key, slot.send, step)
        self._steps[key] += 1
        item = _Item(key, slot, _as_list(out), plan, priority, step, message, local)
        if not self.group_per_step:
            self._carry_out([item], key)
            return
        self._pending.append(item)
        if len(self._pending) >= len(self._keys):
            self.end_of_step()

    def _check_plan(self, plan):
        if (plan.local not in (Local.NONE, Local.FROM_GLOBAL)
                or plan.push not in (Push.DENSE, Push.COMPRESSED)
                or plan.pull not in (Pull.SYNC, Pull.BACKGROUND)
                or plan.payload is not Payload.GRADIENT):
            raise NotImplementedError("kvstore '%s' cannot carry out %s on all-reduce"
                                      % (self.type, plan))

    def end_of_step(self):
        if self._pending:
            pending, self._pending = self._pending, []
            self._carry_out(pending, "step")

    def _carry_out(self, items, slot):
        """Local updates, then the exchange, then W, in this order on the engine."""
        local = [it for it in items if it.plan.local is Local.FROM_GLOBAL]
        if local:
            for it in local:
                it.slot.glob.copyto(it.slot.weights)
            self._local.step([it.key for it in local], [it.slot.weights for it in local],
                             [it.local for it in local],
                             max(self._steps[it.key] - 1 for it in local))
        for it in items:
            if it.message is None:
                if self._config.correction_residual == "fold":
                    e = self._compressor.memory.pop(it.key)
                    if e is not None:
                        it.slot.send += e.reshape(it.slot.send.shape)
                it.message = Message([it.slot.send], ALLREDUCE, "dense",
                                     {"cp_dense": True})
        self._exchange(items, slot, self._steps[items[0].key] % _IN_FLIGHT)
        if self._worker_momentum is not None:
            self._worker_momentum.follow(self._updater.optimizer)
        self._updater([it.key for it in items], [it.slot.send for it in items],
                      [it.slot.glob for it in items])
        for it in items:
            if it.plan.pull is Pull.SYNC:
                it.slot.glob.copyto(it.slot.weights)
            for o in it.outs:
                if o is not it.slot.weights:
                    it.slot.weights.copyto(o)

    def _exchange(self, items, slot, parity):
        """All rounds of ``items``' messages; each key's sum ends in its ``send``.

        ``slot``: the key, or ``'step'`` for a step's group; ``parity``: the step's
        count modulo :data:`_IN_FLIGHT` (earlier steps' collectives may still be in
        flight when this step's are queued, so their Horovod names differ).
        """
        sent, rounds = [], 0
        while items:
            self._collectives.exchange_group([it.message for it in items],
                                             "cp%d.%s.r%d" % (parity, slot, rounds))
            rounds += 1
            following = []
            for it in items:
                # the slot's own buffer stays alive anyway; waiting on it later would
                # wait for the writes of the step then being issued (its gradient copy)
                sent.append([a for a in it.message.tensors + it.message.outputs
                             if a is not it.slot.send])
                if it.message.state.get("cp_dense"):
                    continue  # summed in place in send
                result = self._compressor.decompress(it.key, it.message, it.step)
                if isinstance(result, Message):
                    it.message = result
                    following.append(it)
                elif result is not it.slot.send:
                    result.reshape(it.slot.send.shape).copyto(it.slot.send)
            items = following
        # Horovod holds raw pointers to these arrays: keep them until the collectives
        # of _IN_FLIGHT steps later are queued.  By then they are complete, so the
        # wait returns at once: the loss of step t - 1 (which a training loop reads
        # before it calls step t) needed W_{t-2}, i.e. the exchange of step t - 3.
        for arrays in self._in_flight.get((slot, parity)) or ():
            for a in arrays:
                a.wait_to_read()
        self._in_flight[(slot, parity)] = sent

    # ----------------------------------------------------------- save / load
    def save_optimizer_states(self, fname, dump_optimizer=False):
        """This worker's resumable state: counters, W, L, Opt_g's and Opt_l's state,
        the compressor's error memory and factors."""
        if self._optimizer is None:
            raise RuntimeError("nothing to save before the first trainer.step()")
        self.end_of_step()
        mx.nd.waitall()
        blob = {
            "format": _STATES_FORMAT, "algorithm": self.type,
            "steps": dict(self._steps), "compressed_steps": dict(self._compressed_steps),
            "global": {k: s.glob.asnumpy() for k, s in self._slots.items()},
            "weights": {k: s.weights.asnumpy() for k, s in self._slots.items()},
            "global_optimizer": self._updater.get_states(dump_optimizer=False),
            "local": self._local.get_states(),
            "compressor": self._compressor.get_states(),
            "worker_momentum": worker_momentum.save(self._worker_momentum),
            "optimizer": self._optimizer if dump_optimizer else None,
        }
        with open(fname, "wb") as f:
            pickle.dump(blob, f)

    def load_optimizer_states(self, fname):
        """Restore a file written by :meth:`save_optimizer_states` (every worker its own)."""
        if self._optimizer is None:
            raise RuntimeError("load_states needs the store initialised")
        with open(fname, "rb") as f:
            blob = pickle.load(f)
        if not isinstance(blob, dict) or blob.get("format") != _STATES_FORMAT:
            raise ValueError("%s is not a states file of a cpsgd_<compressor> store" % fname)
        if blob["algorithm"] != self.type:
            raise ValueError("%s holds the state of kvstore '%s', not '%s'"
                             % (fname, blob["algorithm"], self.type))
        for k, slot in self._slots.items():
            saved = blob["weights"].get(k)
            if saved is None or saved.shape != tuple(slot.glob.shape):
                raise ValueError("%s does not match this model: parameter %r" % (fname, k))
        self.end_of_step()
        mx.nd.waitall()
        worker_momentum.load(self._worker_momentum, blob, fname)
        if blob["optimizer"] is not None:
            loaded = blob["optimizer"]
            loaded.param_dict = self._optimizer.param_dict
            self.set_optimizer(loaded)
        self._updater.set_states(blob["global_optimizer"])
        self._local.set_states(blob["local"])
        self._steps.update(blob["steps"])
        self._compressed_steps.update(blob["compressed_steps"])
        ctx = next(iter(self._slots.values())).glob.context if self._slots else mx.cpu()
        self._compressor.set_states(blob["compressor"], ctx)
        for k, slot in self._slots.items():
            slot.glob[:] = blob["global"][k]
            # a whole-array copy: MXNet cannot write numpy into MKL-DNN-layout arrays
            mx.nd.array(blob["weights"][k], dtype=slot.weights.dtype).copyto(slot.weights)
        mx.nd.waitall()


def cp_store_class(compressor):
    """The registered ``cpsgd_<name>`` store class of ``compressor``."""
    return type("CPSGD_" + compressor.__name__, (CPAllreduce,), {
        "compressor_class": compressor,
        "__doc__": "kvstore 'cpsgd_%s': CP-SGD around %s on Horovod.\n\n%s" % (
            compressor.name, compressor.__name__, CPAllreduce.__doc__),
        "__module__": __name__,
    })
