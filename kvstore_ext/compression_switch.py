"""Per-push dense/compressed switch for MXNet 1.9.1's 2-bit gradient compression.

MXNet decides, synchronously in the thread that calls ``push``, whether a dense
push of a distributed store is quantized: ``KVStoreDist::Push_`` reads
``gradient_compression_->get_type()``.  There is no public way to send one push
uncompressed, so this module flips that ``type_`` field to "none" for the duration
of one ``push`` call and back to "2bit" afterwards.  The per-key residual lives in a
separate buffer and is not touched.

The field is reached through the KVStore handle with fixed offsets that were read
off the frozen 1.9.1 x86-64 binaries; ``builds.ADMITTED`` lists the wheels whose
functions that use them have the same instructions (scripts/check_gpu_wheel.sh
compares them by disassembly).  Before it ever writes, the switch checks the MXNet
version, the installed wheel, the platform, and that the fields hold exactly the values MXNet must have put there
(type "none" before compression is enabled, then "2bit" with the configured
threshold).  On any mismatch it raises :class:`UnsupportedBuildError` and writes
nothing.
"""
import ctypes
import importlib.metadata
import os
import platform
import struct
from contextlib import contextmanager

import mxnet as mx

from .builds import ADMITTED, CPU_WHEEL, CUDA_WHEELS

SUPPORTED_VERSION = "1.9.1"
# byte offset of the raw GradientCompression* inside mxnet::KVStore
_COMPRESSION_PTR_OFFSET = 80
# byte offsets inside mxnet::kvstore::GradientCompression
_TYPE_OFFSET = 8
_THRESHOLD_OFFSET = 12
_TYPE_NONE = 0
_TYPE_TWO_BIT = 1
# scripts/check_gpu_wheel.sh names the wheel it is checking here, so that the switch's
# tests run on it before it is admitted
CHECK_ENV = "CPSGD_CHECK_WHEEL"


class UnsupportedBuildError(RuntimeError):
    """The running MXNet binary is not one whose layout this module knows."""


def installed_wheels():
    """Names of the MXNet 1.9.1 wheels installed (normally exactly one)."""
    found = []
    for name in (CPU_WHEEL,) + CUDA_WHEELS + ("mxnet-cu110", "mxnet-cu111"):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_build():
    """Raise UnsupportedBuildError unless this is MXNet 1.9.1 on 64-bit x86 Linux."""
    problems = []
    if mx.__version__ != SUPPORTED_VERSION:
        problems.append("MXNet %s (need %s)" % (mx.__version__, SUPPORTED_VERSION))
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        problems.append("processor %s (need x86_64)" % machine)
    if struct.calcsize("P") != 8:
        problems.append("a %d-bit Python (need 64-bit)" % (8 * struct.calcsize("P")))
    wheels = installed_wheels()
    if len(wheels) > 1:
        problems.append("several MXNet wheels installed over each other (%s: they "
                        "share the package mxnet/; keep one)" % ", ".join(wheels))
    elif wheels and wheels[0] not in ADMITTED + (os.environ.get(CHECK_ENV),):
        problems.append("the wheel %s" % wheels[0])
    elif not wheels:
        problems.append("an MXNet that no wheel installed (%s)"
                        % getattr(mx, "__file__", "?"))
    if not mx.runtime.Features().is_enabled("DIST_KVSTORE"):
        problems.append("an MXNet build without DIST_KVSTORE")
    if problems:
        raise UnsupportedBuildError(
            "the per-push compression switch only supports the %s %s wheels on "
            "x86-64 Linux; found %s. " % (" / ".join(ADMITTED), SUPPORTED_VERSION,
                                          ", ".join(problems)) +
            "Use kvstore='bitsgd' (always compressed) or 'odsgd' (never compressed) "
            "instead.")


def _field_addresses(kvstore):
    handle = kvstore.handle.value
    if not handle:
        raise UnsupportedBuildError("the KVStore has no native handle")
    compression = ctypes.c_void_p.from_address(handle + _COMPRESSION_PTR_OFFSET).value
    if not compression or compression % 8:
        raise UnsupportedBuildError(
            "the KVStore's gradient-compression pointer is not where MXNet 1.9.1 "
            "keeps it (read %r)" % compression)
    return compression + _TYPE_OFFSET, compression + _THRESHOLD_OFFSET


def read_compression_fields(kvstore):
    """Return (type, threshold) as stored in the KVStore's GradientCompression."""
    check_build()
    type_addr, threshold_addr = _field_addresses(kvstore)
    return (ctypes.c_int.from_address(type_addr).value,
            ctypes.c_float.from_address(threshold_addr).value)


class CompressionSwitch:
    """Sends chosen pushes of a 2-bit compressed dist kvstore uncompressed.

    Create it with the raw ``mx.kv.KVStore`` *before* calling
    ``set_gradient_compression`` on it, then call :meth:`enable` with the
    compression parameters; both steps verify the binary layout.

    Args:
        kvstore: an ``mx.kv.KVStore`` of type ``dist_sync`` or ``dist_async``.
    """

    def __init__(self, kvstore):
        check_build()
        kind, _ = read_compression_fields(kvstore)
        if kind != _TYPE_NONE:
            raise UnsupportedBuildError(
                "expected no compression on a fresh KVStore, read type %d" % kind)
        self._kvstore = kvstore
        self._type_field = None

    def enable(self, threshold):
        """Turn on MXNet's 2-bit compression and check that the switch can reach it."""
        self._kvstore.set_gradient_compression({"type": "2bit", "threshold": threshold})
        kind, stored = read_compression_fields(self._kvstore)
        expected = ctypes.c_float(threshold).value
        if kind != _TYPE_TWO_BIT or stored != expected:
            raise UnsupportedBuildError(
                "after enabling 2-bit compression (threshold %r) the KVStore holds "
                "type %d, threshold %r: this binary's layout is not the one the "
                "switch was written for" % (threshold, kind, stored))
        self._type_field = ctypes.c_int.from_address(_field_addresses(self._kvstore)[0])

    @contextmanager
    def dense(self):
        """Within this block, pushes issued from this thread are sent uncompressed."""
        if self._type_field is None:
            raise RuntimeError("CompressionSwitch.enable() was not called")
        self._type_field.value = _TYPE_NONE
        try:
            yield
        finally:
            self._type_field.value = _TYPE_TWO_BIT


def self_check():
    """Print the running build and whether the switch supports it; return 0 if so."""
    features = mx.runtime.Features()
    print("MXNet %s from %s (wheel: %s)" % (mx.__version__, os.path.dirname(mx.__file__),
                                          ", ".join(installed_wheels()) or "none"))
    print("features: " + ", ".join("%s=%s" % (f, "on" if features.is_enabled(f) else "off")
                                   for f in ("DIST_KVSTORE", "CUDA", "CUDNN", "NCCL")))
    print("GPUs visible: %d" % mx.context.num_gpus())
    try:
        check_build()
    except UnsupportedBuildError as err:
        print("compression switch: unsupported: %s" % err)
        return 1
    print("compression switch: supported build")
    return 0
