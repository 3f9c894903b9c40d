"""cpsgd-bench --worker-setup file: the parameter-server stores with balanced
but uncut keys (whole parameters to the least loaded server, largest first; no
parameter below MXNet's big-array bound is cut across servers), the layout
before the stores learnt to cut large parameters; for A/B measurements."""
import functools

from mxnet_cpsgd.stores import key_layout

key_layout.balanced_keys = functools.partial(key_layout.balanced_keys, split=False)
