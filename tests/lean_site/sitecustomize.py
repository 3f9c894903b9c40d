"""Put on PYTHONPATH by tests/conftest.py for every process the suite starts.

MXNet's import tries scikit-learn (mxnet.model) and SciPy (mxnet.test_utils,
mxnet.ndarray.sparse) and carries on without them; with the examples extra
installed both are there and cost about 1.7 s of CPU in every process that
imports MXNet, a few times per job.  This finder refuses those imports when
MXNet's own modules ask for them, and only then: any other code (GluonCV, a
test) imports them as usual.  Set CPSGD_TEST_FULL_IMPORTS=1 to turn it off.
"""
import os
import sys

_OPTIONAL = ("sklearn", "scipy", "pandas")


class _MXNetOptionalImports:
    """A meta path finder that fails MXNet's optional imports of _OPTIONAL."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in _OPTIONAL:
            return None
        frame = sys._getframe(1)
        while frame is not None:  # the first frame outside the import machinery
            module = frame.f_globals.get("__name__", "")
            if not module.startswith(("importlib", "_frozen_importlib")) \
                    and module != __name__:
                break
            frame = frame.f_back
        if frame is not None and (module == "mxnet" or module.startswith("mxnet.")):
            raise ModuleNotFoundError("%s: skipped for MXNet's optional import in the "
                                      "test suite (tests/lean_site)" % name, name=name)
        return None


if os.environ.get("CPSGD_TEST_FULL_IMPORTS") != "1":
    sys.meta_path.insert(0, _MXNetOptionalImports())

# Then step aside, as kvstore_ext/worker_site does: run the sitecustomize we shadow.
import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_other = importlib.machinery.PathFinder.find_spec(__name__, sys.path)
if _other is not None:
    _module = importlib.util.module_from_spec(_other)
    sys.modules[__name__] = _module
    _other.loader.exec_module(_module)
