"""Make ``gluon.Trainer(..., kvstore='<name>')`` and ``Module.fit(kvstore='<name>')``
use this project's stores.

MXNet 1.9.1's ``gluon.Trainer`` and Module API build their store through
``mxnet.model._create_kvstore``, which silently returns *no store at all* when a
worker has one device and the name lacks the substring ``"dist"``.  A user who
asks for ``kvstore='cpsgd'`` on a one-GPU (or CPU) worker would then train
alone without a word.  This module wraps the function that ``gluon.trainer``,
``module.module`` and ``model`` (``FeedForward``) hold so that names in
``names`` always create the registered store, and a
name that is neither registered nor one of MXNet's own store types raises
instead of silently training without a store (MXNet's native code takes any
unknown name for a local store, and any name with "dist" for ``dist_sync``);
every other name goes to MXNet's original code unchanged.  ``mx.kv.create``
(``mx.kvstore.create``, what MXNet's example scripts call) checks names the same
way.
"""
import difflib
import os
import sys
import traceback

import mxnet as mx
from mxnet import model as _model
from mxnet.kvstore import base as _kvstore_base
from mxnet.gluon import trainer as _trainer
from mxnet.module import module as _module

_MARKER = "_mxnet_cpsgd_names"
#: MXNet's own mx.kv.create (before :func:`install` wraps it)
_NATIVE_CREATE = getattr(_kvstore_base.create, "__wrapped__", _kvstore_base.create)


#: MXNet 1.9.1's native store types (src/kvstore/kvstore.cc picks the kind from
#: these words; ``mx.kv.create`` documents the combinations).  Any name that
#: contains "dist" is a ``dist_sync`` store to MXNet (``dist_async`` with
#: "_async"): only these spellings of it are taken.
NATIVE_TYPES = ("local", "device", "nccl", "dist_sync", "dist_async", "dist_sync_device",
                "dist_async_device", "dist_device_sync", "dist_device_async", "dist")
_NATIVE_PREFIXES = ("local", "device", "nccl")
#: how close (difflib's ratio) a name must come to a project store's to count as
#: a misspelling of it ('cpsgdd', 'cp_sgd', 'dist_cpsdg')
NEAR_MISS_RATIO = 0.8


def known_names():
    """Names ``kvstore=`` accepts: MXNet's registry and its native types."""
    return sorted(set(mx.kv.KVStoreBase.kv_registry) | set(NATIVE_TYPES))


def _project_names():
    """The registered names whose class comes from this project."""
    return sorted(name for name, cls in mx.kv.KVStoreBase.kv_registry.items()
                  if getattr(cls, "__module__", "").startswith("mxnet_cpsgd"))


def refusal(name):
    """Why ``name`` names no store, or None when it does.

    Taken: a registered name, one of :data:`NATIVE_TYPES`, and MXNet's other
    local spellings (``local_allreduce_cpu`` and the like: a first word of
    local, device or nccl) unless they contain or come close to a project
    store's name.  MXNet itself takes any other string for a local store (each
    worker then trains alone) and any string with "dist" for ``dist_sync``.
    """
    lowered = name.lower()
    if lowered in mx.kv.KVStoreBase.kv_registry or lowered in NATIVE_TYPES:
        return None
    ours = _project_names()
    meant = [n for n in ours if n in lowered.replace("-", "_")]
    meant = meant or difflib.get_close_matches(lowered, ours, n=1, cutoff=NEAR_MISS_RATIO)
    if not meant and "dist" not in lowered and lowered.split("_")[0] in _NATIVE_PREFIXES:
        return None
    hint = (" (a misspelling of %r?)" % max(meant, key=len)) if meant else ""
    return "unknown kvstore %r%s; known: %s" % (name, hint, ", ".join(known_names()))


def check_name(name):
    """Raise ValueError (one line: the name and the known names) if ``name``
    names no store (see :func:`refusal`)."""
    why = refusal(name)
    if why is not None:
        error = ValueError(why)
        _end_unwatched_job_on(error)
        raise error


#: set by the mxlaunch shim in its nodes' environment: a launcher that watches them
WATCHED_ENV = "CPSGD_MXLAUNCH_WATCHED"


def _end_unwatched_job_on(error):
    """Let the job end if ``error`` ends this worker where no launcher would.

    Under MXNet's tools/launch.py a worker that fails before it joins the job
    leaves the scheduler and the servers waiting for it forever.  Every worker
    runs the same command and is refused alike, so when the refusal goes
    uncaught each prints its traceback, joins the job and leaves it at once
    (MXNet's store, freed: a barrier of the workers, the servers stopped,
    ps-lite finalised) and exits with status 1; the job ends with nothing left.
    Launchers that watch their nodes (cpsgd-launch, the mxlaunch shim) end the
    job themselves when a worker exits non-zero: nothing is done there.
    """
    env = os.environ
    if env.get("DMLC_ROLE") != "worker" or not env.get("DMLC_PS_ROOT_URI") \
            or env.get("MXNET_CPSGD_PROGRESS") == "1" or env.get(WATCHED_ENV) == "1":
        return
    previous = sys.excepthook

    def leave_job(etype, value, tb):
        if value is not error:
            return previous(etype, value, tb)
        traceback.print_exception(etype, value, tb)
        sys.stderr.flush()
        sys.stdout.flush()
        try:
            kv = _NATIVE_CREATE("dist_async")  # joins; "_async": no sync-mode command
            del kv                             # and leaves: MXNet's end of a job
        finally:
            os._exit(1)

    sys.excepthook = leave_job


def _wrap_create():
    """Make ``mx.kv.create`` / ``mx.kvstore.create`` check the name first."""
    current = _kvstore_base.create
    if getattr(current, _MARKER, False):
        return
    original = current

    def create(name="local"):
        if isinstance(name, str):
            check_name(name)
        return original(name)

    create.__doc__ = original.__doc__
    create.__wrapped__ = original
    setattr(create, _MARKER, True)
    _kvstore_base.create = create
    mx.kvstore.create = create  # mx.kv is the same module


def install(names):
    """Route ``kvstore=<name>`` strings for ``names`` to ``mx.kv.create``.

    Idempotent; further calls add names.

    Args:
        names: iterable of registered store names (lower case).
    """
    for module in (_trainer, _module, _model):
        _wrap(module, names)
    _wrap_create()


def _wrap(module, names):
    current = module._create_kvstore
    routed = getattr(current, _MARKER, None)
    if routed is not None:
        routed.update(n.lower() for n in names)
        return
    original = current
    routed = set(n.lower() for n in names)

    def _create_kvstore(kvstore, num_device, arg_params):
        if isinstance(kvstore, str):
            if kvstore.lower() in routed:
                kv = mx.kv.create(kvstore.lower())
                update_on_kvstore = bool(int(os.getenv("MXNET_UPDATE_ON_KVSTORE", "1")))
                return kv, update_on_kvstore and kv.is_capable(mx.kv.KVStoreBase.OPTIMIZER)
            check_name(kvstore)
        return original(kvstore, num_device, arg_params)

    setattr(_create_kvstore, _MARKER, routed)
    _create_kvstore.__wrapped__ = original
    module._create_kvstore = _create_kvstore
