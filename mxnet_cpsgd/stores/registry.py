"""The registered stores: one PolicyStore subclass per algorithm policy.

Each class is registered with MXNet under its policy's name, so
``mx.kv.create('cpsgd')`` and ``gluon.Trainer(..., kvstore='cpsgd')`` find it.
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


STORES = {}
for _name, _policy in POLICIES.items():
    STORES[_name] = _store_class(_policy)
    globals()[_policy.__name__] = STORES[_name]
    if mx.kv.KVStoreBase.kv_registry.get(_name) is not STORES[_name]:
        mx.kv.KVStoreBase.kv_registry[_name] = STORES[_name]
del _name, _policy
