"""mxnet-cpsgd: CP-SGD and its family as MXNet parameter-server KVStores.

``import mxnet_cpsgd`` registers the stores ``ssgd``, ``bitsgd``, ``asgd``,
``odsgd``, ``cpsgd``, ``ssdsgd`` and ``localsgd`` with MXNet, and the all-reduce
stores over Horovod ``horovod``, ``signsgd``, ``topk``, ``powersgd`` and
``acpsgd``, so that unchanged Gluon code selects one by name::

    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': 0.1, 'momentum': 0.9},
                            kvstore='cpsgd',
                            compression_params={'threshold': 0.5,
                                                'correction_period': 5,
                                                'warmup_steps': 1000})
"""
import os as _os

try:  # a GPU install: load NVIDIA's CUDA libraries before mxnet (cpsgd_cuda_libs.py)
    import cpsgd_cuda_libs as _cuda_libs
except ImportError:  # running from a source tree without the top-level module
    _cuda_libs = None
if _cuda_libs is not None and "mxnet" not in __import__("sys").modules:
    _cuda_libs.preload()

__version__ = "0.1.0"

# A parameter server imports this package only to unpickle the server optimizer,
# possibly while `import mxnet` is still running; it needs none of the rest.
if _os.environ.get("DMLC_ROLE") in ("server", "scheduler"):
    __all__ = []
else:
    from kvstore_ext import exit_on_error as _exit_on_error
    from kvstore_ext import trainer_hook as _trainer_hook

    # a worker that raises must leave the job at once, not wait in MXNet's
    # shutdown barrier for peers that wait for it (kvstore_ext/exit_on_error.py)
    if _exit_on_error.wanted():
        _exit_on_error.install()

    from .stores.config import AlgorithmConfig, ConfigError
    from .stores.policies import POLICIES
    from .stores.registry import DIST_NAMES as _DIST_NAMES, STORES
    from .stores.allreduce.horovod import Horovod as _Horovod  # imports horovod itself lazily
    from .stores.allreduce.compressors import STORES as _COMPRESSED_STORES  # likewise

    # every store this package registers with MXNet, by name
    _ALL_STORES = dict(STORES, horovod=_Horovod, **_COMPRESSED_STORES)
    ALGORITHMS = tuple(sorted(_ALL_STORES))

    # string names of these stores must reach mx.kv.create even with one device per worker
    _trainer_hook.install(list(_ALL_STORES) + list(_DIST_NAMES))


    def create(config, **knobs):
        """Create a store from an AlgorithmConfig or a name plus knobs.

        Args:
            config: an :class:`AlgorithmConfig`, or an algorithm name.
            **knobs: settings when ``config`` is a name.

        Returns:
            the store, to pass as ``gluon.Trainer(..., kvstore=store)``.
        """
        if isinstance(config, AlgorithmConfig):
            if knobs:
                raise TypeError("pass knobs inside the AlgorithmConfig, not both")
            name = config.algorithm
        else:
            name, config = config, knobs
        try:
            cls = _ALL_STORES[_DIST_NAMES.get(name.lower(), name.lower())]
        except KeyError:
            raise ConfigError("unknown algorithm %r; known: %s"
                              % (name, ", ".join(ALGORITHMS))) from None
        return cls(config)


    __all__ = ["AlgorithmConfig", "ConfigError", "ALGORITHMS", "POLICIES", "STORES",
               "create"]
