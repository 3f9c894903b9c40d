"""``cpsgd-bench --worker-setup`` file: registers ``fp16_pk`` and ``cpsgd_fp16_pk``.

Each is the store of the same name without ``_pk`` with ``group_per_step = False``:
every key's exchange is queued as soon as the key is pushed (overlapping the rest of
the backward pass) instead of one grouped Horovod operation per step once the last
key is pushed.  Registering them under their own names lets one invocation time both
exchanges, so their ratio comes from the same occasion.  The stores' ``exchange``
knob (``exchange='per_key'``) does the same where it is available.
"""
import mxnet as mx

_registry = mx.kv.KVStoreBase.kv_registry
for _name in ("fp16", "cpsgd_fp16"):
    _base = _registry[_name]
    _registry[_name + "_pk"] = type(_base.__name__ + "PerKey", (_base,),
                                    {"group_per_step": False})
