"""Nodes started by a process starter that carries stdin, stdout and stderr
to a remote task (``srun`` for :mod:`.slurm`, ``mpirun`` for :mod:`.mpi`):
every remote node runs the ssh mode's watchdog (:mod:`.watchdog`) under its
own starter process, so heartbeats, ``TERM``/``KILL``, state reports and
the exit status work as over ssh; the scheduler runs on this machine."""
import os
from typing import Callable, List, Mapping, Sequence

from mxnet_cpsgd.cluster import ssh
from mxnet_cpsgd.cluster.nodes import (NODE_DEFAULTS, PS_NODE_CODE, TERM_GRACE_S,
                                       WORKER_DEFAULTS, WORKER_INDEX_ENV, Node,
                                       with_worker_site)


def build_step_nodes(command: List[str], num_workers: int, num_servers: int,
                     env: Mapping[str, str], port: int, root_uri: str, launch_id: str,
                     heartbeat: float, python: str, slots: Sequence[str],
                     address_of: Callable[[str], str],
                     starter: Callable[[str, str], List[str]]) -> List[Node]:
    """Scheduler here; servers then workers round-robin over ``slots`` (host
    names); ``address_of(host)`` is the address the host's nodes listen on,
    ``starter(host, cwd)`` the argv that runs a command there (the command,
    ``sh -c LINE``, is appended)."""
    cwd = os.getcwd()
    roles = [("scheduler", 0)] + [("server", i) for i in range(num_servers)] \
        + [("worker", i) for i in range(num_workers)]
    nodes = []
    for role, index in roles:
        host = None
        if role != "scheduler":
            position = index if role == "server" else num_servers + index
            host = slots[position % len(slots)]
        dmlc = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": root_uri,
                "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": str(num_servers),
                "DMLC_NUM_WORKER": str(num_workers),
                "DMLC_NODE_HOST": root_uri if host is None else address_of(host),
                ssh.JOB_ID_ENV: launch_id}
        argv = list(command) if role == "worker" else [python, "-c", PS_NODE_CODE]
        if role == "worker":
            dmlc[WORKER_INDEX_ENV] = str(index)
        node_env = dict(os.environ) if host is None else ssh.forwarded_env(os.environ)
        node_env.update(NODE_DEFAULTS)
        if role == "worker":
            node_env.update(WORKER_DEFAULTS)
        node_env.update(env)
        node_env.update(dmlc)
        if host is None:  # the scheduler, on this machine
            nodes.append(Node(role, index, argv, node_env))
            continue
        if role == "worker":
            with_worker_site(node_env)
        line = ssh.remote_command(cwd, node_env, python, argv, grace=TERM_GRACE_S,
                                  heartbeat=heartbeat)
        nodes.append(Node(role, index, starter(host, cwd) + ["sh", "-c"], node_env,
                          host=ssh.Host(host), remote_command=line))
    return nodes
