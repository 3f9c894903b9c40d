"""The MXNet 1.9.1 wheels mxnet-cpsgd installs with, and what each needs besides.

Plain data, no imports: setup.py reads this file (by path) before anything is
installed, and ``compression_switch`` names the admitted wheels in its errors.
"""
MXNET_VERSION = "1.9.1"
CPU_WHEEL = "mxnet"

# CUDA 11 user-space libraries every 1.9.1 CUDA 11 wheel links against (its
# libmxnet.so's DT_NEEDED), as NVIDIA's PyPI packages; libcuda.so.1 comes with the
# NVIDIA driver.  cuDNN 8: the wheels need libcudnn.so.8.
CUDA11_LIBRARIES = (
    "nvidia-cuda-runtime-cu11",   # libcudart.so.11.0
    "nvidia-cuda-nvrtc-cu11",     # libnvrtc.so.11.2
    "nvidia-cublas-cu11",         # libcublas.so.11
    "nvidia-cufft-cu11",          # libcufft.so.10
    "nvidia-curand-cu11",         # libcurand.so.10
    "nvidia-cusolver-cu11",       # libcusolver.so.11
    "nvidia-nvtx-cu11",           # libnvToolsExt.so.1
    "nvidia-nccl-cu11",           # libnccl.so.2
    "nvidia-cudnn-cu11<9",        # libcudnn.so.8
)
# libraries only some wheels link against: libcusparse.so.11
EXTRA_LIBRARIES = {"mxnet-cu%d" % v: ("nvidia-cusparse-cu11",) for v in range(113, 118)}

# CUDA wheels the project installs with (CPSGD_MXNET=<name> pip install ...): those
# whose libraries NVIDIA's cu11 packages provide.  Not mxnet-cu110 (needs
# libnvrtc.so.11.0 and libcusolver.so.10) nor mxnet-cu111 (libnvrtc.so.11.1): NVIDIA's
# PyPI packages carry neither.
CUDA_WHEELS = ("mxnet-cu112", "mxnet-cu113", "mxnet-cu114", "mxnet-cu115",
               "mxnet-cu116", "mxnet-cu117")

# 1.9.1 CUDA wheels that cannot be installed this way, and why (readelf -d libmxnet.so)
NOT_INSTALLABLE = {
    "mxnet-cu110": "its libmxnet.so needs libnvrtc.so.11.0 and libcusolver.so.10, which "
                   "NVIDIA's PyPI packages do not carry",
    "mxnet-cu111": "its libmxnet.so needs libnvrtc.so.11.1, which NVIDIA's PyPI packages "
                   "do not carry",
}

# Wheels whose libmxnet.so scripts/check_gpu_wheel.sh admitted: the compression
# switch's instructions are the CPU wheel's, and the switch's test and the main job
# pass on it.  The per-push switch of kvstore='cpsgd' refuses every other build.
ADMITTED = ("mxnet", "mxnet-cu112", "mxnet-cu113", "mxnet-cu114", "mxnet-cu115",
            "mxnet-cu116", "mxnet-cu117")


def requirements(wheel):
    """install_requires for the MXNet wheel named ``wheel`` (``mxnet`` or a CUDA one).

    Args:
        wheel: distribution name, e.g. ``"mxnet"`` or ``"mxnet-cu112"``.

    Returns:
        list of requirement strings.
    """
    if wheel == CPU_WHEEL:
        return ["%s==%s" % (wheel, MXNET_VERSION)]
    if wheel in NOT_INSTALLABLE:
        raise ValueError("CPSGD_MXNET=%s: %s; choose one of: %s" % (
            wheel, NOT_INSTALLABLE[wheel], ", ".join((CPU_WHEEL,) + CUDA_WHEELS)))
    if wheel not in CUDA_WHEELS:
        raise ValueError("CPSGD_MXNET=%s: not an MXNet %s wheel this project installs "
                         "with; choose one of: %s" % (
                             wheel, MXNET_VERSION, ", ".join((CPU_WHEEL,) + CUDA_WHEELS)))
    return (["%s==%s" % (wheel, MXNET_VERSION)] + list(CUDA11_LIBRARIES)
            + list(EXTRA_LIBRARIES.get(wheel, ())))
