"""Where the nodes of a multi-host job run, and how they are started:
over ssh from a host file (``-H``, :mod:`.remote_nodes`) or as steps of a
Slurm allocation (``--launcher slurm``, :mod:`.slurm`).  Each engine checks
its hosts before anything starts, builds the nodes (every remote one runs
under the same watchdog, :mod:`.watchdog`), and cleans up after every
attempt; :mod:`.launch` calls these three through this module."""
import argparse
from typing import Callable, List, Mapping, Optional, Tuple, Union

from mxnet_cpsgd.cluster import slurm, ssh
from mxnet_cpsgd.cluster.nodes import LaunchError, Node
from mxnet_cpsgd.cluster.remote_nodes import build_host_nodes, prepare_cluster, sweep_hosts

#: a multi-host job's engine: a host file over ssh, or a Slurm allocation
Cluster = Union[ssh.Cluster, slurm.SlurmCluster]
LAUNCHERS = ("local", "ssh", "slurm")


def prepare(cluster: Cluster, port: Optional[int], launch_id: str, first: bool,
            timeout: float) -> Tuple[str, int]:
    """Check the hosts; the scheduler's address and port.  Raises ssh.HostError."""
    if isinstance(cluster, slurm.SlurmCluster):
        return slurm.prepare(cluster, port, launch_id, timeout=max(30.0, timeout))
    return prepare_cluster(cluster, port, copy=first)


def build(cluster: Cluster, command: List[str], num_workers: int, num_servers: int,
          env: Mapping[str, str], port: int, root_uri: str, launch_id: str,
          heartbeat: float) -> Tuple[List[Node], str]:
    """The job's nodes, and where they run (for the start line)."""
    if isinstance(cluster, slurm.SlurmCluster):
        return (slurm.build_nodes(command, num_workers, num_servers, env, port, cluster,
                                  root_uri, launch_id, heartbeat),
                slurm.describe(cluster, root_uri))
    return (build_host_nodes(command, num_workers, num_servers, env, port, cluster,
                             root_uri, launch_id, heartbeat=heartbeat),
            "hosts %s (scheduler on %s)" % (", ".join(str(h) for h in cluster.hosts),
                                            root_uri))


def cleanup_reserve(cluster: Cluster, timeout: float) -> float:
    """Seconds of the teardown bound kept for :func:`cleanup`."""
    if isinstance(cluster, slurm.SlurmCluster):
        return min(10.0, timeout * 0.3)
    return min(cluster.ssh.connect_timeout + 5, timeout * 0.3)


def cleanup(cluster: Cluster, launch_id: str, deadline: float,
            message: Callable[[str], None]) -> Optional[str]:
    """Remove what is left of the attempt on the hosts (ssh: kill its processes;
    Slurm: cancel its steps); a failure line when that could not be confirmed."""
    if isinstance(cluster, slurm.SlurmCluster):
        return slurm.cancel_steps(cluster, launch_id, deadline, message)
    return sweep_hosts(cluster, launch_id, deadline, message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None,
                        help="where the nodes run: local (this machine; the default "
                             "without -H), ssh (the hosts of -H; the default with -H), "
                             "slurm (inside a Slurm allocation: its nodes, each node a "
                             "job step started with srun)")
    parser.add_argument("--srun-option", action="append", default=[], metavar="OPTION",
                        help="with --launcher slurm: one more option for every srun "
                             "(repeatable, e.g. --srun-option=--mpi=none)")


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
