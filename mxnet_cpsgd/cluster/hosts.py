"""Emulated machines on one Linux machine (root only), for tests and benchmarks.

:class:`EmulatedHosts` builds ``1 + N`` network namespaces joined by a bridge
(:class:`mxnet_cpsgd.cluster.netem.EmulatedNetwork`, links unshaped or shaped to a
rate): namespace 0 is the *launching machine* (where ``cpsgd-launch`` or
MXNet's tools/launch.py runs and, by default, the scheduler), namespaces
1..N are the *hosts*, each running its own ``sshd`` on port 22 of its own
address (198.18.0.11, .12, ...), with a host key and one client key generated
for this instance only.  The namespaces share the machine's file system and
process table: the working directory and the interpreter are the same path on
every host, as ``cpsgd-launch -H`` requires.

Files written to :attr:`EmulatedHosts.dir`: ``hostfile`` (one address per
line), ``ssh_config`` (user, key, known_hosts with the generated host keys,
strict host key checking, batch mode), ``id_ed25519``, ``known_hosts``, per
host ``sshd-N.conf``, ``sshd-N.log`` and its host key.  Every sshd keeps its
sessions alive as a cluster's should (:data:`SSHD_ALIVE_INTERVAL_S`): the
session of a client that vanished (its link went down) ends within
:data:`SSHD_SESSION_BOUND_S` instead of when TCP gives up.

Example::

    with EmulatedHosts(2, rate="1gbit") as hosts:
        subprocess.run(hosts.launcher.wrap(
            ["python", "-m", "mxnet_cpsgd.launch", "-H", hosts.hostfile,
             "--ssh-config", hosts.ssh_config, "-n", "2", "--", "python", "train.py"]))

With ``own_name=True`` every host resolves the machine's host name (shared by all
of them) to its own address, as separate machines would: ``ip netns exec``
puts ``/etc/netns/<namespace>/hosts`` over ``/etc/hosts`` for what it starts
(sshd and every session), and these files are removed again on :meth:`close`.

With ``sshd=False`` the hosts are plain namespaces (``host.wrap(cmd)`` runs a
process on that host), e.g. to colocate a server and a worker per host in a
benchmark.  Everything is removed on :meth:`close` (also on exceptions, at
interpreter exit and on SIGTERM/SIGHUP through the network's own cleanup).
"""
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional

from mxnet_cpsgd.cluster import netem, procfs

SSHD = "/usr/sbin/sshd"
#: every emulated sshd probes a silent client this often (ClientAliveInterval) and
#: ends the session after this many unanswered probes (ClientAliveCountMax), the
#: same keep-alive the launcher's ssh client runs towards it; without it, the
#: session of a client that vanished with its link lingers until TCP gives up
SSHD_ALIVE_INTERVAL_S = 10
SSHD_ALIVE_COUNT = 3
#: so a session whose client stopped answering is gone this long after its last
#: packet (OpenSSH 9.2 probes only when a whole interval passed without any event,
#: so up to every second interval: 85 s measured with the link kept down)
SSHD_SESSION_BOUND_S = 2 * SSHD_ALIVE_INTERVAL_S * (SSHD_ALIVE_COUNT + 1) + 10
#: where ``ip netns exec`` finds the files it puts over /etc's for a namespace
NETNS_ETC = "/etc/netns"


class HostsUnavailable(RuntimeError):
    """Emulated hosts cannot be built here (not root, no sshd, no netns)."""


def check_available(sshd: bool = True) -> None:
    """Raise :class:`HostsUnavailable` with the reason unless hosts can be built."""
    try:
        netem.check_available()
    except netem.NetemError as err:
        raise HostsUnavailable(str(err)) from None
    if sshd:
        missing = [path for path in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen"))
                   if not path or not os.access(path, os.X_OK)]
        if missing or not os.path.exists(SSHD):
            raise HostsUnavailable("emulated hosts need sshd, ssh and ssh-keygen (Debian "
                                   "packages openssh-server and openssh-client); %s not "
                                   "found" % (SSHD if not os.path.exists(SSHD) else "ssh"))


