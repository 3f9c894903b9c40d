"""Start a ps-lite job (1 scheduler, S servers, M workers) on this machine.

Usage::

    python -m mxnet_cpsgd.launch -n WORKERS -s SERVERS [--timeout SECONDS]
        [--job-timeout SECONDS] [--port PORT] [--env KEY=VALUE ...]
        [--emulate-network RATE[,DELAY][,QUEUE]] [--log-dir DIR] -- COMMAND ARGS...

Servers and the scheduler run ``python -c "import mxnet"`` (importing MXNet in
a process whose DMLC_ROLE is server or scheduler runs that node); workers run
COMMAND.  Every output line is printed with the node's name in front
(``[worker 0] ...``).  The launcher watches every node: the job fails as soon
as any node exits non-zero or by a signal, a server or the scheduler exits
while workers still run, or --job-timeout expires; then every process group is
stopped (SIGTERM, SIGKILL after a short grace) within --timeout seconds.

Python API: :func:`run_job`.  See docs/launcher.md.
"""
import argparse
import atexit
import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import kvstore_ext
from mxnet_cpsgd.cluster import netem, ssh

#: hint for workers: the launcher's index 0..M-1 (ps-lite assigns ranks itself)
WORKER_INDEX_ENV = "MXNET_CPSGD_WORKER_INDEX"
#: variables the launcher sets itself; --env may not override them
RESERVED_ENV = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                "DMLC_NUM_WORKER", "DMLC_NODE_HOST", WORKER_INDEX_ENV)
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POLL_S = 0.02
#: how long servers/scheduler may take to exit after the last worker
_SHUTDOWN_WAIT_S = 5.0
#: a server or scheduler exiting cleanly at the very end may beat the last
#: worker's own exit (ps-lite finalizes before the worker's interpreter shuts
#: down, which took over 3 s once on a loaded machine); a clean exit of a server
#: happens only after every worker finalized, so waiting longer costs nothing
#: but the delay before an odd ending is reported (a crash is reported at once)
_PS_EXIT_GRACE_S = 10.0
#: SIGTERM -> SIGKILL grace, capped at a share of --timeout
_TERM_GRACE_S = 3.0
_MESSAGE_PREFIX = "cpsgd-launch: "
#: how a Python traceback starts, and its closing "module.Error: message" line
_TRACEBACK_START = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")
_EXCEPTION_MAX_CHARS = 300
#: how long to wait for the rest of a failed node's output (its exception line)
_READER_JOIN_S = 2.0
#: put first on the workers' PYTHONPATH: makes a worker that raises exit at once
WORKER_SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(kvstore_ext.__file__)),
                               "worker_site")

# Jobs with processes that may still run, for the atexit cleanup.
_LIVE_JOBS: Set["_Job"] = set()
_LIVE_LOCK = threading.Lock()


class LaunchError(ValueError):
    """Invalid launcher input, detected before anything is started."""


@dataclass
class JobResult:
    """How a job ended.

    Args:
        returncode: 0 on success; the failing worker's exit code, 1 for other
            failures, 128+N when the launcher got signal N.
        output: every printed line (node lines with their prefix and the
            launcher's own ``cpsgd-launch:`` lines), newline-joined.
        failure: one line saying why the job failed, or None on success.
        pids: node name (``'scheduler'``, ``'server 0'``, ``'worker 1'``) to
            the pid of its process (the leader of its process group).
    """
    returncode: int
    output: str
    failure: Optional[str]
    pids: Dict[str, int] = field(default_factory=dict)


def parse_env(items: Sequence[str]) -> Dict[str, str]:
    """Parse ``KEY=VALUE`` strings.

    Args:
        items: e.g. ``['OMP_NUM_THREADS=1', 'A=b=c']`` (the value may hold '=').

    Raises:
        LaunchError: malformed item or a variable the launcher sets itself.
    """
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY_RE.match(key):
            raise LaunchError("malformed --env %r: expected KEY=VALUE with KEY a "
                              "variable name" % item)
        env[key] = value
    _check_reserved(env)
    return env


