"""Where the nodes of a multi-host job run, and how they are started:
over ssh from a host file (``-H``, :mod:`.remote_nodes`), as steps of a
Slurm allocation (``--launcher slurm``, :mod:`.slurm`), or with Open MPI's
mpirun (``--launcher mpi``, :mod:`.mpi`).  Each engine checks
its hosts before anything starts, builds the nodes (every remote one runs
under the same watchdog, :mod:`.watchdog`), and cleans up after every
attempt; :mod:`.launch` calls these three through this module."""
import argparse
import time
from typing import Callable, List, Mapping, Optional, Tuple, Union

from mxnet_cpsgd.cluster import mpi, slurm, ssh
from mxnet_cpsgd.cluster.nodes import LaunchError, Node
from mxnet_cpsgd.cluster.remote_nodes import build_host_nodes, prepare_cluster, sweep_hosts

#: a multi-host job's engine: a host file over ssh, or a Slurm allocation
Cluster = Union[ssh.Cluster, slurm.SlurmCluster, mpi.MpiCluster]
LAUNCHERS = ("local", "ssh", "slurm", "mpi")


#: seconds between two tries of a host that did not answer (--host-wait)
HOST_RETRY_S = 5.0


def prepare(cluster: Cluster, port: Optional[int], launch_id: str, first: bool,
            timeout: float, wait: float = 0.0,
            message: Callable[[str], None] = lambda text: None) -> Tuple[str, int]:
    """Check the hosts; the scheduler's address and port.  A check that fails
    is tried again for up to ``wait`` seconds.  Raises ssh.HostError."""
    end, said = time.monotonic() + wait, False
    while True:
        try:
            return _prepare(cluster, port, launch_id, first, timeout)
        except ssh.HostError as err:
            left = end - time.monotonic()
            if left <= 0:
                raise
            if not said:  # once: the final failure, if any, is the error itself
                message("%s; trying again for up to %.0f s (--host-wait)" % (err, left))
                said = True
            time.sleep(min(HOST_RETRY_S, left))


def _prepare(cluster: Cluster, port: Optional[int], launch_id: str, first: bool,
             timeout: float) -> Tuple[str, int]:
    if isinstance(cluster, slurm.SlurmCluster):
        return slurm.prepare(cluster, port, launch_id, timeout=max(30.0, timeout))
    if isinstance(cluster, mpi.MpiCluster):
        return mpi.prepare(cluster, port, timeout=max(30.0, timeout))
    return prepare_cluster(cluster, port, copy=first)


def build(cluster: Cluster, command: List[str], num_workers: int, num_servers: int,
          env: Mapping[str, str], port: int, root_uri: str, launch_id: str,
          heartbeat: float, allreduce: bool = False) -> Tuple[List[Node], str]:
    """The job's nodes, and where they run (for the start line).  With
    ``allreduce``: a Horovod/Gloo job (ssh or Slurm)."""
    first = "rendezvous" if allreduce else "scheduler"
    if isinstance(cluster, slurm.SlurmCluster):
        return (slurm.build_nodes(command, num_workers, num_servers, env, port, cluster,
                                  root_uri, launch_id, heartbeat, allreduce=allreduce),
                slurm.describe(cluster, root_uri, first))
    if isinstance(cluster, mpi.MpiCluster):
        return (mpi.build_nodes(command, num_workers, num_servers, env, port, cluster,
                                root_uri, launch_id, heartbeat),
                "mpirun hosts %s (scheduler on %s)" % (", ".join(cluster.names), root_uri))
    return (build_host_nodes(command, num_workers, num_servers, env, port, cluster,
                             root_uri, launch_id, heartbeat=heartbeat, allreduce=allreduce),
            "hosts %s (%s on %s)" % (", ".join(str(h) for h in cluster.hosts), first,
                                     root_uri))


def _holdings(names: List[str]) -> str:
    """``a, a, b`` -> ``'2 on a, 1 on b'`` (``'1 on each of a, b'`` when equal)."""
    counts = {name: names.count(name) for name in dict.fromkeys(names)}
    if len(set(counts.values())) == 1 and len(counts) > 1:
        return "%d on each of %s" % (names.count(names[0]), ", ".join(counts))
    return ", ".join("%d on %s" % (count, name) for name, count in counts.items())


