"""Nodes of an all-reduce (Horovod/Gloo) job on several hosts: over ssh
(``-H``, :mod:`.remote_nodes`) or as job steps of a Slurm allocation
(:mod:`.slurm`).

The rendezvous service (:mod:`.rendezvous`) runs on the launching machine,
where the scheduler of a parameter-server job would, listening on the
address the hosts reach it at (only); worker i runs on slot i
(the slots are the hosts taken round robin, as the ps mode places its
workers), under the same watchdog as every remote node, with the HOROVOD_*
variables horovodrun's Gloo launcher sets: ``HOROVOD_HOSTNAME`` is the host's
name in the host file (or the Slurm node name), the local and cross ranks
follow from which slots share a host, and :mod:`.gloo_host` picks the
interface on the host itself.
"""
import os
from collections import Counter
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from mxnet_cpsgd.cluster import ssh
from mxnet_cpsgd.cluster.nodes import (NODE_DEFAULTS, TERM_GRACE_S, WORKER_DEFAULTS,
                                       WORKER_INDEX_ENV, Node, with_worker_site)

#: how to reach worker i's slot: (index, slot name) -> (argv that runs a shell
#: command line there, the host)
SlotLauncher = Callable[[int, str], Tuple[List[str], ssh.Host]]


def slot_ranks(hosts: Sequence[str]) -> List[Tuple[int, int, int, int]]:
    """(local rank, local size, cross rank, cross size) of every rank, given
    the host of each rank.  Cross ranks count, in order of first appearance,
    the hosts that have a slot of the same local rank."""
    sizes = Counter(hosts)
    order = list(dict.fromkeys(hosts))
    seen: Counter = Counter()
    ranks = []
    for host in hosts:
        local = seen[host]
        seen[host] += 1
        peers = [h for h in order if sizes[h] > local]
        ranks.append((local, sizes[host], peers.index(host), len(peers)))
    return ranks


def horovod_rank_env(rank: int, hosts: Sequence[str], rendezvous: str,
                     port: int) -> Dict[str, str]:
    """What horovodrun --gloo sets for rank ``rank`` (``hosts``: each rank's
    host), without the interface (:mod:`.gloo_host` finds it on the host)."""
    local, local_size, cross, cross_size = slot_ranks(hosts)[rank]
    return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_HOSTNAME": hosts[rank], "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": str(len(hosts)), "HOROVOD_LOCAL_RANK": str(local),
            "HOROVOD_LOCAL_SIZE": str(local_size), "HOROVOD_CROSS_RANK": str(cross),
            "HOROVOD_CROSS_SIZE": str(cross_size)}


def build_allreduce_nodes(command: List[str], num_workers: int, env: Mapping[str, str],
                          port: int, root_uri: str, launch_id: str, python: str,
                          slots: Sequence[str], cwd: str, heartbeat: float,
                          launch_on: SlotLauncher) -> List[Node]:
    """The rendezvous service here, then worker i on ``slots[i % len(slots)]``,
    reached through ``launch_on(i, slot)`` and run in ``cwd`` under the
    watchdog (``heartbeat``), as every remote node."""
    hosts = [slots[i % len(slots)] for i in range(num_workers)]
    rendezvous_env = dict(os.environ)
    rendezvous_env.update(NODE_DEFAULTS)
    rendezvous_env.update(env)
    rendezvous = Node("rendezvous", 0,
                      [python, "-m", "mxnet_cpsgd.cluster.rendezvous", "--port", str(port),
                       "--hosts", ",".join(hosts), "--bind", root_uri], rendezvous_env)
    # the workers start once it answers: Horovod's Gloo client gives up after a
    # few refused requests
    rendezvous.serves = (root_uri, port)
    nodes = [rendezvous]
    wrapper = [python, "-m", "mxnet_cpsgd.cluster.gloo_host",
               "--hosts", str(len(set(hosts))), "--"]
    for index, host in enumerate(hosts):
        node_env = ssh.forwarded_env(os.environ)
        node_env.update(NODE_DEFAULTS)
        node_env.update(WORKER_DEFAULTS)
        node_env.update(env)
        node_env.update(horovod_rank_env(index, hosts, root_uri, port))
        node_env[ssh.JOB_ID_ENV] = launch_id
        node_env[WORKER_INDEX_ENV] = str(index)
        with_worker_site(node_env)
        line = ssh.remote_command(cwd, node_env, python, wrapper + list(command),
                                  grace=TERM_GRACE_S, heartbeat=heartbeat)
        argv, where = launch_on(index, host)
        nodes.append(Node("worker", index, argv, node_env, host=where,
                          remote_command=line))
    return nodes