def _check_reserved(env: Mapping[str, str]) -> None:
    reserved = sorted(set(env) & set(RESERVED_ENV))
    if reserved:
        raise LaunchError("%s %s set by the launcher itself (use -n/-s/--port)"
                          % (", ".join(reserved), "is" if len(reserved) == 1 else "are"))


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def describe_exit(returncode: int) -> str:
    """``'exited with code 3'`` or ``'exited with signal SIGKILL'``.

    Args:
        returncode: a Popen returncode (negative: killed by that signal).
    """
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal %d" % -returncode
        return "exited with signal %s" % name
    return "exited with code %d" % returncode


def _parent_death_signal() -> Optional[Callable[[], None]]:
    """A preexec_fn making the child get SIGKILL when the launcher dies, so
    even a SIGKILLed launcher leaves no direct child behind (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before fork
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    return preexec


@dataclass
class _Node:
    """One process of the job."""
    role: str            # 'scheduler', 'server' or 'worker'
    index: int
    argv: List[str]
    env: Dict[str, str]
    proc: Optional[subprocess.Popen] = None
    returncode: Optional[int] = None   # set once seen exited
    stopped: bool = False              # we signalled it
    reader: Optional[threading.Thread] = None
    #: the last "SomeError: message" line of a traceback the node printed
    exception: Optional[str] = None
    host: Optional[ssh.Host] = None    # remote node: its host (argv is then ssh's)
    remote_command: str = ""           # remote node: the command ssh runs there

    @property
    def name(self) -> str:
        name = self.role if self.role == "scheduler" else "%s %d" % (self.role, self.index)
        return name if self.host is None else "%s on %s" % (name, self.host)

    def describe(self) -> str:
        """How the node exited, e.g. ``'exited with signal SIGKILL'``."""
        lost = self.proc.describe() if isinstance(self.proc, ssh.RemoteProcess) else None
        return lost or describe_exit(self.returncode)

    @property
    def file_name(self) -> str:
        return self.name.replace(" ", "-") + ".log"

    def signal_group(self, signum: int) -> None:
        """Signal the node's whole process group (also after the leader exited,
        to catch descendants it left)."""
        if self.proc is None:
            return
        if isinstance(self.proc, ssh.RemoteProcess):
            self.proc.signal_group(signum)
            return
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def group_gone(self) -> bool:
        """Leader reaped and no other member of its group alive."""
        if self.proc is None:
            return True
        if isinstance(self.proc, ssh.RemoteProcess):
            return self.proc.group_gone()
        if self.proc.poll() is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        return False


class _Output:
    """Serializes prefixed lines to the stream, the collected output and logs."""

    def __init__(self, stream: Optional[IO[str]], log_dir: Optional[str]) -> None:
        self._stream = stream
        self._log_dir = log_dir
        self._lock = threading.Lock()
        self.lines: List[str] = []
        self._launcher_log = self._open("launcher.log")

    def _open(self, name: str) -> Optional[IO[str]]:
        if self._log_dir is None:
            return None
        return open(os.path.join(self._log_dir, name), "w", encoding="utf-8")

    def emit(self, line: str, log: Optional[IO[str]] = None) -> None:
        with self._lock:
            self.lines.append(line)
            if self._stream is not None:
                try:
                    self._stream.write(line + "\n")
                    self._stream.flush()
                except (OSError, ValueError):  # closed pipe: keep collecting
                    pass
            if log is not None:
                log.write(line + "\n")
                log.flush()

    def message(self, text: str) -> None:
        """A launcher line: ``cpsgd-launch: text``."""
        self.emit(_MESSAGE_PREFIX + text, self._launcher_log)

    def reader(self, node: _Node) -> threading.Thread:
        """A started thread copying the node's stdout, line by line."""
        log = self._open(node.file_name)
        prefix = "[%s] " % node.name

        def copy() -> None:
            in_traceback = False
            try:
                for raw in iter(node.proc.stdout.readline, b""):
                    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if text.startswith(_TRACEBACK_START):
                        in_traceback = True
                    elif in_traceback and text and not text[0].isspace():
                        # the first unindented line closes the traceback; MXNet's
                        # errors carry a second (C++) traceback inside the message
                        if _EXCEPTION_LINE.match(text):
                            node.exception = text.strip()
                        in_traceback = text.endswith(_TRACEBACK_START)
                    self.emit(prefix + text)
                    if log is not None:  # only this thread writes this file
                        log.write(text + "\n")
                        log.flush()
            finally:
                node.proc.stdout.close()
                if log is not None:
                    log.close()

        thread = threading.Thread(target=copy, name="cpsgd-launch " + node.name, daemon=True)
        thread.start()
        return thread

    def stderr_printer(self, node: _Node) -> Callable[[str], None]:
        """For a remote node: prints what ssh itself says, with the prefix."""
        prefix = "[%s] " % node.name
        return lambda text: self.emit(prefix + text)

    def close(self) -> None:
        if self._launcher_log is not None:
            self._launcher_log.close()


