"""The nodes of a job: what every launcher part shares.

A :class:`Node` is one process of a job (scheduler, server, worker, or an
all-reduce job's rendezvous service), on this machine or, through ssh, on a
remote host.  :mod:`.local_nodes` and :mod:`.remote_nodes` build them,
:mod:`.supervise` runs and watches them, :mod:`.launch` is the command line.
"""
import ctypes
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import kvstore_ext
from kvstore_ext import progress
from mxnet_cpsgd.cluster import ssh
from mxnet_cpsgd.cluster.ports import FREE_PORT_LOW, free_port  # noqa: F401 (re-exported)

#: hint for workers: the launcher's index 0..M-1 (ps-lite assigns ranks itself)
WORKER_INDEX_ENV = "MXNET_CPSGD_WORKER_INDEX"
#: set in every node of a job started again after a failure: the restart count (1, 2, ...)
RESTART_ENV = "MXNET_CPSGD_RESTART"
#: variables the launcher sets itself; --env may not override them
RESERVED_ENV = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                "DMLC_NUM_WORKER", "DMLC_NODE_HOST", WORKER_INDEX_ENV, RESTART_ENV)
#: put first on the workers' PYTHONPATH: makes a worker that raises exit at once
#: (and lets the steps of an unchanged script report progress)
WORKER_SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(kvstore_ext.__file__)),
                               "worker_site")
#: what a scheduler or server runs: importing MXNet in a process whose DMLC_ROLE is
#: server or scheduler runs that node.  MXNet's import also tries scikit-learn
#: (mxnet.model) and SciPy (mxnet.test_utils, sparse conversions), optional there and
#: never used by these roles; keeping them out saves about 1.7 s of CPU at every
#: node start where they are installed (the examples extra pulls both in); the test
#: suite skips the same modules in its own processes (tests/lean_site)
PS_NODE_CODE = ("import sys; sys.modules.update(sklearn=None, scipy=None, pandas=None); "
                "import mxnet")
#: defaults every node gets (a user may override them with --env): quiet ps-lite,
#: unbuffered Python so that lines arrive when printed, not when a buffer fills
NODE_DEFAULTS = {"PS_VERBOSE": "0", "PYTHONUNBUFFERED": "1"}
#: workers also get these: they may report their progress (kvstore_ext/progress.py)
WORKER_DEFAULTS = {progress.ENV: "1"}
#: SIGTERM -> SIGKILL grace, capped at a share of --timeout
TERM_GRACE_S = 3.0


class LaunchError(ValueError):
    """Invalid launcher input, detected before anything is started."""


def with_worker_site(env: Dict[str, str]) -> None:
    """Put :data:`WORKER_SITE_DIR` first on ``env``'s PYTHONPATH (in place)."""
    env["PYTHONPATH"] = os.pathsep.join(
        [WORKER_SITE_DIR] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))


def describe_exit(returncode: int) -> str:
    """``'exited with code 3'`` or ``'exited with signal SIGKILL'``.

    Args:
        returncode: a Popen returncode (negative: killed by that signal).
    """
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal %d" % -returncode
        return "exited with signal %s" % name
    return "exited with code %d" % returncode


def parent_death_signal() -> Optional[Callable[[], None]]:
    """A preexec_fn making the child get SIGKILL when the launcher dies, so
    even a SIGKILLed launcher leaves no direct child behind (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before fork
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    return preexec


@dataclass
class Node:
    """One process of the job."""
    role: str            # 'scheduler', 'server', 'worker' or 'rendezvous'
    index: int
    argv: List[str]
    env: Dict[str, str]
    proc: Optional[subprocess.Popen] = None
    returncode: Optional[int] = None   # set once seen exited
    stopped: bool = False              # we signalled it
    reader: Optional[threading.Thread] = None
    #: the last "SomeError: message" line of a traceback the node printed
    exception: Optional[str] = None
    #: the message of the C++ exception that aborted the node (ps-lite's checks)
    fatal: Optional[str] = None
    host: Optional[ssh.Host] = None    # remote node: its host (argv is then ssh's)
    remote_command: str = ""           # remote node: the command ssh runs there
    #: the newest progress report (workers) and when it arrived (time.monotonic)
    last_report: Optional[progress.Report] = None
    last_report_at: Optional[float] = None
    #: whether the newest report was inferred by the step hook (not watched for silence)
    last_report_inferred: bool = False
    #: the longest time between two successive ``train`` reports so far (seconds)
    longest_train_gap: float = 0.0
    #: an address this node serves on that the launcher can reach: the nodes after
    #: it start once it accepts connections (an all-reduce job's rendezvous service)
    serves: Optional[Tuple[str, int]] = None

    @property
    def name(self) -> str:
        name = self.role if self.role == "scheduler" else "%s %d" % (self.role, self.index)
        return name if self.host is None else "%s on %s" % (name, self.host)

    def describe(self) -> str:
        """How the node exited, e.g. ``'exited with signal SIGKILL'``."""
        lost = self.proc.describe() if isinstance(self.proc, ssh.RemoteProcess) else None
        return lost or describe_exit(self.returncode)

    @property
    def file_name(self) -> str:
        return self.name.replace(" ", "-") + ".log"

    def signal_group(self, signum: int) -> None:
        """Signal the node's whole process group (also after the leader exited,
        to catch descendants it left)."""
        if self.proc is None:
            return
        if isinstance(self.proc, ssh.RemoteProcess):
            self.proc.signal_group(signum)
            return
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def group_gone(self) -> bool:
        """Leader reaped and no other member of its group alive."""
        if self.proc is None:
            return True
        if isinstance(self.proc, ssh.RemoteProcess):
            return self.proc.group_gone()
        if self.proc.poll() is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        return False