@dataclass
class EmulatedHost:
    """One emulated machine."""
    index: int          # 0 = the launching machine, 1..N the hosts
    address: str
    netns: str
    sshd: Optional[subprocess.Popen] = None

    def wrap(self, cmd: List[str]) -> List[str]:
        """The command line that runs ``cmd`` on this machine (its namespace)."""
        return ["ip", "netns", "exec", self.netns] + list(cmd)


def _pdeathsig() -> None:  # sshd dies with the process that started it
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))


class EmulatedHosts:
    """The launching machine plus ``num_hosts`` hosts with sshd; a context manager.

    Args:
        num_hosts: hosts besides the launching machine (1..100).
        rate: link rate of every machine (tc syntax, e.g. ``'1gbit'``), or
            None for unshaped links.
        delay: optional one-way delay (needs netem in the kernel).
        sshd: start an sshd on every host.
        own_name: on every host, the machine's host name resolves to the
            host's own address (not to what /etc/hosts says).
    """

    def __init__(self, num_hosts: int, rate: Optional[str] = None,
                 delay: Optional[str] = None, sshd: bool = True,
                 own_name: bool = False) -> None:
        if not 1 <= num_hosts <= 100:
            raise ValueError("num_hosts must be in 1..100, got %r" % (num_hosts,))
        self.num_hosts = num_hosts
        self.rate, self.delay, self.with_sshd = rate, delay, sshd
        self.own_name = own_name
        self._netns_dirs: List[str] = []
        self.network: Optional[netem.EmulatedNetwork] = None
        self.machines: List[EmulatedHost] = []
        self.dir = ""
        self.user = pwd.getpwuid(os.getuid()).pw_name

    # the launching machine and the hosts
    @property
    def launcher(self) -> EmulatedHost:
        return self.machines[0]

    @property
    def hosts(self) -> List[EmulatedHost]:
        return self.machines[1:]

    @property
    def hostfile(self) -> str:
        return os.path.join(self.dir, "hostfile")

    @property
    def ssh_config(self) -> str:
        return os.path.join(self.dir, "ssh_config")

    @property
    def identity(self) -> str:
        return os.path.join(self.dir, "id_ed25519")

    def __enter__(self) -> "EmulatedHosts":
        self.setup()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def setup(self) -> None:
        """Build the namespaces, keys and configuration, start every sshd and
        wait until each listens.  On failure everything is removed again.

        Raises:
            HostsUnavailable: not root, or sshd/ssh/ip missing.
            netem.NetemError, RuntimeError: a step failed (with its message).
        """
        check_available(self.with_sshd)
        try:
            self.dir = tempfile.mkdtemp(prefix="cpsgd-hosts-")
            self.network = netem.EmulatedNetwork(1 + self.num_hosts, self.rate, self.delay)
            self.network.setup()
            self.machines = [EmulatedHost(n.index, n.address, n.netns)
                             for n in self.network.nodes]
            with open(self.hostfile, "w") as f:
                f.write("".join(h.address + "\n" for h in self.hosts))
            if self.own_name:
                self._write_hosts_files()
            if self.with_sshd:
                self._start_sshds()
        except BaseException:
            self.close()
            raise

    def _write_hosts_files(self) -> None:
        name = socket.gethostname()
        with open("/etc/hosts") as f:
            kept = [line for line in f.read().splitlines()
                    if name not in line.split("#")[0].split()[1:]]
        for host in self.hosts:
            path = os.path.join(NETNS_ETC, host.netns)
            os.makedirs(path)
            self._netns_dirs.append(path)
            with open(os.path.join(path, "hosts"), "w") as f:
                f.write("\n".join(kept + ["%s %s" % (host.address, name)]) + "\n")

    def _keygen(self, path: str) -> str:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cpsgd-hosts",
                        "-f", path], check=True, capture_output=True)
        with open(path + ".pub") as f:
            return f.read().strip()

    def _start_sshds(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        client_key = self._keygen(self.identity)
        authorized = os.path.join(self.dir, "authorized_keys")
        with open(authorized, "w") as f:
            f.write(client_key + "\n")
        known = []
        for host in self.hosts:
            key = os.path.join(self.dir, "host-%d_ed25519" % host.index)
            known.append("%s %s" % (host.address, " ".join(self._keygen(key).split()[:2])))
            conf = os.path.join(self.dir, "sshd-%d.conf" % host.index)
            with open(conf, "w") as f:
                f.write("\n".join([
                    "ListenAddress %s:22" % host.address,
                    "HostKey %s" % key,
                    "AuthorizedKeysFile %s" % authorized,
                    "PidFile none",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "ClientAliveInterval %d" % SSHD_ALIVE_INTERVAL_S,
                    "ClientAliveCountMax %d" % SSHD_ALIVE_COUNT,
                    "LogLevel INFO",
                    ""]))
            log = open(os.path.join(self.dir, "sshd-%d.log" % host.index), "w")
            with log:
                host.sshd = subprocess.Popen(host.wrap([SSHD, "-D", "-e", "-f", conf]),
                                             stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT,
                                             start_new_session=True, preexec_fn=_pdeathsig)
        with open(os.path.join(self.dir, "known_hosts"), "w") as f:
            f.write("".join(line + "\n" for line in known))
        with open(self.ssh_config, "w") as f:
            f.write("\n".join([
                "Host *",
                "  User %s" % self.user,
                "  IdentityFile %s" % self.identity,
                "  IdentitiesOnly yes",
                "  UserKnownHostsFile %s" % os.path.join(self.dir, "known_hosts"),
                "  GlobalKnownHostsFile /dev/null",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
                ""]))
        deadline = time.monotonic() + 20
        for host in self.hosts:
            while not self._listening(host):
                if host.sshd.poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(self.dir, "sshd-%d.log" % host.index)) as f:
                        log = f.read().strip()
                    raise RuntimeError("sshd on %s did not start: %s" % (host.address,
                                                                         log or "no output"))
                time.sleep(0.05)

    @staticmethod
    def _listening(host: EmulatedHost) -> bool:
        out = subprocess.run(host.wrap(["ss", "-Hltn", "sport = :22"]),
                             capture_output=True, text=True).stdout
        return host.address + ":22" in out

    def sshd_sessions(self, host: EmulatedHost) -> List[int]:
        """pids of the sshd processes serving connections on ``host`` (the
        children of its listening sshd)."""
        if host.sshd is None:
            return []
        daemon = _inner_pid(host.sshd.pid)
        return [pid for pid in procfs.pids() if procfs.ppid(pid) == daemon]

    @staticmethod
    def is_sshd(pid: int) -> bool:
        """Whether ``pid`` is an sshd process (the daemon or a session's)."""
        try:
            with open("/proc/%d/comm" % pid) as f:
                return f.read().strip().startswith("sshd")
        except OSError:
            return False

    def processes(self, host: EmulatedHost) -> List[int]:
        """pids of every process in the host's namespace except its sshd daemon."""
        out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True,
                             text=True).stdout
        daemon = _inner_pid(host.sshd.pid) if host.sshd is not None else None
        return [int(p) for p in out.split() if int(p) != daemon and procfs.alive(int(p))]

    def close(self) -> None:
        """Stop every sshd, remove the namespaces and the files.  Idempotent."""
        for host in self.machines:
            if host.sshd is not None and host.sshd.poll() is None:
                host.sshd.terminate()
                try:
                    host.sshd.wait(5)
                except subprocess.TimeoutExpired:
                    host.sshd.kill()
                    host.sshd.wait()
        try:
            if self.network is not None:
                self.network.close()  # also kills anything left inside
        finally:
            for path in self._netns_dirs:
                shutil.rmtree(path, ignore_errors=True)
            self._netns_dirs = []
            try:
                os.rmdir(NETNS_ETC)  # only when no one else has a file there
            except OSError:
                pass
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)


def _inner_pid(pid: int) -> int:
    # `ip netns exec` execs its program, so the Popen pid is sshd's own
    return pid


if __name__ == "__main__":  # a quick manual check: python -m mxnet_cpsgd.cluster.hosts
    with EmulatedHosts(int(sys.argv[1]) if len(sys.argv) > 1 else 2) as _hosts:
        for _host in _hosts.hosts:
            subprocess.run(_hosts.launcher.wrap(["ssh", "-F", _hosts.ssh_config,
                                                 _host.address, "hostname -I"]), check=True)
