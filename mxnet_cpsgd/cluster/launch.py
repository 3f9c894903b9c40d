"""Start a ps-lite job (1 scheduler, S servers, M workers) on this machine.

Usage::

    python -m mxnet_cpsgd.launch -n WORKERS -s SERVERS [--timeout SECONDS]
        [--job-timeout SECONDS] [--stall-timeout SECONDS] [--max-restarts N]
        [--port PORT] [--env KEY=VALUE ...]
        [--emulate-network RATE[,DELAY][,QUEUE]] [--log-dir DIR] -- COMMAND ARGS...
    python -m mxnet_cpsgd.launch -H HOSTFILE -n WORKERS [...] -- COMMAND ARGS...
    python -m mxnet_cpsgd.launch --launcher slurm|mpi [...] -- COMMAND ARGS...
    python -m mxnet_cpsgd.launch --allreduce -n WORKERS [...] -- COMMAND ARGS...

Servers and the scheduler run ``python -c "...; import mxnet"`` (importing MXNet
in a process whose DMLC_ROLE is server or scheduler runs that node); workers run
COMMAND.  Every output line is printed with the node's name in front
(``[worker 0] ...``).  The launcher watches every node: the job fails as soon
as any node exits non-zero or by a signal, a server or the scheduler exits
while workers still run, a node stalls (--stall-timeout, see :mod:`.stall`), or
--job-timeout expires; then every process group is stopped (SIGTERM, SIGKILL
after a short grace) within --timeout seconds, and with --max-restarts the job
is started again.

Python API: :func:`run_job`.  See docs/launcher.md.  The parts: nodes on this
machine (:mod:`.local_nodes`), on other hosts over ssh (:mod:`.remote_nodes`,
:mod:`.ssh`), as Slurm job steps (:mod:`.slurm`) or under mpirun (:mod:`.mpi`),
chosen by :mod:`.engines`; running and watching them (:mod:`.supervise`); this
module is :func:`run_job` and the command line's :func:`main` (the options:
:mod:`.launch_options`).
"""
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Dict, List, Mapping, Optional, Sequence, Union

from mxnet_cpsgd.cluster import engines, netem, ssh
from mxnet_cpsgd.cluster.local_nodes import (PLACEMENTS, build_local_nodes,  # noqa: F401
                                             horovod_env, host_of_nodes)
from mxnet_cpsgd.cluster.nodes import (RESERVED_ENV, RESTART_ENV,  # noqa: F401
                                       WORKER_INDEX_ENV, WORKER_SITE_DIR, LaunchError,
                                       describe_exit, free_port)
from mxnet_cpsgd.cluster.launch_options import build_parser
from mxnet_cpsgd.cluster.stall import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_STALL_TIMEOUT_S
from mxnet_cpsgd.cluster.supervise import Job, Output

