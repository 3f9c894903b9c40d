"""The stores gluon.Trainer talks to, and what they are built from.

* :mod:`.config`: ``AlgorithmConfig``, knobs and their sources;
* :mod:`.policies`: one file per algorithm, what a worker does each step;
* :mod:`.parameter_server`: ``PolicyStore``, the parameter-server store that
  carries a policy out with MXNet's ps-lite KVStore;
* :mod:`.key_layout`, :mod:`.local_optimizer`, :mod:`.server_optimizer`: its parts;
  :mod:`.classic_api` (``init``/``push``/``pull``, str keys: the Module API) and
  :mod:`.state_files` (``save/load_optimizer_states``) are its mixins;
* :mod:`.registry`: generates one ``PolicyStore`` subclass per policy and
  registers it with MXNet by name;
* :mod:`.allreduce`: the all-reduce stores (Horovod).

Nothing is imported here: a parameter server imports
``mxnet_cpsgd.stores.server_optimizer`` to unpickle the server optimizer and
needs none of the rest.
"""
