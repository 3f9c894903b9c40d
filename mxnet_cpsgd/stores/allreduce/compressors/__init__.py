"""Compressing all-reduce stores over Horovod: ``signsgd``, ``topk``, ``powersgd``, ``acpsgd``.

One small class per concern (GRACE-style): :class:`~.base.Compressor` (the
contract), :class:`~.memory.ErrorFeedback`, :class:`~.message.Message`,
:class:`~.collectives.Collectives` (asynchronous Horovod collectives), one
compressor per algorithm, and :class:`~.store.CompressedHorovod`, the
``horovod`` store that runs a compressor.  Importing this package registers the
four stores with MXNet; Horovod itself is imported when a store is created.
"""
import mxnet as mx

from .acpsgd import ACPSGD
from .powersgd import PowerSGD
from .signsgd import SignSGD
from .store import CompressedHorovod, store_class
from .topk import TopK

COMPRESSORS = {c.name: c for c in (SignSGD, TopK, PowerSGD, ACPSGD)}

#: name -> registered store class
STORES = {}
for _name, _compressor in COMPRESSORS.items():
    STORES[_name] = store_class(_compressor)
    if mx.kv.KVStoreBase.kv_registry.get(_name) is not STORES[_name]:
        mx.kv.KVStoreBase.kv_registry[_name] = STORES[_name]
del _name, _compressor

__all__ = ["COMPRESSORS", "STORES", "CompressedHorovod", "SignSGD", "TopK", "PowerSGD",
           "ACPSGD"]