# the names these functions had before the launcher was split into modules
_horovod_env = horovod_env
_build_nodes = build_local_nodes
_parser = build_parser  # the launcher's parser, now in launch_options.py

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
            the pid of its process (the leader of its process group), of
            the last attempt.
        restarts: how many times the job was started again (``max_restarts``).
    """
    returncode: int
    output: str
    failure: Optional[str]
    pids: Dict[str, int] = field(default_factory=dict)
    restarts: int = 0


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


def _validate(command: List[str], num_workers: int, num_servers: int, timeout: float,
              job_timeout: Optional[float], port: Optional[int],
              env: Mapping[str, str], stall_timeout: Optional[float] = None,
              max_restarts: int = 0, host_wait: float = 0.0,
              connect_timeout: Optional[float] = None) -> None:
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
    if stall_timeout is not None and not stall_timeout >= 0:
        raise LaunchError("stall timeout must be >= 0 seconds (0: off), got %r"
                          % (stall_timeout,))
    if connect_timeout is not None and not connect_timeout >= 0:
        raise LaunchError("connect timeout must be >= 0 seconds (0: no limit), got %r"
                          % (connect_timeout,))
    if not host_wait >= 0:
        raise LaunchError("host wait must be >= 0 seconds, got %r" % (host_wait,))
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise LaunchError("max restarts must be an integer >= 0, got %r" % (max_restarts,))
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError("port must be in 1..65535, got %r" % (port,))
    for key in env:
        if not _ENV_KEY_RE.match(key):
            raise LaunchError("malformed environment variable name %r" % (key,))
    _check_reserved(env)


class _Interrupt:
    """The signal that interrupted :func:`run_job`, passed on to the running attempt."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.job: Optional[Job] = None

    def handler(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self.job is not None:
            self.job.on_signal(signum, frame)


def run_job(command: Union[str, Sequence[str]], num_workers: int, num_servers: int = 1,
            env: Optional[Mapping[str, str]] = None, timeout: float = 60,
            job_timeout: Optional[float] = None, emulate_network: Optional[str] = None,
            log_dir: Optional[str] = None, stream: Optional[IO[str]] = sys.stdout,
            port: Optional[int] = None, handle_signals: bool = True,
            cluster: Optional[engines.Cluster] = None,
            placement: str = "separate", allreduce: bool = False,
            stall_timeout: Optional[float] = DEFAULT_STALL_TIMEOUT_S,
            max_restarts: int = 0, host_wait: float = 0.0,
            connect_timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT_S) -> JobResult:
    """Run one job and wait until it ended and all its processes are gone.

    Args:
        command: the workers' command (a string is split like a shell would).
        num_workers: M >= 1 workers.
        num_servers: S >= 1 servers.
        env: extra environment for every node (overrides the launcher's own
            environment; DMLC_* variables the launcher sets are refused).
        timeout: seconds from noticing the end of the job (failure, signal or
            the last worker's exit) until every process is gone.
        job_timeout: seconds the whole job may run, restarts included, or None
            for no limit.
        emulate_network: ``'RATE[,DELAY][,QUEUE]'`` to run every node in its own
            network namespace with shaped links (root only; QUEUE ``fifo``, the
            default, or ``fair``, see :mod:`mxnet_cpsgd.cluster.netem`), or None.
        log_dir: directory for one log per node (created if needed), or None.
        stream: where lines are printed as they come (None: only collected).
        port: the scheduler's port (default: a free one).
        handle_signals: when called from the main thread, turn SIGINT, SIGTERM
            and SIGHUP into a teardown (returncode 128+N) while the job runs.
        cluster: run on the hosts of this :class:`ssh.Cluster` over ssh (``-H``),
            or on the nodes of this :class:`slurm.SlurmCluster` with srun, or of
            this :class:`mpi.MpiCluster` with mpirun, instead of on this machine.
            Every host is checked first; one that cannot be used ends the job (returncode
            1, ``failure`` naming it) before any node starts.
        placement: with ``emulate_network``, ``'separate'`` (every node on its
            own emulated host) or ``'colocated'`` (one host per worker running
            that worker and one server, the scheduler on host 0); see
            :func:`host_of_nodes`.
        allreduce: a Horovod/Gloo job: no scheduler or servers, a rendezvous
            service on host 0 and the HOROVOD_* variables of horovodrun's Gloo
            launcher for every worker (each worker in its own UTS namespace
            named after its host's address when the network is emulated).
        stall_timeout: seconds without progress that make a node stalled, the
            job failed (see :mod:`.stall`); 0 or None: off.
        max_restarts: after a failure of a started job (a node that died,
            failed or stalled), tear it down and start it again, at most this
            many times, with ``MXNET_CPSGD_RESTART`` = the restart count in
            every node.  Not after --job-timeout, a signal, a host that
            failed its check, or processes that could not be stopped.
        host_wait: with ``max_restarts`` left, a host that cannot be reached
            after a failure (or at the restart's check) is tried again for up
            to this many seconds, its leftover processes killed once it
            answers, before the job is restarted; 0: the job ends at once.
        connect_timeout: seconds the workers may wait in ``mx.kv.create`` for the
            other nodes (with the stall watch on); 0 or None: no limit.

    Returns:
        The :class:`JobResult` (of the last attempt; ``restarts`` says how
        many were made).

    Raises:
        LaunchError: invalid arguments (nothing was started).
        netem.NetemError: network emulation unavailable or bad RATE[,DELAY][,QUEUE].
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    env = dict(env or {})
    _validate(argv, num_workers, num_servers, timeout, job_timeout, port, env,
              stall_timeout, max_restarts, host_wait, connect_timeout)
    if cluster is not None:  # workers within the tasks or slots, before anything starts
        engines.check_capacity(cluster, num_workers)
    spec = netem.parse_spec(emulate_network) if emulate_network else None
    if spec is not None and cluster is not None:
        raise LaunchError("network emulation and a host file exclude each other")
    if spec is not None:
        netem.check_available()
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
    out = Output(stream, log_dir)
    interrupt = _Interrupt()
    old_handlers: Dict[int, object] = {}
    deadline = None if job_timeout is None else time.monotonic() + job_timeout

    def make_attempt(attempt_env: Dict[str, str], first: bool,
                     attempt_host_wait: float) -> "_Attempt":
        return _Attempt(argv, num_workers, num_servers, attempt_env, timeout,
                        job_timeout, deadline, stall_timeout, out, port, cluster,
                        placement, allreduce, spec, emulate_network, interrupt,
                        first=first, host_wait=attempt_host_wait,
                        connect_timeout=connect_timeout)

    try:
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old_handlers[signum] = signal.signal(signum, interrupt.handler)
        return _run_attempts(make_attempt, env, out, interrupt, max_restarts, host_wait)
    finally:
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
        out.close()


def _run_attempts(make_attempt, env: Dict[str, str], out: Output, interrupt: _Interrupt,
                  max_restarts: int, host_wait: float) -> JobResult:
    """Run the job, and after a failure it can restart from, again, at most
    ``max_restarts`` times; the last attempt's result."""
    restarts = 0
    while True:
        attempt_env = dict(env, **({RESTART_ENV: str(restarts)} if restarts else {}))
        attempt = make_attempt(attempt_env, restarts == 0,
                               host_wait if restarts < max_restarts else 0.0)
        result = attempt.run()
        if result.returncode == 0 or not attempt.restartable \
                or interrupt.signum is not None or restarts >= max_restarts:
            break
        restarts += 1
        out.message("restart %d of %d (MXNET_CPSGD_RESTART=%d) after: %s" % (
            restarts, max_restarts, restarts, result.failure))
    if restarts and result.returncode != 0:
        out.message("giving up after %d restart%s" % (restarts, "" if restarts == 1 else "s"))
    result.restarts = restarts
    result.output = "\n".join(out.lines)
    return result


@dataclass
class _Attempt:
    """One start of the job: build and start the nodes, watch them, tear down
    (the arguments are :func:`run_job`'s; ``deadline`` is --job-timeout's end
    over all attempts, ``first`` whether this is the first attempt)."""
    argv: List[str]
    num_workers: int
    num_servers: int
    env: Dict[str, str]
    timeout: float
    job_timeout: Optional[float]
    deadline: Optional[float]
    stall_timeout: Optional[float]
    out: Output
    port: Optional[int]
    cluster: Optional[engines.Cluster]
    placement: str
    allreduce: bool
    spec: Optional[netem.NetworkSpec]
    emulate_network: Optional[str]
    interrupt: _Interrupt
    first: bool
    #: seconds an unreachable host is waited for (0: not); see run_job
    host_wait: float = 0.0
    #: whether a failure of this attempt may be answered by a restart
    restartable: bool = False
    #: seconds the workers may wait in mx.kv.create (None: no limit); see run_job
    connect_timeout: Optional[float] = None

    def run(self) -> JobResult:
        out, cluster, timeout = self.out, self.cluster, self.timeout
        port = self.port
        launch_id = uuid.uuid4().hex[:16]
        if cluster is not None:
            try:
                root_uri, port = engines.prepare(
                    cluster, port, launch_id, self.first, timeout,
                    wait=0.0 if self.first else self.host_wait, message=out.message)
            except ssh.HostError as err:
                out.message(str(err))
                return JobResult(1, "", str(err), {})
        port = port or free_port()
        heartbeat: Optional[ssh.Heartbeat] = None
        network: Optional[netem.EmulatedNetwork] = None
        job = Job([], out, timeout, self.job_timeout, self.stall_timeout or None,
                  deadline=self.deadline, connect_timeout=self.connect_timeout)
        job.signal_received = self.interrupt.signum
        self.interrupt.job = job
        try:
            num_hosts, hosts = host_of_nodes(self.num_workers, self.num_servers,
                                             self.placement, self.allreduce)
            if self.spec is not None:
                network = netem.EmulatedNetwork.from_spec(num_hosts, self.spec)
                network.setup()
            if cluster is not None:
                job.nodes, where = engines.build(cluster, self.argv, self.num_workers,
                                                 self.num_servers, self.env, port,
                                                 root_uri, launch_id, heartbeat=timeout,
                                                 allreduce=self.allreduce)
            else:
                job.nodes = build_local_nodes(self.argv, self.num_workers, self.num_servers,
                                              self.env, port, network,
                                              hosts if network else None, self.allreduce)
                where = "emulated network %s (%s)" % (network.name, self.emulate_network) \
                    if network else "127.0.0.1"
            if job.signal_received is None:  # not interrupted while setting up
                job.start(lambda: out.message("job started on %s, scheduler port %d: %s" % (
                    where, port, ", ".join("%s pid %d" % (n.name, n.proc.pid)
                                           for n in job.nodes))))
                remote = [n.proc for n in job.nodes if isinstance(n.proc, ssh.RemoteProcess)]
                if remote:  # the watchdogs stop their node without it for `timeout` s
                    heartbeat = ssh.Heartbeat(remote, min(5.0, timeout / 6)).start()
            returncode, failure = job.monitor()
            self.restartable = failure is not None and not job.timed_out \
                and job.signal_received is None
            if failure is not None:
                out.message(failure)
            if cluster is not None:
                # keep time for the sweep (ssh: connect + one command per host)
                reserve = engines.cleanup_reserve(cluster, timeout)
            else:
                reserve = min(0.5, timeout * 0.1) if network else 0.0
            left = job.teardown(reserve=reserve)
            if cluster is not None:
                unreached = engines.cleanup(cluster, launch_id, job.end_noticed + timeout,
                                            out.message)
                if unreached and self.restartable and self.host_wait > 0:
                    unreached = engines.wait_for_hosts(cluster, launch_id, self.host_wait,
                                                       unreached, out.message)
                if unreached:
                    self.restartable = False
                    failure = failure or unreached
                    returncode = returncode or 1
            if left:
                note = "could not stop %s within %g s" % (
                    ", ".join("%s (pid %d)" % (n.name, n.proc.pid) for n in left), timeout)
                out.message(note)
                self.restartable = False
                failure = failure or note
                returncode = returncode or 1
            if failure is None:
                out.message("job finished successfully")
            return JobResult(returncode, "", failure,
                             {n.name: n.proc.pid for n in job.nodes if n.proc is not None})
        except BaseException:
            job.kill_now()
            raise
        finally:
            self.interrupt.job = None
            if heartbeat is not None:
                heartbeat.stop()
            if network is not None:
                network.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point (console script ``cpsgd-launch``).

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        The job's exit code (see :class:`JobResult`); 2 for usage errors.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
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
        cluster = engines.cluster_from_args(args)
        result = run_job(command, args.num_workers, args.num_servers, env=env,
                         timeout=args.timeout, job_timeout=args.job_timeout,
                         emulate_network=emulate_network, log_dir=args.log_dir,
                         stream=sys.stdout, port=args.port, cluster=cluster,
                         stall_timeout=args.stall_timeout, max_restarts=args.max_restarts,
                         allreduce=args.allreduce, host_wait=args.host_wait,
                         placement=args.placement, connect_timeout=args.connect_timeout)
    except (LaunchError, netem.NetemError, ssh.HostError) as err:
        parser.error(str(err))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
