"""Lets MXNet's CUDA wheels find the CUDA libraries of NVIDIA's PyPI packages.

MXNet's CUDA 11 wheels (``mxnet-cu112`` ...) ship no CUDA libraries: their
libmxnet.so needs libcudart.so.11.0, libcudnn.so.8, ... from the system.  A GPU
install of mxnet-cpsgd (``CPSGD_MXNET=mxnet-cu112 pip install .``) gets them as
NVIDIA's ``nvidia-*-cu11`` packages, whose libraries lie in
``site-packages/nvidia/<name>/lib``, a folder the dynamic loader does not search.
Loading them by path before libmxnet.so is loaded satisfies its dependencies (the
loader matches already loaded libraries by soname), so nobody has to set
LD_LIBRARY_PATH.

The GPU install puts ``cpsgd_cuda_libs.pth`` into site-packages; it calls
:func:`install_hook` at interpreter start, which only registers an import hook
(cheap); the libraries are loaded when ``mxnet`` is first imported.  libcuda.so.1
belongs to the NVIDIA driver and is not preloaded from anywhere else: when it is
missing, one line on stderr says so.  This module imports nothing of MXNet or the
project (it runs inside ``site``).
"""
import ctypes
import importlib.metadata
import importlib.util
import os
import sys

# (package folder under nvidia/, soname), in dependency order
LIBRARIES = (
    ("cuda_runtime", "libcudart.so.11.0"),
    ("cuda_nvrtc", "libnvrtc.so.11.2"),
    ("nvtx", "libnvToolsExt.so.1"),
    ("cublas", "libcublasLt.so.11"),
    ("cublas", "libcublas.so.11"),
    ("cufft", "libcufft.so.10"),
    ("curand", "libcurand.so.10"),
    ("cusparse", "libcusparse.so.11"),
    ("cusolver", "libcusolver.so.11"),
    ("cudnn", "libcudnn.so.8"),
    ("nccl", "libnccl.so.2"),
)
DRIVER_LIBRARY = "libcuda.so.1"
MISSING_DRIVER = ("mxnet-cpsgd: %s, the NVIDIA driver's library, was not found: the "
                  "GPU wheel of MXNet cannot load without it. Install the NVIDIA driver "
                  "(or put the folder holding %s on LD_LIBRARY_PATH)."
                  % (DRIVER_LIBRARY, DRIVER_LIBRARY))

# MXNet 1.9.1's CUDA 11 wheels; with none of them installed nothing is loaded
CUDA_WHEELS = tuple("mxnet-cu%d" % v for v in range(110, 118))

_loaded = []


def cuda_wheel_installed():
    """Whether one of MXNet's CUDA 11 wheels is installed."""
    for name in CUDA_WHEELS:
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            pass
    return False


def library_files():
    """Paths of the NVIDIA packages' libraries that are installed, in load order."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec is not None else []
    files = []
    for folder, soname in LIBRARIES:
        for root in roots:
            path = os.path.join(root, folder, "lib", soname)
            if os.path.exists(path):
                files.append(path)
                break
    return files


def preload(stream=None):
    """Load the driver library and the NVIDIA packages' libraries, once.

    Args:
        stream: where the one-line message about a missing driver goes
            (default ``sys.stderr``).

    Returns:
        the paths loaded (empty without a CUDA wheel or NVIDIA's packages).
    """
    if _loaded:
        return list(_loaded)
    files = library_files() if cuda_wheel_installed() else []
    if not files:
        return []
    try:
        ctypes.CDLL(DRIVER_LIBRARY, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        print(MISSING_DRIVER, file=stream or sys.stderr, flush=True)
    for path in files:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        _loaded.append(path)
    return list(_loaded)


class _PreloadBeforeMXNet:
    """sys.meta_path entry that preloads the libraries when ``mxnet`` is imported."""

    def find_spec(self, name, path=None, target=None):
        if name == "mxnet":
            remove_hook()
            preload()
        return None  # the ordinary finders import the module


def install_hook():
    """Preload the libraries as soon as ``mxnet`` is imported (idempotent)."""
    if "mxnet" in sys.modules:
        return
    if not any(type(f).__name__ == _PreloadBeforeMXNet.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _PreloadBeforeMXNet())


def remove_hook():
    sys.meta_path[:] = [f for f in sys.meta_path
                        if type(f).__name__ != _PreloadBeforeMXNet.__name__]
