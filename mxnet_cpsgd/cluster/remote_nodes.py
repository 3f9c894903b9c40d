"""Nodes of a multi-host job (``cpsgd-launch -H``): built to run over ssh
under :mod:`.ssh`'s watchdog, the hosts checked before, and swept after."""
import os
import sys
import time
from typing import Callable, List, Mapping, Optional, Tuple

from mxnet_cpsgd.cluster import ssh
from mxnet_cpsgd.cluster.allreduce_nodes import build_allreduce_nodes
from mxnet_cpsgd.cluster.nodes import (NODE_DEFAULTS, PS_NODE_CODE, TERM_GRACE_S,
                                       WORKER_DEFAULTS, WORKER_INDEX_ENV, Node, free_port,
                                       with_worker_site)


def build_host_nodes(command: List[str], num_workers: int, num_servers: int,
                     env: Mapping[str, str], port: int, cluster: ssh.Cluster,
                     root_uri: str, job_id: str, heartbeat: float,
                     allreduce: bool = False) -> List[Node]:
    """Nodes of a multi-host job: the scheduler on this machine (or the first
    host), servers then workers round-robin over the hosts (node i of the
    servers-then-workers list on host i % len(hosts), as MXNet's tools/launch.py
    places them); remote nodes run through ssh and the watchdog.  With
    ``allreduce``: the rendezvous service here and worker i on host
    i % len(hosts) (:mod:`.allreduce_nodes`).  Where lines state ``slots=N``,
    "the hosts" are their slots (:func:`ssh.slot_hosts`)."""
    hosts = ssh.slot_hosts(cluster.hosts)
    cwd = cluster.copy_to or os.getcwd()
    if allreduce:
        def launch_on(index, name):
            host = hosts[index % len(hosts)]
            return cluster.ssh.argv(host), host
        return build_allreduce_nodes(command, num_workers, env, port, root_uri, job_id,
                                     cluster.python, [h.name for h in hosts], cwd,
                                     heartbeat, launch_on)
    roles = [("scheduler", 0)] + [("server", i) for i in range(num_servers)] \
        + [("worker", i) for i in range(num_workers)]
    nodes = []
    for role, index in roles:
        if role == "scheduler":
            host = hosts[0] if cluster.scheduler_on_first_host else None
        else:
            position = index if role == "server" else num_servers + index
            host = hosts[position % len(hosts)]
        dmlc = {
            "DMLC_ROLE": role,
            "DMLC_PS_ROOT_URI": root_uri,
            "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(num_servers),
            "DMLC_NUM_WORKER": str(num_workers),
            "DMLC_NODE_HOST": root_uri if host is None else host.name,
            ssh.JOB_ID_ENV: job_id,
        }
        if role == "worker":
            dmlc[WORKER_INDEX_ENV] = str(index)
            argv = list(command)
        else:
            argv = [cluster.python, "-c", PS_NODE_CODE]
        if host is None:  # the scheduler on the launching machine
            node_env = dict(os.environ)
            node_env.update(NODE_DEFAULTS)
            node_env.update(env)
            node_env.update(dmlc)
            nodes.append(Node(role, index, argv, node_env))
            continue
        # remote: only the forwarded part of our environment, passed explicitly
        node_env = ssh.forwarded_env(os.environ)
        node_env.update(NODE_DEFAULTS)
        if role == "worker":
            node_env.update(WORKER_DEFAULTS)
        node_env.update(env)
        node_env.update(dmlc)
        if role == "worker":  # same path on every host, like the interpreter
            with_worker_site(node_env)
        remote = ssh.remote_command(cwd, node_env, cluster.python, argv,
                                    grace=TERM_GRACE_S, heartbeat=heartbeat)
        nodes.append(Node(role, index, cluster.ssh.argv(host), node_env, host=host,
                          remote_command=remote))
    return nodes


def prepare_cluster(cluster: ssh.Cluster, port: Optional[int],
                    copy: bool = True) -> Tuple[str, int]:
    """Copy the working directory if asked (and ``copy``: not again on a
    restart, which would put back older files over the job's checkpoints),
    check every host; returns the scheduler's address and port.  Raises
    ssh.HostError."""
    cluster.python = cluster.python or sys.executable
    if cluster.copy_to and copy:
        ssh.copy_workdir(cluster.hosts, cluster.ssh, os.getcwd(), cluster.copy_to)
    ports = ssh.preflight(cluster.hosts, cluster.ssh, cluster.copy_to or os.getcwd(),
                          cluster.python)
    if cluster.scheduler_on_first_host:
        return cluster.hosts[0].name, port or ports[cluster.hosts[0]]
    return (cluster.scheduler_address or ssh.scheduler_address(cluster.hosts[0]),
            port or free_port())




def sweep_hosts(cluster: ssh.Cluster, job_id: str, deadline: float,
                message: Callable[[str], None]) -> Optional[str]:
    """Kill whatever of the job is left on any host (ssh.sweep); reports what
    it found through ``message``.  Returns a failure line when a host could
    not be checked."""
    found = ssh.sweep(cluster.hosts, cluster.ssh, job_id,
                      timeout=max(1.0, deadline - time.monotonic()))
    unreached = [str(h) for h, count in found.items() if count is None]
    for host, count in found.items():
        if count:
            message("killed %d process%s of the job left on %s" % (
                count, "" if count == 1 else "es", host))
    if unreached:
        note = "could not check %s for processes left of the job" % ", ".join(unreached)
        message(note)
        return note
    return None


