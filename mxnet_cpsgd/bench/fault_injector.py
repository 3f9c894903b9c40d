"""The seeded fault injector of the fault campaign (:mod:`.faults`).

It finds the processes of one job by a mark in their environment
(``CPSGD_FAULT_MARK``, passed to every node with ``cpsgd-launch --env``; the
launcher passes it explicitly to remote nodes too) and delivers one fault at a
time:

- ``kill-worker``, ``kill-server``, ``kill-scheduler``: SIGKILL of a random
  node of that role (the node's own process, not its remote watchdog);
- ``stop-worker``, ``stop-server``, ``stop-scheduler``: SIGSTOP of it (only
  the launcher's stall detection, ``--stall-timeout``, can notice that);
- ``drop-ssh`` (jobs on hosts only): SIGKILL of the ssh client that runs a
  random remote node, on the launching machine: the session is gone while
  the node still runs;
- ``link-down`` (jobs on hosts only): ``ip link set eth0 down`` inside a random
  host's network namespace, ``up`` again after ``link_down_s`` seconds (longer
  than the stall timeout);
- ``kill-step`` (Slurm jobs): SIGKILL of a random worker or server, the
  process an srun step runs;
- ``kill-slurmd`` (Slurm jobs): SIGKILL of a random node's ``slurmd``, started
  again after ``link_down_s`` seconds (as a supervisor would);
- ``kill-rank``, ``stop-rank`` (all-reduce jobs): SIGKILL or SIGSTOP of a
  random Horovod rank.

Which kinds a job gets and which node each hits are drawn from a
``random.Random`` seeded by the caller, so a campaign is repeatable up to the
times at which the processes happen to be found.
"""
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from mxnet_cpsgd.cluster import procfs
from mxnet_cpsgd.cluster.watchdog import WATCHDOG

MARK_ENV = "CPSGD_FAULT_MARK"
NODE_KINDS = ("kill-worker", "kill-server", "kill-scheduler",
              "stop-worker", "stop-server", "stop-scheduler")
HOST_KINDS = ("drop-ssh", "link-down")
SLURM_KINDS = ("kill-slurmd", "kill-step")
RANK_KINDS = ("kill-rank", "stop-rank")
KINDS = NODE_KINDS + HOST_KINDS + SLURM_KINDS + RANK_KINDS
#: kinds whose cause goes away by itself after ``link_down_s``: a job may
#: survive them without a restart
TEMPORARY_KINDS = ("link-down", "kill-slurmd")
#: the fault kinds that apply to a job of each engine (where it runs)
ENGINE_KINDS = {
    "local": NODE_KINDS,
    "hosts": NODE_KINDS + HOST_KINDS,
    "slurm": ("kill-slurmd", "kill-step", "link-down"),
    "mpi": ("kill-worker", "stop-worker", "kill-server", "stop-server"),
    "allreduce": RANK_KINDS,
}


class NoTarget(RuntimeError):
    """No process (or host) of the job to deliver this fault to right now."""


def plan_kinds(rng: random.Random, count: int, kinds: Sequence[str],
               engine: str) -> List[str]:
    """``count`` fault kinds for one job, in a seeded order: every allowed kind
    once as far as ``count`` goes (the kinds that need hosts chosen first, so
    that a short job still gets them), then seeded draws.  Allowed: those of
    ``kinds`` that apply to the ``engine`` the job runs on (:data:`ENGINE_KINDS`)."""
    applies = ENGINE_KINDS[engine]
    allowed = [k for k in kinds if k in applies]
    if not allowed:
        raise ValueError("no fault kind applies to this job (kinds %s)" % ", ".join(kinds))
    first = [k for k in allowed if k in HOST_KINDS]
    rest = [k for k in allowed if k not in HOST_KINDS]
    rng.shuffle(first)
    rng.shuffle(rest)
    plan = (first + rest)[:count]
    while len(plan) < count:
        plan.append(rng.choice(allowed))
    rng.shuffle(plan)
    return plan