def check_capacity(cluster: Cluster, num_workers: int) -> None:
    """Refuse more workers than the Slurm allocation has tasks, or than the
    host file's ``slots=N`` add up to (each worker takes one; servers and the
    scheduler run beside them), unless ``cluster.oversubscribe``.  Workers go
    round-robin over the slots, so ``num_workers`` within the total keeps
    every node within its own count.  Raises LaunchError (one line)."""
    if cluster.oversubscribe:
        return
    if isinstance(cluster, slurm.SlurmCluster):
        slots = list(cluster.slots)
        if num_workers > len(slots):
            raise LaunchError(
                "-n %d: Slurm job %s holds %d task%s (%s), one per worker; ask Slurm for "
                "%d (salloc/sbatch --ntasks=%d, or a larger --ntasks-per-node), give -n %d "
                "or fewer, or add --oversubscribe; nothing was started" % (
                    num_workers, cluster.job_id, len(slots), "" if len(slots) == 1 else "s",
                    _holdings(slots), num_workers, num_workers, len(slots)))
        return
    if not isinstance(cluster, (ssh.Cluster, mpi.MpiCluster)) \
            or not any(h.slots for h in cluster.hosts):
        return
    slots = [str(h) for h in ssh.slot_hosts(cluster.hosts)]
    if num_workers > len(slots):
        raise LaunchError(
            "-n %d: the host file states %d slot%s (%s%s), one per worker; add hosts "
            "or raise slots=N, give -n %d or fewer, or add --oversubscribe; nothing was "
            "started" % (num_workers, len(slots), "" if len(slots) == 1 else "s",
                         _holdings(slots), "" if all(h.slots for h in cluster.hosts)
                         else "; a line without slots= counts as 1", len(slots)))


def cleanup_reserve(cluster: Cluster, timeout: float) -> float:
    """Seconds of the teardown bound kept for :func:`cleanup`."""
    if isinstance(cluster, (slurm.SlurmCluster, mpi.MpiCluster)):
        return min(10.0, timeout * 0.3)
    return min(cluster.ssh.connect_timeout + 5, timeout * 0.3)


def cleanup(cluster: Cluster, launch_id: str, deadline: float,
            message: Callable[[str], None]) -> Optional[str]:
    """Remove what is left of the attempt on the hosts (ssh: kill its processes;
    Slurm: cancel its steps); a failure line when that could not be confirmed."""
    if isinstance(cluster, slurm.SlurmCluster):
        return slurm.cancel_steps(cluster, launch_id, deadline, message)
    if isinstance(cluster, mpi.MpiCluster):
        return mpi.sweep(cluster, launch_id, max(1.0, deadline - time.monotonic()), message)
    return sweep_hosts(cluster, launch_id, deadline, message)


def wait_for_hosts(cluster: Cluster, launch_id: str, wait: float, unreached: str,
                   message: Callable[[str], None]) -> Optional[str]:
    """After :func:`cleanup` failed with ``unreached``: try it again until it
    succeeds (the hosts answer; what is left of the job there is killed) or
    ``wait`` seconds passed.  Returns None, or the failure line (printed)."""
    start = time.monotonic()
    message("waiting up to %g s for the host to answer again (--host-wait)" % wait)
    while time.monotonic() - start < wait:
        time.sleep(min(HOST_RETRY_S, max(0.0, wait - (time.monotonic() - start))))
        lines: List[str] = []
        try_for = 15.0 if not isinstance(cluster, ssh.Cluster) \
            else cluster.ssh.connect_timeout + 5
        if cleanup(cluster, launch_id, time.monotonic() + try_for, lines.append) is None:
            for line in lines:
                message(line)
            message("every host answered again after %.0f s of --host-wait"
                    % (time.monotonic() - start))
            return None
    note = "%s; no answer within --host-wait %g s" % (unreached, wait)
    message(note)
    return note


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options choosing the engine (the ssh options are :mod:`.launch`'s)."""
    parser.add_argument("--allreduce", action="store_true",
                        help="a Horovod/Gloo job (the all-reduce stores: horovod, the "
                             "compressors, cpsgd_<x>) on this machine, the hosts of -H "
                             "or a Slurm allocation: a rendezvous service here instead "
                             "of scheduler and servers, one worker per slot (hosts round "
                             "robin), HOROVOD_* for every worker as horovodrun --gloo "
                             "sets them; watched, torn down and restarted like a "
                             "parameter-server job")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None,
                        help="where the nodes run: local (this machine; the default "
                             "without -H), ssh (the hosts of -H; the default with -H), "
                             "slurm (inside a Slurm allocation: its nodes, each node a "
                             "job step started with srun), mpi (Open MPI's mpirun "
                             "starts every node: on the hosts of -H, or here without)")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="with --launcher slurm, or a host file whose lines state "
                             "slots=N: start more workers than the allocation has tasks "
                             "(or the host file slots); refused without it")
    parser.add_argument("--srun-option", action="append", default=[], metavar="OPTION",
                        help="with --launcher slurm: one more option for every srun "
                             "(repeatable, e.g. --srun-option=--mpi=none; default: none)")
    parser.add_argument("--mpirun-option", action="append", default=[], metavar="OPTION",
                        help="with --launcher mpi: one more option for every mpirun "
                             "(repeatable, e.g. --mpirun-option=--mca "
                             "--mpirun-option=plm_rsh_agent=ssh; default: none)")


