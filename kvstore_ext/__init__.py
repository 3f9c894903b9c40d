"""The few pieces of mxnet-cpsgd that reach into MXNet 1.9.1's internals.

Each one checks the MXNet it runs against before it changes anything.
"""
from .compression_switch import (CompressionSwitch, UnsupportedBuildError,
                                 check_build, read_compression_fields)
from . import trainer_hook

__all__ = ["CompressionSwitch", "UnsupportedBuildError", "check_build",
           "read_compression_fields", "trainer_hook"]