class _Job:
    """Runs the nodes of one job and tears them down."""

    def __init__(self, nodes: List[_Node], output: _Output, timeout: float,
                 job_timeout: Optional[float]) -> None:
        self.nodes = nodes
        self.out = output
        self.timeout = timeout
        self.job_timeout = job_timeout
        self.signal_received: Optional[int] = None
        self.wakeup = threading.Event()
        #: when monitor() noticed the end (failure, signal, last worker exit)
        self.end_noticed: Optional[float] = None

    def on_signal(self, signum: int, frame) -> None:
        # Only record it: the monitor loop does the teardown (a second signal
        # during teardown changes nothing, the teardown is already bounded).
        if self.signal_received is None:
            self.signal_received = signum
        self.wakeup.set()

    def start(self, announce: Callable[[], None]) -> None:
        """Start every node, call ``announce`` (so its line comes first), then
        start copying output."""
        preexec = _parent_death_signal()
        with _LIVE_LOCK:
            _LIVE_JOBS.add(self)
        # Start every process before any reader thread: forking (and running
        # preexec_fn) while no other thread of ours runs is the safe case.
        for node in self.nodes:
            if node.host is not None:
                node.proc = ssh.RemoteProcess(
                    node.argv, node.remote_command,
                    dict(start_new_session=True, preexec_fn=preexec),
                    self.out.stderr_printer(node))
                continue
            node.proc = subprocess.Popen(
                node.argv, env=node.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec)
        announce()
        for node in self.nodes:
            node.reader = self.out.reader(node)
            if isinstance(node.proc, ssh.RemoteProcess):
                node.proc.start_reader()

    def _poll(self, node: _Node) -> bool:
        """Whether the node has exited (records its returncode)."""
        if node.returncode is None and node.proc is not None:
            node.returncode = node.proc.poll()
        return node.returncode is not None

    def monitor(self) -> Tuple[int, Optional[str]]:
        """Wait for the job to end.  Returns ``(returncode, failure)``."""
        try:
            return self._monitor()
        finally:
            self.end_noticed = self.end_noticed or time.monotonic()

    def _monitor(self) -> Tuple[int, Optional[str]]:
        started = time.monotonic()
        workers = [n for n in self.nodes if n.role == "worker"]
        others = [n for n in self.nodes if n.role != "worker"]
        ps_exit_seen: Optional[float] = None
        first_ps_exit: Optional[_Node] = None
        while True:
            if self.signal_received is not None:
                name = signal.Signals(self.signal_received).name
                return 128 + self.signal_received, "received %s; stopping the job" % name
            if self.job_timeout is not None and time.monotonic() - started > self.job_timeout:
                return 1, "job timeout of %g s expired; stopping the job" % self.job_timeout
            for node in self.nodes:
                if self._poll(node) and node.returncode != 0:
                    code = node.returncode if node.role == "worker" and node.returncode > 0 else 1
                    return code, "%s %s%s; stopping the job" % (
                        node.name, node.describe(), self._raised(node))
            if all(self._poll(n) for n in workers):
                self.end_noticed = time.monotonic()
                return self._finish(others)
            exited = [n for n in others if n.returncode is not None]
            if exited and ps_exit_seen is None:
                ps_exit_seen, first_ps_exit = time.monotonic(), exited[0]
            if ps_exit_seen is not None and time.monotonic() - ps_exit_seen > _PS_EXIT_GRACE_S:
                running = ", ".join(n.name for n in workers if n.returncode is None)
                return 1, ("%s exited while workers were still running (%s); stopping the job"
                           % (first_ps_exit.name, running))
            self.wakeup.wait(_POLL_S)

    @staticmethod
    def _raised(node: _Node) -> str:
        """`` after raising ValueError: ...`` if the node exited with an error
        code after printing a traceback."""
        if node.returncode is None or node.returncode <= 0:
            return ""
        if node.reader is not None:
            node.reader.join(_READER_JOIN_S)  # the last lines may still be in the pipe
        if node.exception is None:
            return ""
        text = node.exception
        if len(text) > _EXCEPTION_MAX_CHARS:
            text = text[:_EXCEPTION_MAX_CHARS - 3] + "..."
        return " after raising %s" % text

    def _finish(self, others: List[_Node]) -> Tuple[int, Optional[str]]:
        """All workers exited 0: give servers/scheduler a moment to exit."""
        deadline = time.monotonic() + min(_SHUTDOWN_WAIT_S, self.timeout / 2)
        # an all-reduce job's rendezvous service serves until it is stopped
        others = [n for n in others if n.role != "rendezvous"]
        while time.monotonic() < deadline and self.signal_received is None:
            if all(self._poll(n) for n in others):
                break
            self.wakeup.wait(_POLL_S)
        if self.signal_received is not None:
            name = signal.Signals(self.signal_received).name
            return 128 + self.signal_received, "received %s; stopping the job" % name
        for node in others:
            if self._poll(node) and node.returncode != 0:
                return 1, "%s %s at shutdown" % (node.name, node.describe())
        return 0, None

    def teardown(self, reserve: float = 0.0) -> List[_Node]:
        """Stop every process group by ``timeout`` seconds after the end was
        noticed, less ``reserve`` (time kept for removing an emulated network).

        Returns:
            Nodes whose processes could not be ended in time.
        """
        start = time.monotonic()
        deadline = (self.end_noticed or start) + self.timeout - reserve
        grace_end = min(start + min(_TERM_GRACE_S, self.timeout * 0.4), deadline)
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.stopped = True
            node.signal_group(signal.SIGTERM)
        self._wait_gone(grace_end)
        for node in self.nodes:
            node.signal_group(signal.SIGKILL)
        left = self._wait_gone(deadline)
        if not left:
            with _LIVE_LOCK:
                _LIVE_JOBS.discard(self)
        # Readers end at EOF once every writer of the pipe is gone; bounded.
        for node in self.nodes:
            if node.reader is not None:
                node.reader.join(max(0.0, min(1.0, deadline - time.monotonic())))
        return left

    def _wait_gone(self, until: float) -> List[_Node]:
        while True:
            left = [n for n in self.nodes if not n.group_gone()]
            if not left or time.monotonic() >= until:
                return left
            time.sleep(_POLL_S)

    def kill_now(self) -> None:
        """SIGKILL every group at once (exceptions, interpreter exit)."""
        for node in self.nodes:
            node.signal_group(signal.SIGKILL)
            if isinstance(node.proc, ssh.RemoteProcess):
                node.proc.kill_local()
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
        with _LIVE_LOCK:
            _LIVE_JOBS.discard(self)