def slurm_cluster(args: argparse.Namespace) -> slurm.SlurmCluster:
    """The allocation for ``--launcher slurm`` (-s defaults to its node count,
    -n to its task count).  Raises ssh.HostError, LaunchError."""
    if args.hostfile is not None:
        raise LaunchError("--launcher slurm takes its hosts from the allocation; "
                          "leave out -H")
    cluster = slurm.from_environment()
    cluster.python = args.python or ""
    cluster.scheduler_address = args.scheduler_address
    cluster.srun_options = list(args.srun_option)
    if args.num_servers is None:
        args.num_servers = len(cluster.nodes)
    if args.num_workers is None:
        args.num_workers = len(cluster.slots)
    return cluster


def mpi_cluster(args: argparse.Namespace) -> mpi.MpiCluster:
    """The hosts for ``--launcher mpi``: -H's, or this machine (-s defaults to
    the number of hosts with -H).  Raises ssh.HostError."""
    hosts = ssh.parse_hostfile(args.hostfile) if args.hostfile else [ssh.Host(mpi.LOCAL)]
    ported = [str(h) for h in hosts if h.port is not None]
    if ported:
        raise ssh.HostError("--launcher mpi: mpirun takes no port in the host file (%s)"
                            % ", ".join(ported))
    if args.num_servers is None and args.hostfile:
        args.num_servers = len(hosts)
    return mpi.MpiCluster(hosts, python=args.python or "",
                          scheduler_address=args.scheduler_address,
                          mpirun_options=list(args.mpirun_option))


def cluster_from_args(args: argparse.Namespace) -> Optional[Cluster]:
    """The engine the command line asks for (None: this machine); fills in the
    defaults of -n and -s where the engine has them.  Raises LaunchError,
    ssh.HostError."""
    cluster: Optional[Cluster] = None
    if args.allreduce:
        if args.launcher == "mpi":
            raise LaunchError("--allreduce runs on this machine, over ssh (-H) or in a "
                              "Slurm allocation (--launcher slurm), not with mpirun")
        if args.scheduler_on_first_host:
            raise LaunchError("--allreduce runs its rendezvous service on this machine; "
                              "leave out --scheduler-on-first-host")
        args.num_servers = args.num_servers or 1  # none is started
    if args.launcher == "slurm":
        cluster = slurm_cluster(args)
    elif args.launcher == "mpi":
        cluster = mpi_cluster(args)
    elif args.launcher == "ssh" and args.hostfile is None:
        raise LaunchError("--launcher ssh needs -H HOSTFILE")
    elif args.launcher == "local" and args.hostfile is not None:
        raise LaunchError("--launcher local runs on this machine; leave out -H")
    elif args.hostfile is not None:
        cluster = ssh.Cluster(
            ssh.parse_hostfile(args.hostfile),
            ssh.SshSettings(user=args.ssh_user, identity=args.ssh_identity,
                            config=args.ssh_config, options=args.ssh_option,
                            connect_timeout=args.ssh_connect_timeout),
            scheduler_on_first_host=args.scheduler_on_first_host,
            scheduler_address=args.scheduler_address, python=args.python or "",
            copy_to=args.copy_workdir)
        if args.num_servers is None:
            args.num_servers = len(cluster.hosts)
    if args.num_servers is None:
        raise LaunchError("-s/--num-servers is required (without -H or a Slurm "
                          "allocation)")
    if args.num_workers is None:
        raise LaunchError("-n/--num-workers is required (except with --launcher slurm)")
    if cluster is not None:
        cluster.oversubscribe = args.oversubscribe
    return cluster
