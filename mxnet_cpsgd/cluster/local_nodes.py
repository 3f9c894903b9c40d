"""Nodes of a job on this machine: on loopback, or each in an emulated host
(a network namespace of :mod:`.netem`), for ps-lite or Horovod/Gloo jobs."""
import os
import sys
from typing import Dict, List, Mapping, Optional, Tuple

from mxnet_cpsgd.cluster import netem
from mxnet_cpsgd.cluster.nodes import (NODE_DEFAULTS, PS_NODE_CODE, WORKER_DEFAULTS,
                                       WORKER_INDEX_ENV, LaunchError, Node,
                                       with_worker_site)

#: placements of a job's nodes on emulated hosts (namespaces)
PLACEMENTS = ("separate", "colocated")


def host_of_nodes(num_workers: int, num_servers: int, placement: str = "separate",
                  allreduce: bool = False) -> Tuple[int, List[int]]:
    """(number of hosts, host index of every node) for a placement.

    Nodes are ordered scheduler (or, for an all-reduce job, the rendezvous
    service), servers 0..S-1 (none for all-reduce), workers 0..M-1.

    * ``separate``: every node on its own host (1 + S + M hosts; an all-reduce
      job: the rendezvous service on host 0, worker i on host 1 + i);
    * ``colocated``: one host per worker, as MXNet's tools/launch.py deploys a
      cluster: worker i and server i on host i (server j on host j mod M), the
      scheduler (or rendezvous service) on host 0.
    """
    if placement not in PLACEMENTS:
        raise LaunchError("placement must be one of %s, got %r" % (", ".join(PLACEMENTS),
                                                                   placement))
    servers = 0 if allreduce else num_servers
    if placement == "separate":
        return 1 + servers + num_workers, list(range(1 + servers + num_workers))
    hosts = [0] + [j % num_workers for j in range(servers)] + list(range(num_workers))
    return num_workers, hosts


#: how an all-reduce worker runs in its emulated host: its own UTS namespace with
#: the host's address as host name (Horovod 0.28.1 opens its Gloo connections to
#: the host *name*, and every namespace shares the machine's name otherwise)
_UTS_WRAP = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"']


def build_local_nodes(command: List[str], num_workers: int, num_servers: int,
                      env: Mapping[str, str], port: int,
                      network: Optional[netem.EmulatedNetwork],
                      hosts: Optional[List[int]] = None,
                      allreduce: bool = False) -> List[Node]:
    """Scheduler, servers, workers with their argv and environment.

    With ``allreduce`` (a Horovod/Gloo job): a rendezvous service
    (``python -m mxnet_cpsgd.cluster.rendezvous``) instead of scheduler and
    servers, and the HOROVOD_* variables horovodrun's Gloo launcher would set.
    """
    if allreduce:
        roles = [("rendezvous", 0)] + [("worker", i) for i in range(num_workers)]
    else:
        roles = [("scheduler", 0)] + [("server", i) for i in range(num_servers)] \
            + [("worker", i) for i in range(num_workers)]
    if hosts is None:
        hosts = list(range(len(roles)))
    base = dict(os.environ)
    base.update(NODE_DEFAULTS)

    def address(position):
        return network.nodes[hosts[position]].address if network else "127.0.0.1"

    root_uri = address(0)
    worker_hosts = [address(len(roles) - num_workers + i) for i in range(num_workers)]
    nodes = []
    for position, (role, index) in enumerate(roles):
        node_env = dict(base)
        if role == "worker":
            node_env.update(WORKER_DEFAULTS)
        node_env.update(env)
        if allreduce:
            node_env.update(horovod_env(index if role == "worker" else None, worker_hosts,
                                         root_uri, port, network is not None))
        else:
            node_env.update({
                "DMLC_ROLE": role,
                "DMLC_PS_ROOT_URI": root_uri,
                "DMLC_PS_ROOT_PORT": str(port),
                "DMLC_NUM_SERVER": str(num_servers),
                "DMLC_NUM_WORKER": str(num_workers),
                "DMLC_NODE_HOST": address(position),
            })
        if role == "worker":
            node_env[WORKER_INDEX_ENV] = str(index)
            with_worker_site(node_env)
            argv = list(command)
            if allreduce and network is not None:
                argv = _UTS_WRAP + [address(position)] + argv
        elif role == "rendezvous":
            argv = [sys.executable, "-m", "mxnet_cpsgd.cluster.rendezvous",
                    "--port", str(port), "--hosts", ",".join(worker_hosts),
                    # on loopback only, unless it has an emulated host of its own
                    "--bind", "0.0.0.0" if network is not None else "127.0.0.1"]
        else:
            argv = [sys.executable, "-c", PS_NODE_CODE]
        if network is not None:
            argv = network.nodes[hosts[position]].wrap(argv)
        node = Node(role, index, argv, node_env)
        if role == "rendezvous" and network is None:
            # Horovod's Gloo client aborts a worker after a few refused requests
            node.serves = ("127.0.0.1", port)
        nodes.append(node)
    return nodes




def horovod_env(rank: Optional[int], worker_hosts: List[str], rendezvous: str, port: int,
                own_hosts: bool) -> Dict[str, str]:
    """HOROVOD_* variables of horovod/runner/gloo_run.py for one worker (slot)."""
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous,
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
           "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
           "HOROVOD_GLOO_IFACE": "eth0" if own_hosts else "lo"}
    if rank is None:
        return env
    size = len(worker_hosts)
    if own_hosts:  # one slot per host: local rank 0, cross rank = rank
        local_rank, local_size, cross_rank, cross_size = 0, 1, rank, size
        hostname = worker_hosts[rank]
    else:          # every slot on one host
        local_rank, local_size, cross_rank, cross_size = rank, size, 0, 1
        hostname = "localhost"
    env.update({"HOROVOD_HOSTNAME": hostname, "HOROVOD_RANK": str(rank),
                "HOROVOD_SIZE": str(size), "HOROVOD_LOCAL_RANK": str(local_rank),
                "HOROVOD_LOCAL_SIZE": str(local_size), "HOROVOD_CROSS_RANK": str(cross_rank),
                "HOROVOD_CROSS_SIZE": str(cross_size)})
    return env


