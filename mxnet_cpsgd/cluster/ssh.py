"""Remote nodes over ssh for ``cpsgd-launch -H HOSTFILE``.

Every remote node is one ``ssh`` client process on the launching machine whose
remote command is a small watchdog (:mod:`.watchdog`, standard library only,
run with the job's interpreter) that

* starts the node's command in a new session (process group) of its own, its
  stdout and stderr going to the ssh channel's stdout;
* reports the command's pid, whether its process is stopped (``T``), in
  uninterruptible sleep (``D``) or neither (``-``) when that changes (sampled
  every 0.25 s, for the launcher's stall detection) and, at the end, its exit
  status on the channel's stderr, as lines starting with :data:`PROTOCOL_MARK`;
* reads the channel's stdin: ``TERM`` / ``KILL`` signal the command's process
  group (the launcher's teardown; ``TERM`` is followed by SIGCONT, so that a
  stopped node acts on it), ``PING`` is a heartbeat;
* when stdin reaches EOF (the ssh session ended: the launcher or its ssh
  client died, the connection was lost, the sshd session process was killed)
  or no line came for ``heartbeat`` seconds (a silent network partition), it
  stops the process group itself: SIGTERM, SIGKILL after ``grace`` seconds.

So a remote node dies with its ssh session, and the launcher can stop it
through the session while the session lives.  As a last resort the launcher's
teardown runs :func:`sweep` on every host: one more ssh connection that
SIGKILLs every process carrying the job's :data:`JOB_ID_ENV` value.

Host file: one ``host`` or ``host:port`` per line (``#`` comments and blank
lines ignored), optionally followed by ``slots=N`` as in MPI host files: how
many workers the host takes (:func:`slot_hosts`).
"""
import inspect
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from mxnet_cpsgd.cluster import ports
from mxnet_cpsgd.cluster.watchdog import PROTOCOL_MARK, WATCHDOG

#: every node of a multi-host job carries this variable with the job's id
JOB_ID_ENV = "CPSGD_LAUNCH_ID"
#: variables of the launcher's environment passed to remote nodes (besides --env)
FORWARD_ENV_PREFIXES = ("MXNET_", "DMLC_", "PS_", "OMP_", "KMP_")
FORWARD_ENV_NAMES = ("PYTHONPATH", "LD_LIBRARY_PATH")


class HostError(ValueError):
    """A host file that cannot be used, or a host that cannot be reached."""


@dataclass(frozen=True)
class Host:
    """One line of a host file."""
    name: str
    port: Optional[int] = None
    #: workers it takes (``slots=N``), or None where the line states none
    slots: Optional[int] = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.name if self.port is None else "%s:%d" % (self.name, self.port)


