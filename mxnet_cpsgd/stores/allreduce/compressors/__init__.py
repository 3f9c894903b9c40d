"""Compressing all-reduce stores over Horovod: ``signsgd``, ``topk``, ``powersgd``,
``acpsgd``, ``fp16``, and CP-SGD around each of them, ``cpsgd_<compressor>``.

One small class per concern (GRACE-style): :class:`~.base.Compressor` (the
contract), :class:`~.memory.ErrorFeedback`, :class:`~.message.Message`,
:class:`~.collectives.Collectives` (asynchronous Horovod collectives), one
compressor per algorithm, :class:`~.store.CompressedHorovod`, the ``horovod``
store that runs a compressor, and :class:`~.cp.CPAllreduce`, which runs the
CP-SGD policy's steps (local update, k-step correction) around a compressor.
Importing this package registers the stores with MXNet; Horovod itself is
imported when a store is created.  A new compressor is one file here plus its
entry in :data:`COMPRESSORS`: it gets its own store and its ``cpsgd_`` store.
"""
import mxnet as mx

from .acpsgd import ACPSGD
from .cp import CPAllreduce, cp_store_class
from .fp16 import FP16
from .powersgd import PowerSGD
from .signsgd import SignSGD
from .store import CompressedHorovod, store_class
from .topk import TopK

COMPRESSORS = {c.name: c for c in (SignSGD, TopK, PowerSGD, ACPSGD, FP16)}

#: name -> registered store class: each compressor alone, then CP-SGD around it
STORES = {}
for _compressor in COMPRESSORS.values():
    for _cls in (store_class(_compressor), cp_store_class(_compressor)):
        STORES[_cls.store_name()] = _cls
del _compressor, _cls
#: the CP-SGD stores, ``cpsgd_<compressor>`` -> class
CP_STORES = {n: c for n, c in STORES.items() if issubclass(c, CPAllreduce)}
for _name, _cls in STORES.items():
    if mx.kv.KVStoreBase.kv_registry.get(_name) is not _cls:
        mx.kv.KVStoreBase.kv_registry[_name] = _cls
del _name, _cls

__all__ = ["COMPRESSORS", "STORES", "CP_STORES", "CompressedHorovod", "CPAllreduce",
           "SignSGD", "TopK", "PowerSGD", "ACPSGD", "FP16"]
