"""The GPU install: which MXNet wheel is required, the CUDA library loader, and the
compression switch's refusal of unadmitted or mixed wheels.

The full check of a CUDA wheel (about 3 GB of downloads: a venv with the wheel and
NVIDIA's libraries, the switch's test, the main job, a disassembly comparison) runs
only when asked: CPSGD_CHECK_GPU_WHEEL=mxnet-cu112 pytest tests/test_gpu_wheel.py.
"""
import os
import runpy
import subprocess
import sys

import pytest

from procs import repo_pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDS = runpy.run_path(os.path.join(ROOT, "kvstore_ext", "builds.py"))


def _names(requirements):
    return {r.split("=")[0].split("<")[0] for r in requirements}


def test_cpu_and_gpu_requirements_never_mix():
    assert _names(BUILDS["requirements"]("mxnet")) == {"mxnet"}
    for wheel in BUILDS["CUDA_WHEELS"]:
        names = _names(BUILDS["requirements"](wheel))
        assert "mxnet" not in names and wheel in names
        assert not any(n.startswith("mxnet-cu") and n != wheel for n in names)
    assert set(BUILDS["ADMITTED"]) <= {"mxnet"} | set(BUILDS["CUDA_WHEELS"])
    with pytest.raises(ValueError, match="mxnet-cu112"):
        BUILDS["requirements"]("mxnet-cu110")


def _python(code, env_extra=None, pythonpath=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(list(pythonpath) + [repo_pythonpath(ROOT)])
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_loader_hook_runs_once_when_mxnet_is_imported(tmp_path):
    # a fake nvidia/cuda_runtime/lib with a real shared library under the soname:
    # the hook must load it (by path) when mxnet is imported, and then leave sys.meta_path
    libc = "/lib/x86_64-linux-gnu/libm.so.6"
    if not os.path.exists(libc):
        pytest.skip("no %s to stand in for a CUDA library" % libc)
    lib_dir = tmp_path / "nvidia" / "cuda_runtime" / "lib"
    lib_dir.mkdir(parents=True)
    os.symlink(libc, lib_dir / "libcudart.so.11.0")
    _fake_dist(tmp_path, "mxnet_cu112-1.9.1")  # the loader acts only for a CUDA wheel
    code = ("import sys, cpsgd_cuda_libs as c; c.install_hook(); c.install_hook(); "
            "n = sum(type(f).__name__ == '_PreloadBeforeMXNet' for f in sys.meta_path); "
            "import mxnet; "
            "m = sum(type(f).__name__ == '_PreloadBeforeMXNet' for f in sys.meta_path); "
            "print(n, m, c._loaded)")
    result = _python(code, {"LD_LIBRARY_PATH": ""}, [str(tmp_path)])
    assert result.returncode == 0, result.stderr
    hooks_before, hooks_after, loaded = result.stdout.split(" ", 2)
    assert (hooks_before, hooks_after) == ("1", "0")
    assert str(lib_dir / "libcudart.so.11.0") in loaded
    # no driver on this machine (or a driver): the message is printed exactly when
    # libcuda.so.1 cannot be loaded
    has_driver = _python("import ctypes; ctypes.CDLL('libcuda.so.1')").returncode == 0
    assert ("libcuda.so.1, the NVIDIA driver's library, was not found" in result.stderr) \
        == (not has_driver)


def test_no_nvidia_packages_no_preload():
    result = _python("import cpsgd_cuda_libs as c; print(c.preload())")
    assert result.returncode == 0 and result.stdout.strip() == "[]", result


def _fake_dist(site, dist):
    """Installed-package metadata (only) of ``dist`` ("name-version") under ``site``."""
    info = site / (dist + ".dist-info")
    info.mkdir()
    name, version = dist.rsplit("-", 1)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
                                   % (name.replace("_", "-"), version))


def test_switch_refuses_mixed_wheels(tmp_path):
    # a CUDA wheel's metadata next to the installed CPU wheel: the switch must refuse
    _fake_dist(tmp_path, "mxnet_cu112-1.9.1")
    expect = "several MXNet wheels installed over each other"
    code = ("import kvstore_ext as k\n"
            "try:\n    k.check_build()\nexcept k.UnsupportedBuildError as e:\n"
            "    print('refused:', e)\nelse:\n    print('accepted')")
    result = _python(code, pythonpath=[str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert expect in result.stdout and "bitsgd" in result.stdout, result.stdout


def test_switch_refuses_unadmitted_wheel():
    # the installed CPU wheel stands for an unadmitted one (ADMITTED emptied in that
    # process); CPSGD_CHECK_WHEEL, set by the check script, lets exactly that wheel run
    code = ("import kvstore_ext.compression_switch as s\n"
            "s.ADMITTED = ()\n"
            "try:\n    s.check_build()\nexcept s.UnsupportedBuildError as e:\n"
            "    print('refused:', e)\nelse:\n    print('accepted')")
    result = _python(code, {"CPSGD_CHECK_WHEEL": ""})
    assert "refused:" in result.stdout and "the wheel mxnet" in result.stdout, result
    result = _python(code, {"CPSGD_CHECK_WHEEL": "mxnet"})
    assert result.stdout.strip() == "accepted", result


@pytest.mark.skipif(not os.environ.get("CPSGD_CHECK_GPU_WHEEL"),
                    reason="set CPSGD_CHECK_GPU_WHEEL=<wheel spec> (about 3 GB download)")
def test_check_gpu_wheel_admits():
    spec = os.environ["CPSGD_CHECK_GPU_WHEEL"]
    result = subprocess.run(["bash", os.path.join(ROOT, "scripts", "check_gpu_wheel.sh"),
                             spec, "--num-epochs", "1"],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0 and "check_gpu_wheel: admitted:" in result.stdout, \
        result.stdout[-4000:] + result.stderr[-2000:]
