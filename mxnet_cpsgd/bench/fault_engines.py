"""Where the fault campaign's jobs run (:mod:`.faults`): one engine each.

- ``local``: ``cpsgd-launch -n 2 -s 1`` on this machine;
- ``hosts``: ``cpsgd-launch -H`` over ssh on 2 emulated hosts (a server per host);
- ``slurm``: ``salloc -N 2 --ntasks-per-node=1 cpsgd-launch --launcher slurm``
  in an emulated Slurm cluster (:mod:`mxnet_cpsgd.cluster.emulated_slurm`:
  slurmctld, a slurmd per host, munge), every node an srun step, a server per
  node (``--max-restarts`` restarts the job inside the same allocation);
- ``mpi``: ``cpsgd-launch --launcher mpi -n 2 -s 1`` on this machine, every
  node under its own mpirun;
- ``allreduce``: ``cpsgd-launch --allreduce -n 2`` (Horovod over Gloo, the
  rendezvous service of the launcher) on this machine.

Each engine makes the launcher's command line and environment, checks what a
run left behind (Slurm: jobs and steps still listed, processes in the hosts
other than the daemons) and tears down what it set up.
"""
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

from mxnet_cpsgd.bench.fault_injector import MARK_ENV
from mxnet_cpsgd.bench.fault_job import NODE_ENV

ENGINES = ("local", "hosts", "slurm", "mpi", "allreduce")
#: Open MPI as root, and oversubscribing this machine's 2 cores
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


class Engine:
    """One engine of the campaign, set up on first use."""

    def __init__(self, where: str) -> None:
        if where not in ENGINES:
            raise ValueError("unknown engine %r (known: %s)" % (where, ", ".join(ENGINES)))
        self.where = where
        self.hosts = None   # EmulatedHosts of a hosts or slurm engine (link-down)
        self.slurm = None   # EmulatedSlurm of the slurm engine (kill-slurmd)
        self.netns: List[str] = []  # every network namespace it made

    def setup(self, log) -> None:
        if self.where == "hosts" and self.hosts is None:
            from mxnet_cpsgd.cluster.hosts import EmulatedHosts
            self.hosts = EmulatedHosts(2)
            self.hosts.setup()
            log("emulated hosts %s (launching machine %s)" % (
                ", ".join(h.address for h in self.hosts.hosts), self.hosts.launcher.address))
        elif self.where == "slurm" and self.slurm is None:
            from mxnet_cpsgd.cluster.emulated_slurm import EmulatedSlurm
            self.slurm = EmulatedSlurm(2)
            self.slurm.setup()
            self.hosts = self.slurm.hosts
            log("emulated Slurm cluster: slurmctld on %s, slurmd %s" % (
                self.slurm.launcher.address, ", ".join(
                    "%s on %s" % (n, h.address)
                    for n, h in zip(self.slurm.nodes, self.hosts.hosts))))
        if self.hosts is not None:
            self.netns = sorted(set(self.netns) | {m.netns for m in self.hosts.machines})

    def command(self, worker_cmd: List[str], mark: str, stall_timeout: float,
                max_restarts: int, timeout: float = 20.0, job_timeout: float = 3600.0,
                host_wait: float = 0.0) -> Tuple[List[str], Dict[str, str]]:
        """(argv, environment over this process's) of the launcher running
        ``worker_cmd`` on 2 workers."""
        argv = [sys.executable, "-m", "mxnet_cpsgd.launch", "-n", "2",
                "--stall-timeout", "%g" % stall_timeout, "--max-restarts", str(max_restarts),
                "--timeout", "%g" % timeout, "--job-timeout", "%g" % job_timeout,
                "--env", "%s=%s" % (MARK_ENV, mark)] + ["--env=" + e for e in NODE_ENV]
        if host_wait:
            argv += ["--host-wait", "%g" % host_wait]
        env: Dict[str, str] = {MARK_ENV: mark}
        if self.where == "local":
            return argv + ["-s", "1", "--"] + worker_cmd, env
        if self.where == "hosts":
            argv += ["-H", self.hosts.hostfile, "--ssh-config", self.hosts.ssh_config, "--"]
            return self.hosts.launcher.wrap(argv + worker_cmd), env
        if self.where == "mpi":
            env.update(MPI_ENV)
            return argv + ["--launcher", "mpi", "-s", "1", "--"] + worker_cmd, env
        if self.where == "allreduce":
            return argv + ["--allreduce", "--"] + worker_cmd, env
        env.update(self.slurm.env)
        salloc = ["salloc", "--quiet", "-N", "2", "--ntasks-per-node=1"]
        return self.slurm.launcher.wrap(salloc + argv + ["--launcher", "slurm", "--"]
                                        + worker_cmd), env

    def leftovers(self) -> List[str]:
        """What a finished run left in the engine (besides its marked processes,
        which the campaign checks for every engine)."""
        if self.slurm is None:
            return []
        deadline = time.monotonic() + 20  # slurmctld cleans up steps a few s after
        while True:
            daemons = self.slurm.daemon_pids()
            left = ["%s: pid %d" % (h.address, p) for h in self.hosts.machines
                    for p in self.hosts.processes(h) if p not in daemons]
            jobs = ["Slurm job %s" % j for j in self.slurm.job_ids()]
            steps = ["Slurm step %s" % s for s in self.slurm.steps()]
            found = left + jobs + steps
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    def close(self) -> None:
        if self.slurm is not None:
            self.slurm.close()
        elif self.hosts is not None:
            self.hosts.close()
        self.slurm = self.hosts = None


def engine_of(config: str) -> Tuple[str, str]:
    """(algorithm, engine) of a configuration name ``ALGORITHM-ENGINE``."""
    algorithm, _, where = config.rpartition("-")
    return algorithm, where


def namespaces() -> Optional[List[str]]:
    """Every network namespace on this machine (None: ``ip`` failed)."""
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return sorted(line.split()[0] for line in out.splitlines() if line.strip())

