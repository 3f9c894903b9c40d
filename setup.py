from setuptools import find_packages, setup

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
    install_requires=["mxnet==1.9.1", "numpy<1.24"],
    extras_require={
        "examples": EXAMPLES,
        "test": EXAMPLES + ["pytest", "pytest-timeout"],
        "gpu": ["mxnet-cu112==1.9.1"],
        # build with: pip install --no-build-isolation '.[horovod]' (see README)
        "horovod": ["horovod==0.28.1"],
    },
    entry_points={
        "console_scripts": [
            "cpsgd-launch=mxnet_cpsgd.launch:main",
            "cpsgd-bench=mxnet_cpsgd.bench.cli:main",
            "cpsgd-reproduce=mxnet_cpsgd.repro.runner:main",
        ],
    },
)
