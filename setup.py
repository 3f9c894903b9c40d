import os
import runpy

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# which MXNet 1.9.1 wheel to install with: "mxnet" (CPU, the default) or a CUDA wheel,
# e.g. CPSGD_MXNET=mxnet-cu112 pip install '.[examples]' (docs/usage.md, GPU). The two
# kinds both write the package mxnet/, so exactly one of them is ever required.
BUILDS = runpy.run_path(os.path.join(HERE, "kvstore_ext", "builds.py"))
MXNET_WHEEL = os.environ.get("CPSGD_MXNET", "").strip() or BUILDS["CPU_WHEEL"]
MXNET_REQUIREMENTS = BUILDS["requirements"](MXNET_WHEEL)
GPU = MXNET_WHEEL != BUILDS["CPU_WHEEL"]
# a GPU install preloads the NVIDIA packages' CUDA libraries when mxnet is imported
PTH_LINE = "import cpsgd_cuda_libs; cpsgd_cuda_libs.install_hook()\n"


class BuildPyWithPth(build_py):
    """Adds cpsgd_cuda_libs.pth to site-packages for a GPU install."""

    def run(self):
        super().run()
        if GPU:
            with open(os.path.join(self.build_lib, "cpsgd_cuda_libs.pth"), "w") as f:
                f.write(PTH_LINE)


EXAMPLES = ["mlxtend", "gluoncv==0.10.5.post0", "opencv-python<4.12", "matplotlib",
            "pyyaml", "tqdm"]

setup(
    name="mxnet-cpsgd",
    version="0.1.0",
    description="CP-SGD (compression with periodic compensation) and its family "
                "as MXNet parameter-server KVStores",
    python_requires=">=3.8",
    packages=find_packages(include=["mxnet_cpsgd", "mxnet_cpsgd.*", "kvstore_ext"]),
    # put first on the workers' PYTHONPATH by cpsgd-launch (not a package)
    package_data={"kvstore_ext": ["worker_site/sitecustomize.py"]},
    py_modules=["cpsgd_cuda_libs"],
    install_requires=MXNET_REQUIREMENTS + ["numpy<1.24"],
    extras_require={
        "examples": EXAMPLES,
        "test": EXAMPLES + ["pytest", "pytest-timeout"],
        # build with: pip install --no-build-isolation '.[horovod]' (see README)
        "horovod": ["horovod==0.28.1"],
    },
    cmdclass={"build_py": BuildPyWithPth},
    entry_points={
        "console_scripts": [
            "cpsgd-launch=mxnet_cpsgd.launch:main",
            "cpsgd-bench=mxnet_cpsgd.bench.cli:main",
            "cpsgd-reproduce=mxnet_cpsgd.repro.runner:main",
        ],
    },
)
