"""Running a job's nodes: start them, copy their output, watch them, tear
them down.

:class:`Output` prints every node's lines with its name in front (and keeps
the workers' progress reports out of sight); :class:`Job` starts the nodes,
ends the job as soon as one fails (or stalls, see :mod:`.stall`) and stops
every process group within the teardown bound.
"""
import atexit
import os
import re
import signal
import socket
import subprocess
import threading
import time
from typing import IO, Callable, List, Optional, Set, Tuple

from kvstore_ext import progress
from mxnet_cpsgd.cluster import ssh
from mxnet_cpsgd.cluster.nodes import TERM_GRACE_S, Node, parent_death_signal
from mxnet_cpsgd.cluster.stall import STOPPED, StallWatch, process_state

_POLL_S = 0.02
#: how long servers/scheduler may take to exit after the last worker
_SHUTDOWN_WAIT_S = 5.0
#: a server or scheduler exiting cleanly at the very end may beat the last
#: worker's own exit (ps-lite finalizes before the worker's interpreter shuts
#: down, which took over 3 s once on a loaded machine); a clean exit of a server
#: happens only after every worker finalized, so waiting longer costs nothing
#: but the delay before an odd ending is reported (a crash is reported at once)
_PS_EXIT_GRACE_S = 10.0
#: an all-reduce job: when a worker fails, how long to wait for a peer killed
#: by a signal (its exit may arrive later through ssh or srun), which is then
#: named instead: the others fail within moments of losing it, as Gloo's
#: connections to it break
_PEER_SETTLE_S = 3.0
MESSAGE_PREFIX = "cpsgd-launch: "
#: how a Python traceback starts, and its closing "module.Error: message" line
_TRACEBACK_START = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")
_EXCEPTION_MAX_CHARS = 300
#: the message of a C++ exception that ended a process (std::terminate prints
#: "  what():  [12:00:00] file.cc:520: Check failed: ..."), without the time
_FATAL_LINE = re.compile(r"^\s*what\(\):\s+(?:\[[\d:]+\] )?(.*\S)\s*$")
#: how long to wait for the rest of a failed node's output (its exception line)
_READER_JOIN_S = 2.0

# Jobs with processes that may still run, for the atexit cleanup.
_LIVE_JOBS: Set["Job"] = set()
_LIVE_LOCK = threading.Lock()


class Output:
    """Serializes prefixed lines to the stream, the collected output and logs."""

    def __init__(self, stream: Optional[IO[str]], log_dir: Optional[str]) -> None:
        self._stream = stream
        self._log_dir = log_dir
        self._lock = threading.Lock()
        self.lines: List[str] = []
        self._opened: Set[str] = set()
        self._launcher_log = self._open("launcher.log")

    def _open(self, name: str) -> Optional[IO[str]]:
        """A log file, new at the first attempt, appended to after a restart."""
        if self._log_dir is None:
            return None
        mode = "a" if name in self._opened else "w"
        self._opened.add(name)
        return open(os.path.join(self._log_dir, name), mode, encoding="utf-8")

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
        self.emit(MESSAGE_PREFIX + text, self._launcher_log)

    def reader(self, node: Node) -> threading.Thread:
        """A started thread copying the node's stdout, line by line."""
        log = self._open(node.file_name)
        prefix = "[%s] " % node.name

        def copy() -> None:
            in_traceback = False
            try:
                for raw in iter(node.proc.stdout.readline, b""):
                    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    text = self._take_report(node, text)
                    if text is None:
                        continue
                    fatal = _FATAL_LINE.match(text)
                    if fatal:
                        node.fatal = fatal.group(1)
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

    @staticmethod
    def _take_report(node: Node, text: str) -> Optional[str]:
        """Record a progress report in ``text`` (kvstore_ext/progress.py) on the
        node; returns what is left to print (None: nothing).  A report may
        follow a partial line of the node's stdout (both streams share a pipe)."""
        at = text.find(progress.PREFIX)
        if at < 0:
            return text
        report = progress.parse(text[at:])
        if report is None:
            return text
        now = time.monotonic()
        if report.phase == "train" and node.last_report is not None \
                and node.last_report.phase == "train":
            node.longest_train_gap = max(node.longest_train_gap, now - node.last_report_at)
        node.last_report, node.last_report_at = report, now
        node.last_report_inferred = progress.inferred(text)
        return text[:at] or None

    def stderr_printer(self, node: Node) -> Callable[[str], None]:
        """For a remote node: prints what ssh itself says, with the prefix."""
        prefix = "[%s] " % node.name
        return lambda text: self.emit(prefix + text)

    def close(self) -> None:
        if self._launcher_log is not None:
            self._launcher_log.close()


def _pass_niceness(pid: int) -> None:
    """Give a node's session the launcher's niceness.

    Every node runs in a session of its own, and where the kernel groups
    scheduling by session (sched_autogroup, on by default in many
    distributions) a process's niceness only counts within its group: without
    this, ``nice cpsgd-launch ...`` would lower nothing against other jobs.
    Best effort: nothing happens where the launcher is not niced or the kernel
    has no autogroups.
    """
    niceness = os.nice(0)
    if niceness <= 0:
        return
    try:
        with open("/proc/%d/autogroup" % pid, "w") as f:
            f.write(str(niceness))
    except OSError:
        pass


