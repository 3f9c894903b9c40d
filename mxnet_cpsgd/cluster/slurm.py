"""Jobs inside a Slurm allocation (``cpsgd-launch --launcher slurm``).

The hosts are the allocation's nodes (``SLURM_JOB_NODELIST`` expanded by
``scontrol show hostnames``, each node's address from ``scontrol show node``),
taken in slot order: one slot per task of ``SLURM_TASKS_PER_NODE``, the nodes
taken in turn (a, b, a, b, ... while each has tasks left).  Servers then
workers go round-robin over the slots, as ``-H`` places them over the lines
of a host file; the scheduler runs on the launching machine (the batch
script's node under ``sbatch``, the submitting machine under ``salloc``).

Every remote node is its own job step: ``srun --overlap --nodes=1
--ntasks=1 --nodelist=NODE`` running the same watchdog as the ssh mode
(:mod:`.watchdog`): srun carries the watchdog's stdin, stdout and stderr as
ssh does, so heartbeats, ``TERM``/``KILL``, state reports and the exit
status work unchanged, and a node whose srun ends stops with it.  Each step
is named ``cpsgd-<launch id>``; after every attempt the launcher cancels
(``scancel``) whatever step of that name is still listed by ``squeue`` and
waits until none is left, within the teardown bound.
"""
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from mxnet_cpsgd.cluster import ssh
from mxnet_cpsgd.cluster.allreduce_nodes import build_allreduce_nodes
from mxnet_cpsgd.cluster.nodes import Node, free_port
from mxnet_cpsgd.cluster.step_nodes import build_step_nodes

#: what every step of one launch is named (plus the launch's id)
STEP_NAME_PREFIX = "cpsgd-"
_COMMAND_TIMEOUT_S = 30.0