def _pids() -> List[int]:
    return [pid for pid in procfs.pids() if pid != os.getpid()]


@dataclass
class Node:
    """One live node process of the job."""
    pid: int
    role: str
    name: str   # e.g. 'worker 1', 'server 0 on 198.18.0.11', 'scheduler'


def job_processes(mark: str) -> List[int]:
    """pids of the live (not zombie) processes that carry the job's mark."""
    return [pid for pid in _pids()
            if procfs.environ(pid).get(MARK_ENV) == mark and procfs.alive(pid)]


def job_nodes(mark: str) -> List[Node]:
    """The node processes of the job (remote watchdogs left out)."""
    nodes = []
    for pid in job_processes(mark):
        argv = procfs.cmdline(pid)
        if len(argv) >= 3 and argv[1] == "-c" and argv[2] == WATCHDOG:
            continue  # a remote node's watchdog: its child is the node
        env = procfs.environ(pid)
        role = env.get("DMLC_ROLE")
        if role is None and "HOROVOD_RANK" in env and "gloo_host" not in " ".join(argv):
            role = "rank"  # a Horovod rank (its gloo_host wrapper left out)
        if role not in ("worker", "server", "scheduler", "rank"):
            continue
        name = role
        if role == "worker":
            name = "worker %s" % env.get("MXNET_CPSGD_WORKER_INDEX", "?")
        elif role == "rank":
            name = "rank %s" % env["HOROVOD_RANK"]
        host = env.get("DMLC_NODE_HOST", "")
        if host.startswith("198.18."):
            name += " on %s" % host
        nodes.append(Node(pid, role, name))
    return nodes


def ssh_clients(mark: str) -> List[Tuple[int, str]]:
    """(pid, node description) of the launcher's ssh clients running a remote
    node of the job (their command line holds the node's environment)."""
    needle = "%s=%s" % (MARK_ENV, mark)
    found = []
    for pid in _pids():
        argv = procfs.cmdline(pid)
        if not argv or os.path.basename(argv[0]) != "ssh" or not procfs.alive(pid):
            continue
        line = " ".join(argv)
        if needle not in line:
            continue
        role = next((r for r in ("worker", "server", "scheduler")
                     if "DMLC_ROLE=" + r in line), "node")
        host = argv[-2] if len(argv) >= 2 else "?"
        found.append((pid, "ssh session of a %s on %s" % (role, host)))
    return found


@dataclass
class Delivered:
    """What :meth:`Injector.inject` did."""
    kind: str
    target: str
    pid: Optional[int]
    at: float          # time.monotonic() of the signal or the link change
    wall: float        # time.time() of the same moment


