"""The mxlaunch shim's node watcher: a node that fails ends the whole job.

MXNet's ``tools/launch.py`` hands every node to ``dmlc_tracker``, which runs it
in a thread with ``subprocess.call`` (local launcher) or ``check_call`` (ssh
launcher, each mpirun, and the scheduler) and never looks at the others: when a worker
raises, its thread ends with an exception while the scheduler, the servers and
the other workers wait for it forever.  :func:`install` gives those tracker
modules a ``subprocess`` of their own whose ``call`` / ``check_call`` start the
node in its own process group and report how it ended.  The first node that
exits non-zero makes the watcher print one line naming it, stop every other
node it started (SIGTERM to each process group, SIGKILL after
``TERM_GRACE_S``, as cpsgd-launch does) and end the launcher with exit status 1.

The launcher itself stopped (SIGTERM, SIGINT, SIGHUP, or its parent process
gone, unless started under ``nohup``: :meth:`NodeWatch.stop_with_launcher`)
stops every node the same way, with one line saying why, and exits with 128 +
the signal's number (1 for a lost parent): the nodes run in process groups of
their own, which a signal to the launcher's group (Ctrl-C, ``timeout``) would
not reach.

Over ssh the processes started here are the ssh clients (and the scheduler);
ending a client does not end its remote node, which cpsgd-launch -H does.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types

from mxnet_cpsgd.cluster.nodes import TERM_GRACE_S

#: the signals that stop the launcher and with it the job
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: how often the launcher looks for its parent process
PARENT_POLL_S = 0.5

_ROLE = re.compile(r"DMLC_ROLE=['\"]?(\w+)")
_TASK = re.compile(r"DMLC_TASK_ID=['\"]?(\d+)")


class NodeWatch:
    """The processes of one launch and the teardown when one of them fails."""

    def __init__(self, exit=os._exit, out=None):
        self._exit = exit
        self._out = out if out is not None else sys.stderr
        self._lock = threading.Lock()
        self._procs = {}        # pid -> (Popen, label)
        self._stopping = False

    def run(self, args, env=None, **kwargs):
        """Start one node, wait for it, and return its exit status."""
        label = _label(args, env)
        with self._lock:
            stopping = self._stopping
            if not stopping:
                proc = subprocess.Popen(args, env=env, start_new_session=True, **kwargs)
                self._procs[proc.pid] = (proc, label)
        if stopping:  # the job is being stopped: start nothing; the teardown exits
            threading.Event().wait()
        code = proc.wait()
        with self._lock:
            self._procs.pop(proc.pid, None)
            stopping, failed = self._stopping, code != 0 and not self._stopping
        if failed:
            self.stop("%s exited with status %s" % (label, _describe(code)), 1, other=True)
        if stopping:
            # stopped by the teardown: dmlc_tracker would print a traceback with the
            # whole environment; the launcher exits from the teardown instead
            threading.Event().wait()
        return code

    def stop(self, why, status, other=False):
        """Print one line saying ``why``, stop every node and exit with ``status``.

        Only the first caller tears down; a later one (another failed node, a
        second Ctrl-C while the first teardown runs) returns at once.
        """
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            procs = [p for p, _ in self._procs.values()]
        self._out.write("mxlaunch: %s; stopping the job (%d %snodes)\n"
                        % (why, len(procs), "other " if other else ""))
        self._out.flush()
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            _signal_group(proc, signal.SIGKILL)  # also what the node left in its group
            try:
                proc.wait(TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        sys.stdout.flush()
        self._exit(status)

    def stop_with_launcher(self, signals=STOP_SIGNALS, poll_s=PARENT_POLL_S):
        """Stop the job when the launcher gets one of ``signals`` or loses its parent.

        Call from the main thread (Python runs signal handlers there; the tracker's
        main thread waits in ``Thread.join``, which a signal interrupts).  A signal
        ignored when the launcher started stays ignored, and with SIGHUP ignored
        (``nohup``) a lost parent is not watched either: the job was meant to
        outlive its terminal.
        """
        def on_signal(signum, _frame):
            name = signal.Signals(signum).name
            self.stop("received %s" % name, 128 + signum)

        for sig in signals:
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, on_signal)
        parent = os.getppid()
        if parent > 1 and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
            threading.Thread(target=self._watch_parent, args=(parent, poll_s),
                             name="mxlaunch-parent", daemon=True).start()

    def _watch_parent(self, parent, poll_s):
        while os.getppid() == parent:
            time.sleep(poll_s)
        self.stop("its parent process (pid %d) is gone" % parent, 1)

    def subprocess_module(self):
        """A stand-in for ``subprocess`` whose call/check_call run watched nodes."""
        def call(args, **kwargs):
            return self.run(args, **kwargs)

        def check_call(args, **kwargs):
            code = self.run(args, **kwargs)
            if code:
                raise subprocess.CalledProcessError(code, args)
            return 0

        module = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in dir(subprocess)
                                          if not k.startswith("__")})
        module.call, module.check_call = call, check_call
        return module


def _label(args, env):
    text = args if isinstance(args, str) else " ".join(map(str, args))
    role = (env or {}).get("DMLC_ROLE") or _first(_ROLE, text) or "node"
    task = (env or {}).get("DMLC_TASK_ID") or _first(_TASK, text)
    if role == "server" and task is not None and env is not None \
            and "DMLC_NUM_WORKER" in env:
        # dmlc_tracker numbers servers after the workers
        task = str(int(task) - int(env["DMLC_NUM_WORKER"]))
    return role if role == "scheduler" or task is None else "%s %s" % (role, task)


def _first(pattern, text):
    match = pattern.search(text)
    return match.group(1) if match else None


def _describe(code):
    if code < 0:
        try:
            return "%d (%s)" % (code, signal.Signals(-code).name)
        except ValueError:
            pass
    return str(code)


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def install(watch=None):
    """Route dmlc_tracker's node starts (local, ssh, each mpirun, the scheduler)
    through ``watch``."""
    from dmlc_tracker import local, mpi, ssh, tracker
    watch = watch or NodeWatch()
    watch.stop_with_launcher()
    module = watch.subprocess_module()
    for tracker_module in (local, mpi, ssh, tracker):
        tracker_module.subprocess = module
    return watch