def _run(argv: Sequence[str], timeout: float = _COMMAND_TIMEOUT_S) -> str:
    """Run a Slurm command; its stdout.  Raises ssh.HostError with its message."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ssh.HostError("%s not found: --launcher slurm needs Slurm's client "
                            "commands" % argv[0]) from None
    except subprocess.TimeoutExpired:
        raise ssh.HostError("%s did not answer within %g s" % (" ".join(argv[:3]),
                                                              timeout)) from None
    if done.returncode != 0:
        raise ssh.HostError("%s failed (exit code %d): %s" % (
            " ".join(argv[:3]), done.returncode, ssh._last_line(done.stderr)
            or ssh._last_line(done.stdout)))
    return done.stdout


def expand_tasks_per_node(text: str) -> List[int]:
    """``'2(x3),1'`` -> ``[2, 2, 2, 1]`` (SLURM_TASKS_PER_NODE's syntax).

    Raises:
        ssh.HostError: malformed text.
    """
    counts: List[int] = []
    for part in text.split(","):
        match = re.match(r"^\s*(\d+)(?:\(x(\d+)\))?\s*$", part)
        if not match:
            raise ssh.HostError("cannot read SLURM_TASKS_PER_NODE=%r" % text)
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


#: one entry per task, the nodes taken in turn: (a, b), (2, 1) -> a, b, a
slot_order = ssh.slot_order


@dataclass
class SlurmCluster:
    """The allocation a job runs in (see :func:`from_environment`).

    Args:
        job_id: the allocation's job id.
        nodes: its node names, in order.
        addresses: node name -> the address other nodes reach it at (NodeAddr).
        slots: node names, one per task, in the order nodes are placed.
        python: interpreter for servers, scheduler and watchdogs (the same
            path on every node; default: the launcher's own).
        scheduler_address: this machine's address every node reaches
            (default: its address on the route to the first node).
        srun: the srun program.
        srun_options: more options for every srun (e.g. ``--mpi=none``).
        oversubscribe: start more workers than the allocation has tasks.
    """
    job_id: str
    nodes: List[str]
    addresses: Dict[str, str]
    slots: List[str]
    python: str = ""
    scheduler_address: Optional[str] = None
    srun: str = "srun"
    srun_options: List[str] = field(default_factory=list)
    oversubscribe: bool = False

    @property
    def hosts(self) -> List[ssh.Host]:
        return [ssh.Host(name) for name in self.nodes]


def from_environment(environ: Mapping[str, str] = os.environ) -> SlurmCluster:
    """The allocation this process runs in.

    Raises:
        ssh.HostError: not inside an allocation, or Slurm cannot be asked.
    """
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        raise ssh.HostError("--launcher slurm runs inside a Slurm allocation (salloc or "
                            "sbatch): SLURM_JOB_ID and SLURM_JOB_NODELIST are not set")
    nodes = _run(["scontrol", "show", "hostnames", nodelist]).split()
    tasks_text = environ.get("SLURM_TASKS_PER_NODE") or "1(x%d)" % len(nodes)
    tasks = expand_tasks_per_node(tasks_text)
    if len(tasks) != len(nodes):
        raise ssh.HostError("SLURM_TASKS_PER_NODE=%s names %d nodes, the allocation has %d"
                            % (tasks_text, len(tasks), len(nodes)))
    addresses = {}
    for line in _run(["scontrol", "show", "node", "-o", ",".join(nodes)]).splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        addr = re.search(r"\bNodeAddr=(\S+)", line)
        if name and addr:
            addresses[name.group(1)] = addr.group(1)
    for node in nodes:
        addresses.setdefault(node, node)
    return SlurmCluster(job_id, nodes, addresses, slot_order(nodes, tasks))


def srun_argv(cluster: SlurmCluster, node: str, step_name: str, cwd: str) -> List[str]:
    """``srun ...`` starting one task on ``node`` (the command still to append)."""
    return [cluster.srun, "--jobid=" + cluster.job_id, "--nodes=1", "--ntasks=1",
            "--nodelist=" + node, "--overlap", "--job-name=" + step_name, "--quiet",
            "--kill-on-bad-exit=1", "--chdir=" + cwd] + list(cluster.srun_options)


_PROBE = ("import os, socket; s = socket.socket(); s.bind(('', 0)); "
          "print('cpsgd-probe', os.environ.get('SLURMD_NODENAME', '?'), s.getsockname()[1])")


def preflight(cluster: SlurmCluster, step_name: str, cwd: str, timeout: float) -> None:
    """One step with a task on every node: the working directory exists there
    and the interpreter runs.  Raises ssh.HostError naming what failed."""
    argv = [cluster.srun, "--jobid=" + cluster.job_id, "--nodes=%d" % len(cluster.nodes),
            "--ntasks=%d" % len(cluster.nodes), "--ntasks-per-node=1",
            "--nodelist=" + ",".join(cluster.nodes), "--overlap",
            "--job-name=" + step_name, "--quiet", "--chdir=" + cwd] \
        + list(cluster.srun_options) + [cluster.python, "-c", _PROBE]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ssh.HostError("%s not found: --launcher slurm needs Slurm's srun"
                            % cluster.srun) from None
    except subprocess.TimeoutExpired:
        raise ssh.HostError("checking the nodes with srun took over %g s; nothing was "
                            "started" % timeout) from None
    seen = {words[1] for words in (line.split() for line in done.stdout.splitlines())
            if len(words) == 3 and words[0] == "cpsgd-probe"}
    missing = [n for n in cluster.nodes if n not in seen]
    if missing:
        raise ssh.HostError("cannot run %s in %s on %s with srun (exit code %d): %s; "
                            "nothing was started" % (
                                cluster.python, cwd, ", ".join(missing), done.returncode,
                                ssh._last_line(done.stderr) or ssh._last_line(done.stdout)))


def prepare(cluster: SlurmCluster, port: Optional[int], launch_id: str,
            timeout: float) -> Tuple[str, int]:
    """Check the nodes; the scheduler's address (this machine) and port."""
    cluster.python = cluster.python or sys.executable
    preflight(cluster, STEP_NAME_PREFIX + launch_id, os.getcwd(), timeout)
    address = cluster.scheduler_address or ssh.scheduler_address(
        ssh.Host(cluster.addresses[cluster.nodes[0]]))
    return address, port or free_port()


def build_nodes(command: List[str], num_workers: int, num_servers: int,
                env: Mapping[str, str], port: int, cluster: SlurmCluster, root_uri: str,
                launch_id: str, heartbeat: float, allreduce: bool = False) -> List[Node]:
    """Scheduler here; servers then workers round-robin over the slots, each
    one srun step running the watchdog and the node's command.  With
    ``allreduce``: the rendezvous service here, worker i on slot i (modulo)."""
    step = STEP_NAME_PREFIX + launch_id
    if allreduce:
        cwd = os.getcwd()
        return build_allreduce_nodes(
            command, num_workers, env, port, root_uri, launch_id, cluster.python,
            cluster.slots, cwd, heartbeat,
            lambda index, node: (srun_argv(cluster, node, step, cwd) + ["sh", "-c"],
                                 ssh.Host(node)))
    return build_step_nodes(command, num_workers, num_servers, env, port, root_uri,
                            launch_id, heartbeat, cluster.python, cluster.slots,
                            cluster.addresses.__getitem__,
                            lambda node, cwd: srun_argv(cluster, node, step, cwd))


def _steps(cluster: SlurmCluster, step_name: str) -> List[str]:
    """Ids (``job.step``) of the allocation's steps named ``step_name``."""
    out = _run(["squeue", "-h", "-s", "-j", cluster.job_id, "-o", "%i %j"])
    return [words[0] for words in (line.split(None, 1) for line in out.splitlines())
            if len(words) == 2 and words[1].strip() == step_name]


def cancel_steps(cluster: SlurmCluster, launch_id: str, deadline: float,
                 message: Callable[[str], None]) -> Optional[str]:
    """Cancel every step of this launch still listed, and wait (until
    ``deadline``, time.monotonic) until none is.  Returns a failure line when
    some could not be confirmed gone."""
    step_name = STEP_NAME_PREFIX + launch_id
    cancelled: List[str] = []
    scancel_error = ""
    try:
        while True:
            left = _steps(cluster, step_name)
            if not left:
                break
            fresh = [s for s in left if s not in cancelled]
            if fresh:
                try:
                    _run(["scancel"] + fresh)
                    cancelled += fresh
                except ssh.HostError as err:
                    # a step that ended between squeue and scancel makes scancel fail
                    # ("Invalid job id specified"); the next listing tells: one still
                    # listed is cancelled again until the deadline
                    scancel_error = " (scancel: %s)" % err
            if time.monotonic() >= deadline:
                note = "srun step%s %s of the job still listed after scancel%s" % (
                    "" if len(left) == 1 else "s", ", ".join(left), scancel_error)
                message(note)
                return note
            time.sleep(0.5)
    except ssh.HostError as err:
        note = "could not check the job's srun steps: %s" % err
        message(note)
        return note
    if cancelled:
        message("cancelled %d srun step%s left of the job (%s)" % (
            len(cancelled), "" if len(cancelled) == 1 else "s", ", ".join(cancelled)))
    return None


def describe(cluster: SlurmCluster, root_uri: str, first: str = "scheduler") -> str:
    return "Slurm job %s nodes %s (%s on %s)" % (
        cluster.job_id, ", ".join(cluster.nodes), first, root_uri)
