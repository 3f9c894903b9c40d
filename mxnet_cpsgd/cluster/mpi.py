"""Jobs started with Open MPI's ``mpirun`` (``cpsgd-launch --launcher mpi``).

The hosts are the lines of ``-H HOSTFILE`` (servers then workers
round-robin over the lines, or over the slots where lines state ``slots=N``,
as with ssh: :func:`.ssh.slot_hosts`), or this machine alone without ``-H``.  Every remote node is its own
``mpirun -np 1 --host HOST`` running the ssh mode's watchdog
(:mod:`.watchdog`, through :mod:`.step_nodes`): mpirun forwards its stdin to
the task and the task's stdout and stderr back, so heartbeats, ``TERM`` /
``KILL``, state reports and exit statuses work as over ssh.  mpirun reaches
the hosts as it is configured to (its own ssh, ``plm_rsh_agent``, or a
resource manager).  Before the job one mpirun runs a probe on every host;
after every attempt one more kills whatever process of the job is left there.
As root, mpirun gets ``--allow-run-as-root``.
"""
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from mxnet_cpsgd.cluster import ssh
from mxnet_cpsgd.cluster.nodes import Node, free_port
from mxnet_cpsgd.cluster.step_nodes import build_step_nodes

#: the host name of this machine in an mpi job without a host file
LOCAL = "localhost"


@dataclass
class MpiCluster:
    """Where an mpirun job runs.

    Args:
        hosts: from the host file, or ``[Host('localhost')]`` (this machine).
        python: interpreter for servers, scheduler and watchdogs (the same path
            on every host; default: the launcher's own).
        scheduler_address: this machine's address every host reaches.
        mpirun: the mpirun program.
        mpirun_options: more options for every mpirun.
        oversubscribe: place more workers on a host than its ``slots=N``.
    """
    hosts: List[ssh.Host]
    python: str = ""
    scheduler_address: Optional[str] = None
    mpirun: str = "mpirun"
    mpirun_options: List[str] = field(default_factory=list)
    oversubscribe: bool = False

    @property
    def names(self) -> List[str]:
        return [h.name for h in self.hosts]

    @property
    def local(self) -> bool:
        return self.names == [LOCAL]

    def argv(self, hosts: List[str], per_host: int = 1) -> List[str]:
        """``mpirun`` running one task on each of ``hosts``."""
        base = [self.mpirun]
        if os.geteuid() == 0:
            base.append("--allow-run-as-root")
        return base + ["-np", str(len(hosts) * per_host), "--host",
                       ",".join("%s:%d" % (h, per_host) for h in hosts),
                       "--map-by", "node", "--oversubscribe"] + list(self.mpirun_options)


def _run(argv: List[str], timeout: float) -> Tuple[int, str, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr
    except FileNotFoundError:
        raise ssh.HostError("%s not found: --launcher mpi needs Open MPI's mpirun "
                            "(Debian: openmpi-bin)" % argv[0]) from None
    except subprocess.TimeoutExpired:
        return 255, "", "no answer within %g s" % timeout


_PROBE = ("import os, socket; s = socket.socket(); s.bind(('', 0)); "
          "print('cpsgd-probe', os.environ.get('OMPI_COMM_WORLD_RANK', '?'), "
          "s.getsockname()[1])")


def prepare(cluster: MpiCluster, port: Optional[int], timeout: float) -> Tuple[str, int]:
    """Run a probe on every host (the working directory exists, the
    interpreter runs); the scheduler's address and port.  Raises ssh.HostError."""
    cluster.python = cluster.python or sys.executable
    names = list(dict.fromkeys(cluster.names))
    code, out, err = _run(cluster.argv(names) + ["--wdir", os.getcwd(), cluster.python,
                                                 "-c", _PROBE], timeout)
    seen = {int(w[1]) for w in (line.split() for line in out.splitlines())
            if len(w) == 3 and w[0] == "cpsgd-probe" and w[1].isdigit()}
    missing = [h for i, h in enumerate(names) if i not in seen]
    if missing:
        raise ssh.HostError("cannot run %s in %s on %s with mpirun (exit code %d): %s; "
                            "nothing was started" % (
                                cluster.python, os.getcwd(), ", ".join(missing), code,
                                ssh._last_line(err) or ssh._last_line(out)))
    if cluster.local:
        return "127.0.0.1", port or free_port()
    return (cluster.scheduler_address or ssh.scheduler_address(cluster.hosts[0]),
            port or free_port())


def build_nodes(command: List[str], num_workers: int, num_servers: int,
                env: Mapping[str, str], port: int, cluster: MpiCluster, root_uri: str,
                launch_id: str, heartbeat: float) -> List[Node]:
    """Scheduler here; servers then workers round-robin over the hosts (their
    slots), each under its own mpirun."""
    return build_step_nodes(
        command, num_workers, num_servers, env, port, root_uri, launch_id, heartbeat,
        cluster.python, [h.name for h in ssh.slot_hosts(cluster.hosts)],
        lambda host: "127.0.0.1" if host == LOCAL else host,
        lambda host, cwd: cluster.argv([host]) + ["--wdir", cwd])


def sweep(cluster: MpiCluster, launch_id: str, timeout: float,
          message: Callable[[str], None]) -> Optional[str]:
    """Kill every process of the job left on any host (one mpirun task per
    host); a failure line when a host could not be checked."""
    names = list(dict.fromkeys(cluster.names))
    script = (
        "n=0; for d in /proc/[0-9]*; do "
        "if tr '\\0' '\\n' < $d/environ 2>/dev/null | grep -qx %s=%s; then "
        "kill -9 ${d#/proc/} 2>/dev/null && n=$((n+1)); fi; done; "
        "echo cpsgd-swept $OMPI_COMM_WORLD_RANK $n" % (ssh.JOB_ID_ENV, launch_id))
    _, out, _ = _run(cluster.argv(names) + ["--wdir", "/", "sh", "-c", script], timeout)
    found: Dict[int, int] = {int(m.group(1)): int(m.group(2))
                             for m in re.finditer(r"cpsgd-swept (\d+) (\d+)", out)}
    for rank, count in found.items():
        if count:
            message("killed %d process%s of the job left on %s" % (
                count, "" if count == 1 else "es", names[rank]))
    unreached = [h for i, h in enumerate(names) if i not in found]
    if unreached:
        note = "could not check %s for processes left of the job" % ", ".join(unreached)
        message(note)
        return note
    return None