class Injector:
    """Delivers faults to the job marked ``mark``.

    Args:
        mark: the value of ``CPSGD_FAULT_MARK`` in the job's nodes.
        rng: the seeded generator that picks the targets.
        hosts: the job's :class:`mxnet_cpsgd.cluster.hosts.EmulatedHosts`, or None
            for a job on this machine.
        link_down_s: how long ``link-down`` keeps a host's link down (and
            ``kill-slurmd`` a slurmd dead).
        slurm: the job's :class:`mxnet_cpsgd.cluster.emulated_slurm.EmulatedSlurm`
            (``kill-slurmd``).
    """

    def __init__(self, mark: str, rng: random.Random, hosts=None,
                 link_down_s: float = 12.0, slurm=None) -> None:
        self.mark, self.rng, self.hosts, self.slurm = mark, rng, hosts, slurm
        self.link_down_s = link_down_s
        self._timers: List[threading.Thread] = []
        self._down: Dict[str, bool] = {}

    def inject(self, kind: str) -> Delivered:
        """Deliver one fault of ``kind`` now.

        Raises:
            NoTarget: nothing of the job to hit (e.g. between two attempts).
            ValueError: an unknown kind, or a host kind without hosts.
        """
        if kind not in KINDS:
            raise ValueError("unknown fault kind %r (known: %s)" % (kind, ", ".join(KINDS)))
        if kind in HOST_KINDS and self.hosts is None:
            raise ValueError("%s needs a job on emulated hosts" % kind)
        if kind == "link-down":
            return self._link_down()
        if kind == "kill-slurmd":
            return self._kill_slurmd()
        if kind == "kill-step":
            nodes = sorted((n for n in job_nodes(self.mark) if n.role in ("worker", "server")),
                           key=lambda n: n.name)
            if not nodes:
                raise NoTarget("no step of the job is running")
            node = self.rng.choice(nodes)
            return self._signal(kind, node.pid, node.name, signal.SIGKILL)
        if kind == "drop-ssh":
            clients = ssh_clients(self.mark)
            if not clients:
                raise NoTarget("no ssh session of the job")
            pid, name = self.rng.choice(sorted(clients))
            return self._signal(kind, pid, name, signal.SIGKILL)
        action, role = kind.split("-")
        nodes = sorted((n for n in job_nodes(self.mark) if n.role == role),
                       key=lambda n: n.name)
        if not nodes:
            raise NoTarget("no %s of the job is running" % role)
        node = self.rng.choice(nodes)
        return self._signal(kind, node.pid, node.name,
                            signal.SIGKILL if action == "kill" else signal.SIGSTOP)

    def _signal(self, kind: str, pid: int, name: str, signum: int) -> Delivered:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            raise NoTarget("%s (pid %d) is gone" % (name, pid)) from None
        return Delivered(kind, name, pid, time.monotonic(), time.time())

    def _link_down(self) -> Delivered:
        host = self.rng.choice(self.hosts.hosts)
        subprocess.run(["ip", "-n", host.netns, "link", "set", "eth0", "down"], check=True)
        at, wall = time.monotonic(), time.time()
        self._down[host.netns] = True

        def up_later():
            time.sleep(self.link_down_s)
            self._link_up(host.netns)
        timer = threading.Thread(target=up_later, daemon=True)
        timer.start()
        self._timers.append(timer)
        return Delivered("link-down", "eth0 of host %s for %g s" % (host.address,
                                                                    self.link_down_s),
                         None, at, wall)

    def _kill_slurmd(self) -> Delivered:
        if self.slurm is None:
            raise ValueError("kill-slurmd needs a job in an emulated Slurm cluster")
        node = self.rng.choice(self.slurm.nodes)
        self.slurm.kill_slurmd(node)
        at, wall = time.monotonic(), time.time()

        def start_later():
            time.sleep(self.link_down_s)
            self.slurm.start_slurmd(node)
        timer = threading.Thread(target=start_later, daemon=True)
        timer.start()
        self._timers.append(timer)
        return Delivered("kill-slurmd", "slurmd of %s, started again after %g s"
                         % (node, self.link_down_s), None, at, wall)

    def _link_up(self, netns: str) -> None:
        if self._down.pop(netns, False):
            subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"],
                           capture_output=True)

    def close(self) -> None:
        """Bring every link this injector took down up again (at once)."""
        for netns in list(self._down):
            self._link_up(netns)
        if self.slurm is not None:
            self.slurm.start_slurmd()  # every slurmd killed and not started yet
        for timer in self._timers:
            timer.join(0)


def continue_stopped(mark: str) -> List[int]:
    """SIGCONT every stopped process of the job (before a final teardown)."""
    resumed = []
    for pid in job_processes(mark):
        if procfs.state(pid) == "T":
            try:
                os.kill(pid, signal.SIGCONT)
                resumed.append(pid)
            except OSError:
                pass
    return resumed


def kill_job_processes(mark: str, tries: int = 3) -> List[int]:
    """SIGKILL whatever of the job is left; returns the pids found first."""
    first: List[int] = []
    for attempt in range(tries):
        pids = job_processes(mark)
        if attempt == 0:
            first = pids
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)
    return first
