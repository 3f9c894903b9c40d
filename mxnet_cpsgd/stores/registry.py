"""The registered stores: one PolicyStore subclass per algorithm policy.

Each class is registered with MXNet under its policy's name, so
``mx.kv.create('cpsgd')`` and ``gluon.Trainer(..., kvstore='cpsgd')`` find it,
and under the names of :func:`dist_names` (``dist_cpsgd``, ``dist_sync_cpsgd``):
MXNet's example scripts (example/image-classification's fit.py) look for "dist"
and "async" in the name to give each worker its share of an epoch, as they do
for ``dist_sync``.
"""
import mxnet as mx

from .policies import POLICIES
from .parameter_server import PolicyStore


def _store_class(policy):
    # MXNet registers a store under its class name in lower case
    cls = type(policy.__name__, (PolicyStore,), {
        "policy_class": policy,
        "__doc__": "KVStore running %s (see mxnet_cpsgd.stores.policies.%s).\n\n%s"
                   % (policy.name, policy.name, PolicyStore.__doc__),
        "__module__": __name__,
    })
    assert cls.__name__.lower() == policy.name
    return cls


def dist_names(policy):
    """The names, beside its own, that MXNet's scripts read as the store's mode:
    its ``type`` (``dist_sync_cpsgd``, ``dist_async_asgd``), and ``dist_<name>``
    for a synchronous store (MXNet's ``dist`` is ``dist_sync``)."""
    names = ["%s_%s" % (policy.inner_kvstore, policy.name)]
    if policy.inner_kvstore == "dist_sync":
        names.insert(0, "dist_" + policy.name)
    return names


STORES = {}
#: dist name -> the store's own name (see :func:`dist_names`)
DIST_NAMES = {}
for _name, _policy in POLICIES.items():
    STORES[_name] = _store_class(_policy)
    globals()[_policy.__name__] = STORES[_name]
    for _alias in [_name] + dist_names(_policy):
        if _alias != _name:
            DIST_NAMES[_alias] = _name
        if mx.kv.KVStoreBase.kv_registry.get(_alias) is not STORES[_name]:
            mx.kv.KVStoreBase.kv_registry[_alias] = STORES[_name]
del _name, _policy, _alias