@atexit.register
def _kill_live_jobs() -> None:
    with _LIVE_LOCK:
        jobs = list(_LIVE_JOBS)
    for job in jobs:
        job.kill_now()


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


def _build_nodes(command: List[str], num_workers: int, num_servers: int,
                 env: Mapping[str, str], port: int,
                 network: Optional[netem.EmulatedNetwork],
                 hosts: Optional[List[int]] = None,
                 allreduce: bool = False) -> List[_Node]:
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
    # Defaults a user may override with --env: quiet ps-lite, and unbuffered
    # Python so that lines arrive when printed, not when a buffer fills.
    base.update({"PS_VERBOSE": "0", "PYTHONUNBUFFERED": "1"})
    base.update(env)

    def address(position):
        return network.nodes[hosts[position]].address if network else "127.0.0.1"

    root_uri = address(0)
    worker_hosts = [address(len(roles) - num_workers + i) for i in range(num_workers)]
    nodes = []
    for position, (role, index) in enumerate(roles):
        node_env = dict(base)
        if allreduce:
            node_env.update(_horovod_env(index if role == "worker" else None, worker_hosts,
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
            node_env["PYTHONPATH"] = os.pathsep.join(
                [WORKER_SITE_DIR] + ([node_env["PYTHONPATH"]] if node_env.get("PYTHONPATH")
                                     else []))
            argv = list(command)
            if allreduce and network is not None:
                argv = _UTS_WRAP + [address(position)] + argv
        elif role == "rendezvous":
            argv = [sys.executable, "-m", "mxnet_cpsgd.cluster.rendezvous",
                    "--port", str(port), "--hosts", ",".join(worker_hosts)]
        else:
            argv = [sys.executable, "-c", "import mxnet"]
        if network is not None:
            argv = network.nodes[hosts[position]].wrap(argv)
        nodes.append(_Node(role, index, argv, node_env))
    return nodes


def _build_host_nodes(command: List[str], num_workers: int, num_servers: int,
                      env: Mapping[str, str], port: int, cluster: ssh.Cluster,
                      root_uri: str, job_id: str, heartbeat: float) -> List[_Node]:
    """Nodes of a multi-host job: the scheduler on this machine (or the first
    host), servers then workers round-robin over the hosts (node i of the
    servers-then-workers list on host i % len(hosts), as MXNet's tools/launch.py
    places them); remote nodes run through ssh and the watchdog."""
    hosts = cluster.hosts
    defaults = {"PS_VERBOSE": "0", "PYTHONUNBUFFERED": "1"}
    cwd = cluster.copy_to or os.getcwd()
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
            argv = [cluster.python, "-c", "import mxnet"]
        if host is None:  # the scheduler on the launching machine
            node_env = dict(os.environ)
            node_env.update(defaults)
            node_env.update(env)
            node_env.update(dmlc)
            nodes.append(_Node(role, index, argv, node_env))
            continue
        # remote: only the forwarded part of our environment, passed explicitly
        node_env = ssh.forwarded_env(os.environ)
        node_env.update(defaults)
        node_env.update(env)
        node_env.update(dmlc)
        if role == "worker":  # same path on every host, like the interpreter
            node_env["PYTHONPATH"] = os.pathsep.join(
                [WORKER_SITE_DIR] + ([node_env["PYTHONPATH"]] if node_env.get("PYTHONPATH")
                                     else []))
        remote = ssh.remote_command(cwd, node_env, cluster.python, argv,
                                    grace=_TERM_GRACE_S, heartbeat=heartbeat)
        nodes.append(_Node(role, index, cluster.ssh.argv(host), node_env, host=host,
                           remote_command=remote))
    return nodes


def _prepare_cluster(cluster: ssh.Cluster, port: Optional[int]) -> Tuple[str, int]:
    """Copy the working directory if asked, check every host; returns the
    scheduler's address and port.  Raises ssh.HostError."""
    cluster.python = cluster.python or sys.executable
    if cluster.copy_to:
        ssh.copy_workdir(cluster.hosts, cluster.ssh, os.getcwd(), cluster.copy_to)
    ports = ssh.preflight(cluster.hosts, cluster.ssh, cluster.copy_to or os.getcwd(),
                          cluster.python)
    if cluster.scheduler_on_first_host:
        return cluster.hosts[0].name, port or ports[cluster.hosts[0]]
    return (cluster.scheduler_address or ssh.scheduler_address(cluster.hosts[0]),
            port or free_port())


def _horovod_env(rank: Optional[int], worker_hosts: List[str], rendezvous: str, port: int,
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


def _validate(command: List[str], num_workers: int, num_servers: int, timeout: float,
              job_timeout: Optional[float], port: Optional[int],
              env: Mapping[str, str]) -> None:
    if not command:
        raise LaunchError("no command given for the workers (put it after --)")
    if shutil.which(command[0]) is None:
        raise LaunchError("worker command not found or not executable: %r" % command[0])
    if not isinstance(num_workers, int) or num_workers < 1:
        raise LaunchError("number of workers must be >= 1, got %r" % (num_workers,))
    if not isinstance(num_servers, int) or num_servers < 1:
        raise LaunchError("number of servers must be >= 1, got %r" % (num_servers,))
    if not timeout > 0:
        raise LaunchError("timeout must be > 0 seconds, got %r" % (timeout,))
    if job_timeout is not None and not job_timeout > 0:
        raise LaunchError("job timeout must be > 0 seconds, got %r" % (job_timeout,))
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError("port must be in 1..65535, got %r" % (port,))
    for key in env:
        if not _ENV_KEY_RE.match(key):
            raise LaunchError("malformed environment variable name %r" % (key,))
    _check_reserved(env)


def run_job(command: Union[str, Sequence[str]], num_workers: int, num_servers: int = 1,
            env: Optional[Mapping[str, str]] = None, timeout: float = 60,
            job_timeout: Optional[float] = None, emulate_network: Optional[str] = None,
            log_dir: Optional[str] = None, stream: Optional[IO[str]] = sys.stdout,
            port: Optional[int] = None, handle_signals: bool = True,
            cluster: Optional[ssh.Cluster] = None,
            placement: str = "separate", allreduce: bool = False) -> JobResult:
    """Run one job and wait until it ended and all its processes are gone.

    Args:
        command: the workers' command (a string is split like a shell would).
        num_workers: M >= 1 workers.
        num_servers: S >= 1 servers.
        env: extra environment for every node (overrides the launcher's own
            environment; DMLC_* variables the launcher sets are refused).
        timeout: seconds from noticing the end of the job (failure, signal or
            the last worker's exit) until every process is gone.
        job_timeout: seconds the whole job may run, or None for no limit.
        emulate_network: ``'RATE[,DELAY][,QUEUE]'`` to run every node in its own
            network namespace with shaped links (root only; QUEUE ``fifo``, the
            default, or ``fair``, see :mod:`mxnet_cpsgd.cluster.netem`), or None.
        log_dir: directory for one log per node (created if needed), or None.
        stream: where lines are printed as they come (None: only collected).
        port: the scheduler's port (default: a free one).
        handle_signals: when called from the main thread, turn SIGINT, SIGTERM
            and SIGHUP into a teardown (returncode 128+N) while the job runs.
        cluster: run on the hosts of this :class:`ssh.Cluster` over ssh
            (``-H HOSTFILE``) instead of on this machine.  Every host is
            checked first; one that cannot be used ends the job (returncode
            1, ``failure`` naming it) before any node starts.
        placement: with ``emulate_network``, ``'separate'`` (every node on its
            own emulated host) or ``'colocated'`` (one host per worker running
            that worker and one server, the scheduler on host 0); see
            :func:`host_of_nodes`.
        allreduce: a Horovod/Gloo job: no scheduler or servers, a rendezvous
            service on host 0 and the HOROVOD_* variables of horovodrun's Gloo
            launcher for every worker (each worker in its own UTS namespace
            named after its host's address when the network is emulated).

    Returns:
        The :class:`JobResult`.

    Raises:
        LaunchError: invalid arguments (nothing was started).
        netem.NetemError: network emulation unavailable or bad RATE[,DELAY][,QUEUE].
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    env = dict(env or {})
    _validate(argv, num_workers, num_servers, timeout, job_timeout, port, env)
    spec = netem.parse_spec(emulate_network) if emulate_network else None
    if spec is not None and cluster is not None:
        raise LaunchError("network emulation and a host file exclude each other")
    if spec is not None:
        netem.check_available()
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
    out = _Output(stream, log_dir)
    if cluster is not None:
        try:
            root_uri, port = _prepare_cluster(cluster, port)
        except ssh.HostError as err:
            out.message(str(err))
            out.close()
            return JobResult(1, "\n".join(out.lines), str(err), {})
    port = port or free_port()
    heartbeat: Optional[ssh.Heartbeat] = None
    job: Optional[_Job] = None
    network: Optional[netem.EmulatedNetwork] = None
    old_handlers: Dict[int, object] = {}
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    try:
        job = _Job([], out, timeout, job_timeout)
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in signals:
                old_handlers[signum] = signal.signal(signum, job.on_signal)
        num_hosts, hosts = host_of_nodes(num_workers, num_servers, placement, allreduce)
        if spec is not None:
            network = netem.EmulatedNetwork.from_spec(num_hosts, spec)
            network.setup()
        if cluster is not None:
            job_id = uuid.uuid4().hex[:16]
            job.nodes = _build_host_nodes(argv, num_workers, num_servers, env, port, cluster,
                                          root_uri, job_id, heartbeat=timeout)
            where = "hosts %s (scheduler on %s)" % (
                ", ".join(str(h) for h in cluster.hosts), root_uri)
        else:
            job.nodes = _build_nodes(argv, num_workers, num_servers, env, port, network,
                                     hosts if network else None, allreduce)
            where = "emulated network %s (%s)" % (network.name, emulate_network) \
                if network else "127.0.0.1"
        if job.signal_received is None:  # not interrupted while setting up
            job.start(lambda: out.message("job started on %s, scheduler port %d: %s" % (
                where, port, ", ".join("%s pid %d" % (n.name, n.proc.pid) for n in job.nodes))))
            remote = [n.proc for n in job.nodes if isinstance(n.proc, ssh.RemoteProcess)]
            if remote:  # the watchdogs stop their node without it for `timeout` s
                heartbeat = ssh.Heartbeat(remote, min(5.0, timeout / 6)).start()
        returncode, failure = job.monitor()
        if failure is not None:
            out.message(failure)
        if cluster is not None:
            # keep time for the sweep over ssh (connect + one command per host)
            reserve = min(cluster.ssh.connect_timeout + 5, timeout * 0.3)
        else:
            reserve = min(0.5, timeout * 0.1) if network else 0.0
        left = job.teardown(reserve=reserve)
        if cluster is not None:
            unreached = _sweep(cluster, job_id, job.end_noticed + timeout, out)
            if unreached:
                failure = failure or unreached
                returncode = returncode or 1
        if left:
            note = "could not stop %s within %g s" % (
                ", ".join("%s (pid %d)" % (n.name, n.proc.pid) for n in left), timeout)
            out.message(note)
            failure = failure or note
            returncode = returncode or 1
        if failure is None:
            out.message("job finished successfully")
        return JobResult(returncode, "\n".join(out.lines), failure,
                         {n.name: n.proc.pid for n in job.nodes if n.proc is not None})
    except BaseException:
        if job is not None:
            job.kill_now()
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        try:
            if network is not None:
                network.close()
        finally:
            for signum, handler in old_handlers.items():
                signal.signal(signum, handler)
            out.close()


def _sweep(cluster: ssh.Cluster, job_id: str, deadline: float, out: _Output) -> Optional[str]:
    """Kill whatever of the job is left on any host (ssh.sweep); reports what
    it found.  Returns a failure line when a host could not be checked."""
    found = ssh.sweep(cluster.hosts, cluster.ssh, job_id,
                      timeout=max(1.0, deadline - time.monotonic()))
    unreached = [str(h) for h, count in found.items() if count is None]
    for host, count in found.items():
        if count:
            out.message("killed %d process%s of the job left on %s" % (
                count, "" if count == 1 else "es", host))
    if unreached:
        note = "could not check %s for processes left of the job" % ", ".join(unreached)
        out.message(note)
        return note
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cpsgd-launch",
        usage="%(prog)s -n WORKERS -s SERVERS [options] -- COMMAND ARGS...",
        description="Start a ps-lite job (1 scheduler, S servers running "
                    "'import mxnet', M workers running COMMAND) on this machine, "
                    "print every node's output prefixed with its name, and stop "
                    "everything when any node fails.")
    parser.add_argument("-n", "--num-workers", type=int, required=True, help="workers (>= 1)")
    parser.add_argument("-s", "--num-servers", type=int, default=None,
                        help="servers (>= 1; with -H default one per host)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds from the end or failure of the job until every "
                             "process must be gone (default 60)")
    parser.add_argument("--job-timeout", type=float, default=None,
                        help="seconds the whole job may run (default: no limit)")
    parser.add_argument("--port", type=int, default=None,
                        help="scheduler port (default: a free one)")
    parser.add_argument("--env", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                        help="environment for every node (repeatable)")
    parser.add_argument("--emulate-network", metavar="RATE[,DELAY][,QUEUE]", default=None,
                        help="run each node in its own network namespace with links "
                             "shaped to RATE (e.g. 100mbit) and optional one-way DELAY "
                             "(e.g. 0.2ms; needs netem in the kernel); QUEUE fifo "
                             "(default: one FIFO per link direction) or fair (the TCP "
                             "flows of a link share its rate; not with DELAY); root only")
    parser.add_argument("--time-scale", metavar="D", default=None,
                        help="time dilation of --emulate-network: rates divided by D, "
                             "delays multiplied by D (D >= 1, default 1).  Only the network "
                             "is dilated: slow the workers' compute down by D yourself "
                             "(e.g. an emulated compute time x D) and divide the times you "
                             "measure by D (cpsgd-bench --time-scale does all of this)")
    parser.add_argument("--log-dir", default=None, help="also write one log file per node here")
    hosts = parser.add_argument_group(
        "several machines (over ssh)",
        "The working directory (or --copy-workdir's) and the interpreter must be the same "
        "path on every host.  See docs/launcher.md.")
    hosts.add_argument("-H", "--hostfile", default=None,
                       help="run the nodes on these hosts: one host[:port] per line; "
                            "servers, then workers, round-robin")
    hosts.add_argument("--ssh-user", default=None, help="ssh login name (ssh -l)")
    hosts.add_argument("--ssh-identity", default=None, help="ssh private key (ssh -i)")
    hosts.add_argument("--ssh-config", default=None, help="ssh configuration file (ssh -F)")
    hosts.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                       help="ssh -o option (repeatable; overrides the launcher's defaults)")
    hosts.add_argument("--ssh-connect-timeout", type=float, default=10.0,
                       help="seconds for ssh to connect (default 10)")
    hosts.add_argument("--scheduler-on-first-host", action="store_true",
                       help="run the scheduler on the first host instead of here")
    hosts.add_argument("--scheduler-address", default=None,
                       help="this machine's address that every host reaches (default: "
                            "its address on the route to the first host)")
    hosts.add_argument("--python", default=None,
                       help="interpreter for servers, scheduler and the remote watchdog, "
                            "the same path on every host (default: this one)")
    hosts.add_argument("--copy-workdir", default=None, metavar="DIR",
                       help="copy the current directory to DIR on every host first "
                            "(tar over ssh) and run there")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point (console script ``cpsgd-launch``).

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        The job's exit code (see :class:`JobResult`); 2 for usage errors.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1:]
    else:
        options, command = argv, []
    args = parser.parse_args(options)
    try:
        emulate_network = args.emulate_network
        if args.time_scale is not None:
            if emulate_network is None:
                raise LaunchError("--time-scale dilates the emulated network: give "
                                  "--emulate-network too")
            emulate_network = netem.dilate_spec(emulate_network, args.time_scale)
            print("cpsgd-launch: time dilation x%g: links emulated as %s; the workers' "
                  "compute is not slowed down by the launcher"
                  % (netem.parse_time_scale(args.time_scale), emulate_network),
                  file=sys.stderr)
        env = parse_env([item for group in args.env for item in group])
        cluster = None
        if args.hostfile is not None:
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
        elif args.num_servers is None:
            raise LaunchError("-s/--num-servers is required (without -H)")
        result = run_job(command, args.num_workers, args.num_servers, env=env,
                         timeout=args.timeout, job_timeout=args.job_timeout,
                         emulate_network=emulate_network, log_dir=args.log_dir,
                         stream=sys.stdout, port=args.port, cluster=cluster)
    except (LaunchError, netem.NetemError, ssh.HostError) as err:
        parser.error(str(err))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
