"""Make ``gluon.Trainer(..., kvstore='<name>')`` and ``Module.fit(kvstore='<name>')``
use this project's stores.

MXNet 1.9.1's ``gluon.Trainer`` and Module API build their store through
``mxnet.model._create_kvstore``, which silently returns *no store at all* when a
worker has one device and the name lacks the substring ``"dist"``.  A user who
asks for ``kvstore='cpsgd'`` on a one-GPU (or CPU) worker would then train
alone without a word.  This module wraps the function that ``gluon.trainer``,
``module.module`` and ``model`` (``FeedForward``) hold so that names in
``names`` always create the registered store, and a
name that is neither registered nor one of MXNet's own store types raises
instead of silently training without a store (MXNet's native code takes any
unknown name for a local store); every other name goes to MXNet's original code
unchanged.
"""
import os

import mxnet as mx
from mxnet import model as _model
from mxnet.gluon import trainer as _trainer
from mxnet.module import module as _module

_MARKER = "_mxnet_cpsgd_names"


#: MXNet 1.9.1's native store types (src/kvstore/kvstore.cc picks the kind from
#: these words; ``mx.kv.create`` documents the combinations)
NATIVE_TYPES = ("local", "device", "nccl", "dist_sync", "dist_async", "dist_sync_device",
                "dist_async_device", "dist_device_sync", "dist_device_async", "dist")
_NATIVE_PREFIXES = ("local", "device", "nccl", "dist")


def known_names():
    """Names ``kvstore=`` accepts: MXNet's registry and its native types."""
    return sorted(set(mx.kv.KVStoreBase.kv_registry) | set(NATIVE_TYPES))


def check_name(name):
    """Raise ValueError if ``name`` is neither registered nor a native type.

    Native names are matched by their first word (``local_allreduce_cpu`` and
    the like are native); MXNet itself would take any other string for a local
    store, which trains each one-device worker alone.
    """
    lowered = name.lower()
    if lowered in mx.kv.KVStoreBase.kv_registry:
        return
    if lowered.split("_")[0] in _NATIVE_PREFIXES:
        return
    raise ValueError("unknown kvstore %r; known: %s" % (name, ", ".join(known_names())))


def install(names):
    """Route ``kvstore=<name>`` strings for ``names`` to ``mx.kv.create``.

    Idempotent; further calls add names.

    Args:
        names: iterable of registered store names (lower case).
    """
    for module in (_trainer, _module, _model):
        _wrap(module, names)


def _wrap(module, names):
    current = module._create_kvstore
    routed = getattr(current, _MARKER, None)
    if routed is not None:
        routed.update(n.lower() for n in names)
        return
    original = current
    routed = set(n.lower() for n in names)

    def _create_kvstore(kvstore, num_device, arg_params):
        if isinstance(kvstore, str):
            if kvstore.lower() in routed:
                kv = mx.kv.create(kvstore.lower())
                update_on_kvstore = bool(int(os.getenv("MXNET_UPDATE_ON_KVSTORE", "1")))
                return kv, update_on_kvstore and kv.is_capable(mx.kv.KVStoreBase.OPTIMIZER)
            check_name(kvstore)
        return original(kvstore, num_device, arg_params)

    setattr(_create_kvstore, _MARKER, routed)
    _create_kvstore.__wrapped__ = original
    module._create_kvstore = _create_kvstore
