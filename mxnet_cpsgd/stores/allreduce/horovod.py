"""Horovod: a well-optimised all-reduce S-SGD as an MXNet KVStore ('horovod').

The baseline that the compression papers are measured against: every worker
all-reduces (sums) its gradients with Horovod over Gloo, tensor fusion on, and
runs the optimizer itself.  Select it like the other stores::

    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': 0.1, 'momentum': 0.9},
                            kvstore='horovod')
    ...
    trainer.step(batch_size)          # B, the per-worker batch, as with ssgd

and start the script with ``horovodrun -np 2 -H localhost:2 --gloo python train.py``.

Semantics (those of MXNet's upstream Horovod KVStore, which MXNet 1.9.1 does
not ship):

* ``is_capable('optimizer')`` is False, so ``gluon.Trainer`` sets
  ``update_on_kvstore=False`` and runs the optimizer locally on every worker;
* ``broadcast`` copies rank 0's initial weights to every worker
  (``hvd.broadcast_``);
* ``pushpull(key, grads)`` sums the gradients of all workers in place
  (``hvd.allreduce_`` with ``op=hvd.Sum``).  Each key is one named,
  asynchronous Horovod operation, so Horovod's tensor fusion batches the
  gradients of one step and the all-reduce overlaps the rest of the backward
  pass.  The optimizer then sees ``sum_i g_i`` with ``rescale_grad = 1/B``:
  exactly the update that ``ssgd`` (MXNet ``dist_sync``) applies on its
  servers.

Horovod is optional: this module imports ``horovod.mxnet`` only when a store
is created (or :func:`distributed_trainer` is called) and then says how to
install it if it is missing.
"""
import os

import mxnet as mx

from .. import config as config_mod

NAME = "horovod"

INSTALL_HINT = (
    "HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 "
    "HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 "
    "pip install --no-build-isolation 'horovod==0.28.1'")
PREREQ_HINT = ("(needs mxnet, numpy, wheel and cmake already installed in the same "
               "environment, and a C++ compiler; builds horovod==0.28.1 from source in "
               "a few minutes)")
LAUNCH_HINT = "horovodrun -np 2 -H localhost:2 --gloo python your_script.py ..."


def _import_horovod():
    """``horovod.mxnet``, or an ImportError that says how to install and launch it."""
    try:
        import horovod.mxnet as hvd
    except ImportError as err:
        raise ImportError(
            "kvstore '%s' needs Horovod built with MXNet support, which is not "
            "importable here (%s: %s). Install it with:\n    %s\n%s\n"
            "and start the training script with:\n    %s"
            % (NAME, type(err).__name__, err, INSTALL_HINT, PREREQ_HINT, LAUNCH_HINT)
        ) from err
    return hvd


#: seconds a worker waits for the Gloo rendezvous service to accept connections:
#: Horovod's own Gloo timeout variable when set, else this default
RENDEZVOUS_WAIT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
DEFAULT_RENDEZVOUS_WAIT = 120.0


def init_horovod(hvd):
    """``hvd.init()``, once the job's Gloo rendezvous service accepts connections.

    Horovod 0.28.1's Gloo client gives up (and aborts the process with SIGABRT)
    after a few seconds of refused HTTP requests, so a worker that starts before
    a slow rendezvous service (a loaded machine, a cold import of Horovod) would
    die.  Waiting here for the address in ``HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT``
    (set by horovodrun and by cpsgd-launch) bounds that wait by
    ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (Horovod's Gloo timeout; 120 s when unset)
    and says what failed.
    Without those variables (MPI, a single process) it just calls ``hvd.init()``.
    """
    import socket
    import time
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if addr and port:
        wait = float(os.environ.get(RENDEZVOUS_WAIT_ENV, DEFAULT_RENDEZVOUS_WAIT))
        deadline = time.monotonic() + wait
        while True:
            try:
                socket.create_connection((addr, int(port)), timeout=5).close()
                break
            except OSError as err:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        "kvstore '%s': the Horovod rendezvous service at %s:%s did not "
                        "accept a connection within %g s (%s); is the job's launcher "
                        "(horovodrun, cpsgd-launch) running? %s sets the wait"
                        % (NAME, addr, port, wait, err, RENDEZVOUS_WAIT_ENV)) from None
                time.sleep(0.2)
    hvd.init()


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _check_dense(key, arrays):
    for a in arrays:
        if a.stype != "default":
            raise ValueError("kvstore '%s' supports dense parameters and gradients only; "
                             "key %s is %s" % (NAME, key, a.stype))


