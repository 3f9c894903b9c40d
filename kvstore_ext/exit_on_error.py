"""Make a worker process leave at once when its main thread dies of an exception.

When a Python process ends, MXNet 1.9.1's dist KVStore destructor first waits
for every engine operation, then for a barrier of all workers (ps-lite's
Finalize).  A worker whose script raised still has pulls in flight that the
servers answer only once every worker has pushed, while the other workers wait
for its pushes: nobody ever exits, and a launcher that watches processes sees
nothing.  :func:`install` wraps ``sys.excepthook`` so that an uncaught
exception prints its traceback as usual, flushes the output and logging
handlers, and ends the process with ``os._exit`` (exit code 1, 130 for
KeyboardInterrupt), skipping that finalisation.

Scope, deliberately narrow:
  * only uncaught exceptions of the main thread; an exception in another
    thread ends that thread only, as in plain Python;
  * ``sys.exit(n)`` / ``SystemExit`` is a normal exit: Python gives no hook for
    it, so a script that wants to fail a distributed job should raise (or call
    ``os._exit``) instead of ``sys.exit`` once a dist store exists;
  * atexit handlers do not run on this path (MXNet's own waits for the engine,
    which is what hangs).

Standard library only: cpsgd-launch also loads this file, through
``worker_site/sitecustomize.py``, into workers that never import mxnet_cpsgd.
"""
import os
import sys

_MARK = "_mxnet_cpsgd_exit_on_error"


def installed():
    """Whether the current ``sys.excepthook`` is ours."""
    return bool(getattr(sys.excepthook, _MARK, False))


def install():
    """Wrap ``sys.excepthook`` (idempotent; not in interactive sessions)."""
    if installed() or hasattr(sys, "ps1") or sys.flags.interactive:
        return
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)
        finally:
            _flush()
            os._exit(130 if issubclass(exc_type, KeyboardInterrupt) else 1)

    setattr(excepthook, _MARK, True)
    excepthook.__wrapped__ = previous
    sys.excepthook = excepthook


def _flush():
    logging = sys.modules.get("logging")
    if logging is not None:
        try:
            logging.shutdown()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def wanted(environ=os.environ):
    """Whether this process is a worker of a distributed job (ps-lite or Horovod)."""
    return environ.get("DMLC_ROLE") == "worker" or "HOROVOD_RANK" in environ
