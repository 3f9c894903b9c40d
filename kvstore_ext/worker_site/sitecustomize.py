"""Loaded by Python at start-up in every worker that cpsgd-launch starts.

The launcher puts this folder first on the workers' PYTHONPATH so that a
worker dies promptly of an uncaught exception whatever store its script uses
(see ../exit_on_error.py), even one that never imports mxnet_cpsgd, and so
that the steps of a gluon.Trainer or Module report progress to the launcher's
stall detection (../progress.py, install_step_hook), and a worker waiting in
mx.kv.create for the job's other nodes says so (install_connect_hook).  Then it steps aside: the folder leaves sys.path and any other sitecustomize on the
path is imported as usual.
"""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _load(name):
    spec = importlib.util.spec_from_file_location(
        "_mxnet_cpsgd_" + name, os.path.join(os.path.dirname(_here), name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_module = _load("exit_on_error")
if _module.wanted():
    _module.install()
try:  # progress reports of an unchanged script's steps (see ../progress.py); best effort
    _progress = _load("progress")
    _progress.install_exit_report()
    _progress.install_step_hook()
    _progress.install_connect_hook()
except Exception:  # noqa: BLE001 - never keep a worker from starting
    pass

sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_other = importlib.machinery.PathFinder.find_spec(__name__, sys.path)
if _other is not None:  # run the sitecustomize we shadow, in our place
    _module = importlib.util.module_from_spec(_other)
    sys.modules[__name__] = _module
    _other.loader.exec_module(_module)
