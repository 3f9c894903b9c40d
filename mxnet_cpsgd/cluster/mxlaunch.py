"""Run MXNet 1.9.1's own ``tools/launch.py`` on Python 3.9+ (the shim).

Usage::

    python -m mxnet_cpsgd.cluster.mxlaunch [--host-ip ADDR] TOOLS_LAUNCH_ARGS...

(``--host-ip`` first, if given).

e.g. ``python -m mxnet_cpsgd.cluster.mxlaunch --host-ip 10.0.0.1 -n 2 -s 2 -H hosts
--launcher ssh "DMLC_PS_ROOT_URI=10.0.0.1 python train.py"``.

What it changes, and nothing else:

* ``threading.Thread.isAlive`` (removed in Python 3.9, called by the bundled
  ``dmlc_tracker``) is restored as an alias of ``is_alive``; without it every
  launch fails with ``AttributeError`` after the scheduler was started.
* ``--host-ip ADDR``: the address the tracker gives every node as the
  scheduler's (``DMLC_PS_ROOT_URI``).  dmlc_tracker has the option but MXNet's
  ``tools/launch.py`` does not pass it on, and its guess (the address
  ``getfqdn()`` resolves to, else a UDP route lookup towards 10.255.255.255)
  fails on a machine without a default route and picks the wrong interface on
  one with several.
* as root, ``OMPI_ALLOW_RUN_AS_ROOT`` and its confirmation are set (unless
  set already), which Open MPI's mpirun needs to start as root for
  ``--launcher mpi``.

* the nodes are watched (:mod:`.mxlaunch_watch`): when any node exits with a
  non-zero status the shim prints one line naming it, stops every other node
  it started (SIGTERM, SIGKILL after a grace of a few seconds) and exits with
  status 1.  tools/launch.py alone keeps waiting for the others.  Over ssh it
  stops the ssh clients, not the remote nodes (``cpsgd-launch -H`` does; see
  docs/launcher.md).
* the shim stopped (SIGTERM, SIGINT/Ctrl-C, SIGHUP, its parent process gone)
  stops every node it started the same way, with one line saying why
  (tools/launch.py alone exits on Ctrl-C and leaves the nodes running).
"""
import importlib.util
import logging
import os
import runpy
import sys
import threading
from typing import List, Optional, Sequence, Tuple

from mxnet_cpsgd.cluster import mxlaunch_watch


def tools_launch_path() -> str:
    """Path of the installed wheel's ``mxnet/tools/launch.py`` (mxnet not imported)."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("mxnet is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tools", "launch.py")
    if not os.path.exists(path):
        raise SystemExit("%s not found (this mxnet wheel has no tools/launch.py)" % path)
    return path


def _split_host_ip(argv: List[str]) -> Tuple[Optional[str], List[str]]:
    """``--host-ip ADDR`` (or ``--host-ip=ADDR``) is only taken from the front,
    so that the job's command, which comes last, is never touched."""
    if argv[:1] == ["--host-ip"] and len(argv) >= 2:
        return argv[1], argv[2:]
    if argv and argv[0].startswith("--host-ip="):
        return argv[0].split("=", 1)[1], argv[1:]
    return None, argv


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    host_ip, argv = _split_host_ip(argv)
    if not hasattr(threading.Thread, "isAlive"):
        threading.Thread.isAlive = threading.Thread.is_alive
    path = tools_launch_path()
    mxlaunch_watch.install()
    # launch.py appends its repository's tracker path; the wheel ships the
    # package as top-level dmlc_tracker, importable as is
    if host_ip is not None:
        from dmlc_tracker import tracker
        tracker.get_host_ip = lambda _requested=None: host_ip
    # the nodes' environment: a refused store name must not make a worker wait for
    # the others (kvstore_ext/trainer_hook.py); this launcher ends the job instead
    os.environ["CPSGD_MXLAUNCH_WATCHED"] = "1"
    if os.geteuid() == 0:  # Open MPI's mpirun refuses root without both
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    sys.argv = [path] + argv
    # launch.py's own __main__ block makes Ctrl-C end the launcher alone (its
    # SIGINT handler exits 0, the nodes keep running): load the file without it
    # and run its main() with the watcher's handlers in place
    launch = runpy.run_path(path, run_name="mxnet_tools_launch")
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    launch["main"]()


if __name__ == "__main__":
    main()