def parse_hostfile(path: str) -> List[Host]:
    """Hosts of a host file, in order.

    Raises:
        HostError: unreadable file, malformed line, or no host at all.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise HostError("cannot read host file %s: %s" % (path, err.strerror)) from None
    hosts = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"^([A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\])(?::(\d+))?"
                         r"(?:\s+slots=([1-9]\d*))?$", line)
        if not match or (match.group(2) and not 1 <= int(match.group(2)) <= 65535):
            raise HostError("%s line %d: expected host, host:port or either followed by "
                            "slots=N (N >= 1), got %r" % (path, number, raw))
        port = int(match.group(2)) if match.group(2) else None
        slots = int(match.group(3)) if match.group(3) else None
        hosts.append(Host(match.group(1).strip("[]"), port, slots))
    if not hosts:
        raise HostError("host file %s lists no host" % path)
    return hosts


def slot_order(items: Sequence, counts: Sequence[int]) -> List:
    """One entry per slot, the items taken in turn while they have slots
    left: (a, b) with (2, 1) -> a, b, a."""
    slots, round_ = [], 0
    while len(slots) < sum(counts):
        slots += [item for item, count in zip(items, counts) if count > round_]
        round_ += 1
    return slots


def slot_hosts(hosts: Sequence[Host]) -> List[Host]:
    """Where nodes go in turn: the hosts as listed, or, when some line states
    ``slots=N``, one entry per slot in :func:`slot_order` (a line without
    ``slots=`` then counts as one slot)."""
    if not any(h.slots for h in hosts):
        return list(hosts)
    return slot_order(hosts, [h.slots or 1 for h in hosts])


@dataclass
class SshSettings:
    """How to run ssh.

    Args:
        user: login name (``ssh -l``), or None for ssh's default.
        identity: private key file (``ssh -i``), or None.
        config: ssh configuration file (``ssh -F``), or None.
        options: extra ``-o`` options, ``KEY=VALUE``; they take precedence
            over the launcher's defaults.
        connect_timeout: seconds for ssh to connect (ConnectTimeout).
        alive_interval: seconds between ssh keep-alive probes; a connection
            is declared lost after 3 unanswered ones.
        program: the ssh client.
    """
    user: Optional[str] = None
    identity: Optional[str] = None
    config: Optional[str] = None
    options: List[str] = field(default_factory=list)
    connect_timeout: float = 10.0
    alive_interval: float = 10.0
    program: str = "ssh"

    def argv(self, host: Host) -> List[str]:
        """``ssh ... host`` (the remote command still to append)."""
        args = [self.program, "-T"]
        if self.config:
            args += ["-F", self.config]
        if self.user:
            args += ["-l", self.user]
        if self.identity:
            args += ["-i", self.identity]
        if host.port is not None:
            args += ["-p", str(host.port)]
        for option in self.options:  # first value of an option wins in ssh
            args += ["-o", option]
        args += ["-o", "BatchMode=yes",
                 "-o", "ConnectTimeout=%d" % max(1, round(self.connect_timeout)),
                 "-o", "ServerAliveInterval=%d" % max(1, round(self.alive_interval)),
                 "-o", "ServerAliveCountMax=3",
                 "-o", "LogLevel=ERROR"]
        return args + ["--", host.name]


def remote_command(cwd: str, env: Mapping[str, str], python: str, argv: Sequence[str],
                   grace: float, heartbeat: float) -> str:
    """The shell command line a remote node runs (``cd``, ``env``, watchdog)."""
    words = ["env"] + ["%s=%s" % item for item in sorted(env.items())] \
        + [python, "-c", WATCHDOG, "%g" % grace, "%g" % heartbeat] + list(argv)
    return "cd %s && exec %s" % (shlex.quote(cwd), " ".join(shlex.quote(w) for w in words))


def forwarded_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """The variables of ``environ`` that remote nodes get (see the module doc)."""
    return {k: v for k, v in environ.items()
            if k.startswith(FORWARD_ENV_PREFIXES) or k in FORWARD_ENV_NAMES}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run_ssh(settings: SshSettings, host: Host, command: str, timeout: float,
             stdin=None) -> Tuple[int, str, str]:
    """Run one remote command; ``(returncode, stdout, stderr)``; 255 on timeout."""
    try:
        done = subprocess.run(settings.argv(host) + [command], stdin=stdin,
                              capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        return 255, "", "no answer within %g s" % timeout


def _parallel(hosts: Sequence[Host], fn) -> Dict[Host, object]:
    results: Dict[Host, object] = {}
    threads = [threading.Thread(target=lambda h=h: results.__setitem__(h, fn(h)), daemon=True)
               for h in dict.fromkeys(hosts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# the host picks the port as free_port does here (below its ephemeral range, where
# the job's own ps-lite nodes, which bind port 0, cannot be handed it)
_PROBE = (inspect.getsource(ports) +
          "\nimport os\nprint('cpsgd-probe', free_port(''), os.getcwd())\n")


def preflight(hosts: Sequence[Host], settings: SshSettings, cwd: str,
              python: str) -> Dict[Host, int]:
    """Check every host (in parallel): ssh works without prompting, the working
    directory exists and the interpreter runs there.

    Returns:
        host -> a TCP port that was free on it.

    Raises:
        HostError: naming every host that failed and why.
    """
    timeout = settings.connect_timeout + 30
    command = "cd %s && exec %s -c %s" % (shlex.quote(cwd), shlex.quote(python),
                                          shlex.quote(_PROBE))
    results = _parallel(hosts, lambda h: _run_ssh(settings, h, command, timeout,
                                                  stdin=subprocess.DEVNULL))
    ports, errors = {}, []
    for host in dict.fromkeys(hosts):
        code, out, err = results[host]
        words = out.split()
        if code == 0 and len(words) >= 2 and words[0] == "cpsgd-probe":
            ports[host] = int(words[1])
        elif code == 255:
            errors.append("cannot reach %s over ssh: %s" % (host, _last_line(err) or
                                                            "ssh exited with code 255"))
        else:
            errors.append("%s: cannot run %s in %s (exit code %d): %s" % (
                host, python, cwd, code, _last_line(err) or _last_line(out)))
    if errors:
        raise HostError("; ".join(errors) + "; nothing was started")
    return ports


def copy_workdir(hosts: Sequence[Host], settings: SshSettings, source: str,
                 destination: str) -> None:
    """Copy the directory ``source`` to ``destination`` on every host
    (``tar`` over ssh, one host after the other; files are overwritten).

    Raises:
        HostError: a copy failed.
    """
    for host in dict.fromkeys(hosts):
        command = "mkdir -p %s && tar -x -C %s" % (shlex.quote(destination),
                                                   shlex.quote(destination))
        tar = subprocess.Popen(["tar", "-c", "-C", source, "."], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
        try:
            code, out, err = _run_ssh(settings, host, command, timeout=600, stdin=tar.stdout)
        finally:
            tar.stdout.close()
            tar.wait()
        if code != 0:
            raise HostError("copying %s to %s:%s failed (exit code %d): %s; nothing was "
                            "started" % (source, host, destination, code,
                                         _last_line(err) or _last_line(out)))


def sweep(hosts: Sequence[Host], settings: SshSettings, job_id: str,
          timeout: float) -> Dict[Host, Optional[int]]:
    """SIGKILL every process carrying ``JOB_ID_ENV=job_id`` on every host
    (in parallel; the remote user's own processes, found through /proc).

    Returns:
        host -> how many processes were killed there, or None when the host
        could not be reached within ``timeout``.
    """
    script = (
        "n=0; for d in /proc/[0-9]*; do "
        "if tr '\\0' '\\n' < $d/environ 2>/dev/null | grep -qx %s; then "
        "kill -9 ${d#/proc/} 2>/dev/null && n=$((n+1)); fi; done; echo cpsgd-swept $n"
        % shlex.quote("%s=%s" % (JOB_ID_ENV, job_id)))
    command = "sh -c %s" % shlex.quote(script)

    def one(host: Host) -> Optional[int]:
        code, out, _ = _run_ssh(settings, host, command, timeout, stdin=subprocess.DEVNULL)
        match = re.search(r"cpsgd-swept (\d+)", out)
        return int(match.group(1)) if match else None
    return _parallel(hosts, one)


def scheduler_address(host: Host) -> str:
    """This machine's address on the route to ``host`` (no packet is sent).

    Raises:
        HostError: the host name does not resolve or there is no route.
    """
    try:
        family, _, _, _, address = socket.getaddrinfo(host.name, host.port or 22,
                                                      type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(address)  # UDP: a route lookup only
            return sock.getsockname()[0]
    except OSError as err:
        raise HostError("cannot find this machine's address towards %s (%s); give "
                        "--scheduler-address" % (host, err)) from None


class RemoteProcess:
    """A node running on a remote host: the local ssh client and what the
    watchdog reports.  Mimics the parts of ``subprocess.Popen`` the launcher
    uses (``pid`` is the local ssh client's, ``stdout`` the node's output).

    Args:
        ssh_argv: ``ssh ... host`` from :meth:`SshSettings.argv`.
        command: the remote command from :func:`remote_command`.
        popen_kwargs: passed to Popen (session, parent-death signal).
        on_stderr: called with each ssh/watchdog stderr line that is not
            part of the protocol (ssh's own errors).
    """

    #: after KILL, how long the ssh client may take to exit before it is killed
    KILL_WAIT_S = 5.0

    def __init__(self, ssh_argv: List[str], command: str, popen_kwargs: dict,
                 on_stderr) -> None:
        self._ssh = subprocess.Popen(ssh_argv + [command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     **popen_kwargs)
        self.pid = self._ssh.pid
        #: what carries the session: ssh, or srun / mpirun (see .step_nodes)
        self.transport = os.path.basename(ssh_argv[0]) if ssh_argv else "ssh"
        self.stdout = self._ssh.stdout
        self.remote_pid: Optional[int] = None
        self.remote_exit: Optional[int] = None
        self.stopped_why: Optional[str] = None  # the watchdog stopped the node itself
        #: 'T' (stopped), 'D' (uninterruptible sleep), '-' (neither) as last reported
        self.remote_state: Optional[str] = None
        self.ssh_error = ""
        self._on_stderr = on_stderr
        self._stdin_lock = threading.Lock()
        self._kill_sent: Optional[float] = None
        self._stderr_done = threading.Event()
        self.returncode: Optional[int] = None
        self.lost = False
        self._reader = threading.Thread(target=self._read_stderr, daemon=True,
                                        name="cpsgd-launch ssh stderr %d" % self.pid)

    def start_reader(self) -> None:
        """Start reading the protocol (after every process was forked)."""
        self._reader.start()

    def _read_stderr(self) -> None:
        try:
            for raw in iter(self._ssh.stderr.readline, b""):
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if text.startswith(PROTOCOL_MARK):
                    words = text[len(PROTOCOL_MARK):].split()
                    if len(words) == 2 and words[0] == "pid":
                        self.remote_pid = int(words[1])
                    elif len(words) == 2 and words[0] == "exit":
                        self.remote_exit = int(words[1])
                    elif len(words) == 2 and words[0] == "state":
                        self.remote_state = words[1]
                    elif len(words) == 2 and words[0] == "stopped":
                        self.stopped_why = words[1].replace("_", " ")
                    continue
                self.ssh_error = text or self.ssh_error
                self._on_stderr(text)
        finally:
            self._ssh.stderr.close()
            self._stderr_done.set()

    def send(self, word: str) -> None:
        """Write a control line to the watchdog (ignored once ssh is gone)."""
        with self._stdin_lock:
            try:
                self._ssh.stdin.write(word.encode() + b"\n")
                self._ssh.stdin.flush()
            except (OSError, ValueError):
                pass

    def close_stdin(self) -> None:
        with self._stdin_lock:
            try:
                self._ssh.stdin.close()
            except OSError:
                pass

    def poll(self) -> Optional[int]:
        """The node's returncode once the ssh client exited: what the watchdog
        reported (negative: killed by that signal), else ssh's code (then
        :attr:`lost` is True: the session ended without a report)."""
        if self.returncode is not None:
            return self.returncode
        code = self._ssh.poll()
        if code is None:
            return None
        self._stderr_done.wait(2.0)  # the exit report may still be in the pipe
        if self.remote_exit is not None:
            self.returncode = self.remote_exit
        else:
            self.lost = True
            self.returncode = code if code != 0 else 255
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        self._ssh.wait(timeout)
        return self.poll()

    def describe(self) -> Optional[str]:
        """How the session ended when there was no exit report, else None."""
        if not self.lost:
            return None
        if self.stopped_why is not None:
            return "was stopped by its remote watchdog (%s)" % self.stopped_why
        return "lost its %s session (%s exited with code %d%s)" % (
            self.transport, self.transport, self._ssh.returncode, ": " + self.ssh_error if self.ssh_error else "")

    def signal_group(self, signum: int) -> None:
        """SIGTERM/SIGKILL the remote process group through the watchdog
        (which continues it after SIGTERM; SIGCONT itself is not sent)."""
        if self._ssh.poll() is not None or signum == signal.SIGCONT:
            return
        if signum == signal.SIGKILL:
            if self._kill_sent is None:
                self._kill_sent = time.monotonic()
                self.send("KILL")
                self.close_stdin()
            elif time.monotonic() - self._kill_sent > self.KILL_WAIT_S:
                self.kill_local()
        else:
            self.send("TERM")

    def kill_local(self) -> None:
        """SIGKILL the local ssh client (the watchdog then stops the node)."""
        try:
            os.killpg(self._ssh.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def group_gone(self) -> bool:
        if self._ssh.poll() is None:
            if self._kill_sent is not None and \
                    time.monotonic() - self._kill_sent > self.KILL_WAIT_S:
                self.kill_local()
            return False
        return True


class Heartbeat:
    """Sends ``PING`` to every remote node every ``interval`` seconds, so that
    watchdogs whose launcher vanished without closing the session (a network
    partition) stop their node after their heartbeat timeout."""

    def __init__(self, processes: Sequence[RemoteProcess], interval: float) -> None:
        self._processes = list(processes)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="cpsgd-launch heartbeat")

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            for proc in self._processes:
                if proc.poll() is None:
                    proc.send("PING")

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Cluster:
    """Where and how a multi-host job runs (``cpsgd-launch -H``).

    Args:
        hosts: from :func:`parse_hostfile`.
        ssh: how to run ssh.
        scheduler_on_first_host: run the scheduler on ``hosts[0]`` instead of
            on the launching machine.
        scheduler_address: the launching machine's address that every host
            reaches (default: its address on the route to the first host).
        python: the interpreter for servers, scheduler and watchdogs, the
            same path on every host (default: the launcher's own).
        copy_to: copy the current directory to this directory on every host
            first and run there (default: run in the current directory's path).
        oversubscribe: place more workers on a host than its ``slots=N``.
    """
    hosts: List[Host]
    ssh: SshSettings = field(default_factory=SshSettings)
    scheduler_on_first_host: bool = False
    scheduler_address: Optional[str] = None
    python: str = ""
    copy_to: Optional[str] = None
    oversubscribe: bool = False