def sum_devices(key, value, out):
    """This worker's gradient of ``key``, summed over its devices, in one array.

    Returns ``(buf, outs)``: ``buf`` is ``out[0]`` (or ``value[0]`` when ``out`` is
    None) holding the sum; ``outs`` are all the arrays the result goes to.
    """
    grads = _as_list(value)
    outs = _as_list(out) if out is not None else grads
    _check_dense(key, grads + outs)
    buf = outs[0]
    if len(grads) > 1:
        mx.nd.add_n(*[g.as_in_context(buf.context) for g in grads], out=buf)
    elif grads[0] is not buf:
        grads[0].copyto(buf)
    return buf, outs


def split_keys(store, key, value, out, priority):
    """Run ``store.pushpull`` once per key when given lists; True if it did."""
    keys = _as_list(key)
    if len(keys) == 1:
        return False
    outs = _as_list(out) if out is not None else [None] * len(keys)
    for k, v, o in zip(keys, _as_list(value), outs):
        store.pushpull(k, v, o, priority)
    return True


_instances = [0]


class Horovod(mx.kv.KVStoreBase):
    """All-reduce S-SGD over Horovod (see the module docstring).

    Horovod matches operations across workers by name; every store names its
    operations ``mxnet_cpsgd.<n>.<op>.<key>``, ``n`` counting the stores this
    process created, so several stores (Trainers) can coexist as long as every
    worker creates them in the same order.

    Args:
        config: optional :class:`~mxnet_cpsgd.stores.config.AlgorithmConfig` for
            ``'horovod'`` (it has no knobs) or an empty dict; accepted so that
            the store is built like the other stores.
    """

    def __init__(self, config=None):
        config = config_mod.store_knobs(NAME, config)
        # no knobs: any setting (argument or MXNET_CPSGD_* variable) is an error
        self._config = config_mod.resolve(NAME, {}, config, os.environ)
        hvd = _import_horovod()
        init_horovod(hvd)
        self._hvd = hvd
        self._prefix = "mxnet_cpsgd.%d" % _instances[0]
        _instances[0] += 1

    @property
    def config(self):
        """The resolved :class:`~mxnet_cpsgd.stores.config.AlgorithmConfig` (no knobs)."""
        return self._config

    def set_gradient_compression(self, compression_params):
        """Reject every setting: the store has no knobs and compresses nothing."""
        self._config = config_mod.resolve(
            NAME, {}, config_mod.check_compression_params(compression_params), os.environ)

    # -------------------------------------------------------------- identity
    @property
    def type(self):
        return NAME

    @property
    def rank(self):
        return self._hvd.rank()

    @property
    def local_rank(self):
        """Rank of this worker on its host."""
        return self._hvd.local_rank()

    @property
    def num_workers(self):
        return self._hvd.size()

    @staticmethod
    def is_capable(capability):
        if capability.lower() == mx.kv.KVStoreBase.OPTIMIZER:
            return False
        raise ValueError("Unknown capability: {}".format(capability))

    # ------------------------------------------------------------ collectives
    def broadcast(self, key, value, out, priority=0):
        """Write rank 0's ``value`` into ``out`` on every worker."""
        keys = _as_list(key)
        if len(keys) != 1:
            for k, v, o in zip(keys, _as_list(value), _as_list(out)):
                self.broadcast(k, v, o, priority)
            return
        key = keys[0]
        value = _as_list(value)[0]
        outs = _as_list(out)
        _check_dense(key, [value] + outs)
        target = outs[0]
        if target is not value:
            value.copyto(target)
        self._hvd.broadcast_(target, root_rank=0, name="%s.bcast.%s" % (self._prefix, key),
                             priority=priority)
        for o in outs[1:]:
            target.copyto(o)

    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` over all workers (and devices) into ``out`` (default: ``value``).

        Asynchronous: the all-reduce is queued on MXNet's engine as a named
        Horovod operation and the call returns at once.
        """
        if split_keys(self, key, value, out, priority):
            return
        key = _as_list(key)[0]
        # sum this worker's devices first: one Horovod tensor per key
        buf, outs = sum_devices(key, value, out)
        self._hvd.allreduce_(buf, op=self._hvd.Sum, name="%s.grad.%s" % (self._prefix, key),
                             priority=priority)
        for o in outs[1:]:
            buf.copyto(o)

    # ------------------------------------------------------------- optimizer
    def set_optimizer(self, optimizer):
        raise RuntimeError("kvstore '%s' runs the optimizer on the workers; gluon.Trainer "
                           "needs update_on_kvstore=False (its default for this store)" % NAME)

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise RuntimeError("kvstore '%s' keeps no optimizer state; gluon.Trainer.save_states "
                           "saves the workers' local optimizer state itself" % NAME)

    def load_optimizer_states(self, fname):
        raise RuntimeError("kvstore '%s' keeps no optimizer state; gluon.Trainer.load_states "
                           "loads the workers' local optimizer state itself" % NAME)


if mx.kv.KVStoreBase.kv_registry.get(NAME) is not Horovod:
    mx.kv.KVStoreBase.kv_registry[NAME] = Horovod


def distributed_trainer(params, optimizer, optimizer_params=None, **kwargs):
    """``horovod.mxnet.DistributedTrainer`` with ``ssgd``'s gradient scaling.

    Horovod 0.28.1's DistributedTrainer averages over the ``M`` workers, so
    ``trainer.step(B)`` applies ``sum_i g_i / (M*B)``; ``ssgd`` (MXNet
    ``dist_sync``) and ``kvstore='horovod'`` apply ``sum_i g_i / B``.  This
    helper undoes the ``1/M`` so that the three agree for the same
    ``trainer.step(B)``.  DistributedTrainer averages in one of two places,
    and the helper corrects whichever it uses:

    * CPU, ROCm and NCCL < 2.10 builds (``_average_in_framework``): the
      Trainer's gradient scale ``_scale`` is multiplied by ``1/M`` and the
      all-reduce sums; the helper multiplies ``_scale`` by ``M``;
    * otherwise the all-reduce is Horovod's Average; the helper multiplies
      its ``postscale_factor`` by ``M``, which makes it a sum.

    Unlike ``kvstore='horovod'``, DistributedTrainer does not broadcast the
    initial weights: call ``hvd.broadcast_parameters(params, root_rank=0)``
    (after the parameters are initialised) before training.

    Args:
        params, optimizer, optimizer_params: as for ``gluon.Trainer``.
        **kwargs: passed on to DistributedTrainer (``compression``,
            ``prefix``, ``num_groups``, ``process_set``, ...).
            ``gradient_predivide_factor`` only moves where the division
            happens and does not change the result.

    Returns:
        the ``hvd.DistributedTrainer``.
    """
    hvd = _import_horovod()
    init_horovod(hvd)
    trainer = hvd.DistributedTrainer(params, optimizer, optimizer_params, **kwargs)
    size = trainer._process_set.size()
    in_framework = getattr(trainer, "_average_in_framework", None)
    if in_framework is True:
        trainer._scale *= size
    elif in_framework is False and hasattr(trainer, "_postscale_factor"):
        trainer._postscale_factor *= size
    else:
        import horovod
        raise RuntimeError("distributed_trainer supports horovod 0.28.1's DistributedTrainer "
                           "(found horovod %s); use kvstore='horovod' instead"
                           % getattr(horovod, "__version__", "?"))
    return trainer


__all__ = ["Horovod", "distributed_trainer", "INSTALL_HINT", "LAUNCH_HINT"]