class Job:
    """Runs the nodes of one job and tears them down."""

    def __init__(self, nodes: List[Node], output: Output, timeout: float,
                 job_timeout: Optional[float], stall_timeout: Optional[float] = None,
                 deadline: Optional[float] = None,
                 connect_timeout: Optional[float] = None) -> None:
        self.nodes = nodes
        self.out = output
        self.timeout = timeout
        self.job_timeout = job_timeout
        #: when ``job_timeout`` expires (time.monotonic; default: from monitor()'s start)
        self.deadline = deadline
        self.timed_out = False
        #: seconds without progress that make a node stalled (None: not watched)
        self.stall_timeout = stall_timeout
        #: seconds the workers may wait in mx.kv.create (None: no limit)
        self.connect_timeout = connect_timeout
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
        preexec = parent_death_signal()
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
            _pass_niceness(node.proc.pid)
            if node.serves is not None:
                self._wait_serving(node)
        announce()
        for node in self.nodes:
            node.reader = self.out.reader(node)
            if isinstance(node.proc, ssh.RemoteProcess):
                node.proc.start_reader()

    def _wait_serving(self, node: Node) -> None:
        """Wait (at most ``timeout`` s) until ``node`` accepts connections at
        ``node.serves``, or exits; the monitor reports an exit, and the nodes
        started next say themselves what they could not reach."""
        deadline = time.monotonic() + self.timeout
        while node.proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(node.serves, timeout=1.0).close()
                return
            except OSError:
                time.sleep(0.05)

    def _poll(self, node: Node) -> bool:
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
        deadline = self.deadline
        if deadline is None and self.job_timeout is not None:
            deadline = time.monotonic() + self.job_timeout
        stall = (StallWatch(self.nodes, self.stall_timeout, self.connect_timeout)
                 if self.stall_timeout else None)
        workers = [n for n in self.nodes if n.role == "worker"]
        others = [n for n in self.nodes if n.role != "worker"]
        ps_exit_seen: Optional[float] = None
        first_ps_exit: Optional[Node] = None
        while True:
            if self.signal_received is not None:
                name = signal.Signals(self.signal_received).name
                return 128 + self.signal_received, "received %s; stopping the job" % name
            if deadline is not None and time.monotonic() > deadline:
                self.timed_out = True
                return 1, "job timeout of %g s expired; stopping the job" % self.job_timeout
            for node in self.nodes:
                if self._poll(node) and node.returncode != 0:
                    node, stopped = self._first_cause(node)
                    if stopped is not None:
                        return 1, "%s is stopped (state T) while %s %s; stopping the job" % (
                            stopped.name, node.name, node.describe())
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
            stalled = stall.check() if stall is not None else None
            if stalled is not None:
                return 1, stalled
            self.wakeup.wait(_POLL_S)

    def _first_cause(self, failed: Node) -> Tuple[Node, Optional[Node]]:
        """The node to name for a failure first seen at ``failed``, and a
        stopped worker (state T) to name before it, if any.  Only in an
        all-reduce job, whose workers fail when a peer dies (at once) or stops
        (after Gloo's timeout): a worker killed by a signal (not an abort)
        seen within :data:`_PEER_SETTLE_S` is named instead of ``failed``."""
        def killed(node: Node) -> bool:
            return node.returncode is not None and node.returncode < 0 \
                and node.returncode != -signal.SIGABRT
        if killed(failed) or not any(n.role == "rendezvous" for n in self.nodes):
            return failed, None
        end = time.monotonic() + _PEER_SETTLE_S
        while self.signal_received is None:
            for node in self.nodes:
                if node.role == "worker" and self._poll(node) and killed(node):
                    return node, None
            if time.monotonic() >= end:
                break
            self.wakeup.wait(_POLL_S * 5)
        stopped = [n for n in self.nodes if n.role == "worker" and not self._poll(n)
                   and process_state(n)[0] == STOPPED]
        return failed, (stopped[0] if stopped else None)

    @staticmethod
    def _raised(node: Node) -> str:
        """`` after raising ValueError: ...`` if the node exited with an error
        code after printing a traceback; `` after a fatal error: ...`` if it
        aborted after a C++ exception (ps-lite's failed checks)."""
        aborted = node.returncode == -signal.SIGABRT
        if node.returncode is None or (node.returncode <= 0 and not aborted):
            return ""
        if node.reader is not None:
            node.reader.join(_READER_JOIN_S)  # the last lines may still be in the pipe
        text = node.fatal if aborted else node.exception
        if text is None:
            return ""
        if len(text) > _EXCEPTION_MAX_CHARS:
            text = text[:_EXCEPTION_MAX_CHARS - 3] + "..."
        return (" after a fatal error: %s" if aborted else " after raising %s") % text

    def _finish(self, others: List[Node]) -> Tuple[int, Optional[str]]:
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

    def teardown(self, reserve: float = 0.0) -> List[Node]:
        """Stop every process group by ``timeout`` seconds after the end was
        noticed, less ``reserve`` (time kept for removing an emulated network).

        Returns:
            Nodes whose processes could not be ended in time.
        """
        start = time.monotonic()
        deadline = (self.end_noticed or start) + self.timeout - reserve
        grace_end = min(start + min(TERM_GRACE_S, self.timeout * 0.4), deadline)
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.stopped = True
            node.signal_group(signal.SIGTERM)
            # a stopped (stalled) process acts on SIGTERM only once continued
            node.signal_group(signal.SIGCONT)
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

    def _wait_gone(self, until: float) -> List[Node]:
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


