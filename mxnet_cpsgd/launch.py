"""Alias of :mod:`mxnet_cpsgd.cluster.launch`, so that the documented
``python -m mxnet_cpsgd.launch ...`` and ``from mxnet_cpsgd.launch import run_job``
keep working.  Importing it gives the very same module object."""
import sys

from mxnet_cpsgd.cluster import launch as _launch

if __name__ == "__main__":
    sys.exit(_launch.main())
else:
    sys.modules[__name__] = _launch
