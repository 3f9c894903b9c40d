"""A real Slurm cluster on emulated hosts, for the tests and the fault campaign
(root only).

Built on :class:`mxnet_cpsgd.cluster.hosts.EmulatedHosts` without sshd: the
launching machine (namespace 0, 198.18.0.10) runs ``slurmctld``, every host
(198.18.0.11, ...) its own ``slurmd`` (``slurmd -N cpsgdslN``: one node each,
reached at its own address).  One ``munged`` with a key and socket made for
this instance serves all of them (a Unix socket path is reachable from every
network namespace).  Nothing outside the instance's directory is written:
the configuration comes through ``SLURM_CONF``.

Cgroups: Debian's slurmd 22.05 loads its cgroup plugin even with
``proctrack/linuxproc`` and ``task/none``, and its autodetection fails where
/sys/fs/cgroup is a tmpfs of v1 hierarchies (containers); the cgroup version
is therefore named in cgroup.conf.  No cgroup is created (no plugin uses one).
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from mxnet_cpsgd.cluster import hosts as emulated

DAEMONS = ("slurmctld", "slurmd", "munged", "srun", "sbatch", "scontrol", "squeue")
NODE_PREFIX = "cpsgdsl"


class SlurmUnavailable(RuntimeError):
    pass


def check_available():
    try:
        emulated.check_available(sshd=False)
    except emulated.HostsUnavailable as err:
        raise SlurmUnavailable(str(err)) from None
    missing = [d for d in DAEMONS if shutil.which(d) is None
               and not os.path.exists("/usr/sbin/" + d)]
    if missing:
        raise SlurmUnavailable("Slurm needs Debian's slurm-wlm and munge (scripts/run_tests.sh "
                               "installs them as root); missing: " + ", ".join(missing))


def _which(name):
    return shutil.which(name) or "/usr/sbin/" + name


def _cgroup_conf():
    kind = subprocess.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"], capture_output=True,
                          text=True).stdout.strip()
    if kind == "cgroup2fs":
        return "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"
    return "CgroupPlugin=cgroup/v1\n"


class EmulatedSlurm:
    """slurmctld on the launching machine, a slurmd on each of ``num_hosts``."""

    def __init__(self, num_hosts, cpus=8, own_name=False):
        # own_name: the host name resolves to each host's own address there
        self.hosts = emulated.EmulatedHosts(num_hosts, sshd=False, own_name=own_name)
        self.cpus = cpus
        self.dir = ""
        self.daemons = []  # (name, Popen)
        self.env = {}
        self._killed = set()  # nodes whose slurmd kill_slurmd ended
        self._closed = False

    @property
    def nodes(self):
        return ["%s%d" % (NODE_PREFIX, h.index) for h in self.hosts.hosts]

    @property
    def launcher(self):
        return self.hosts.launcher

    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.close()

    def setup(self):
        check_available()
        try:
            self.hosts.setup()
            self.dir = tempfile.mkdtemp(prefix="cpsgd-slurm-")
            os.chmod(self.dir, 0o755)
            self._start()
        except BaseException:
            self.close()
            raise

    def _spawn(self, name, argv):
        log = open(os.path.join(self.dir, name + ".out"), "w")
        with log:
            proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.daemons.append((name, proc))
        return proc

    def _start(self):
        d = self.dir
        key, sock = os.path.join(d, "munge.key"), os.path.join(d, "munge.socket")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o600)
        self.env = dict(os.environ, SLURM_CONF=os.path.join(d, "slurm.conf"))
        for name in [n for n in self.env if n.startswith("SLURM_") and n != "SLURM_CONF"]:
            del self.env[name]  # not inside any allocation of an outer Slurm
        self._spawn("munged", [_which("munged"), "-F", "-f", "--socket", sock,
                               "--key-file", key, "--pid-file", os.path.join(d, "munged.pid"),
                               "--log-file", os.path.join(d, "munged.log"),
                               "--seed-file", os.path.join(d, "munged.seed")])
        self._wait(lambda: os.path.exists(sock), "munged", 10)
        controller = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=cpsgdtest",
            "SlurmctldHost=%s(%s)" % (controller, self.launcher.address),
            "AuthType=auth/munge", "AuthInfo=socket=%s" % sock, "CredType=cred/munge",
            "SlurmUser=root", "SlurmdUser=root",
            "StateSaveLocation=%s/state" % d, "SlurmdSpoolDir=%s/spool-%%n" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d, "SlurmdPidFile=%s/slurmd-%%n.pid" % d,
            "SlurmctldLogFile=%s/slurmctld.log" % d, "SlurmdLogFile=%s/slurmd-%%n.log" % d,
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides", "ReturnToService=2",
            "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5", "MessageTimeout=10",
        ]
        for host, node in zip(self.hosts.hosts, self.nodes):
            lines.append("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN"
                         % (node, host.address, self.cpus))
        lines.append("PartitionName=cpsgd Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(os.path.join(d, "slurm.conf"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write(_cgroup_conf())
        os.makedirs(os.path.join(d, "state"))
        self._spawn("slurmctld", self.launcher.wrap([_which("slurmctld"), "-D", "-i"]))
        for node in self.nodes:
            self._spawn_slurmd(node)

        def idle():
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            return all(states.get(n) == "idle" for n in self.nodes)
        self._wait(idle, "slurmctld and slurmd", 60)

    def _spawn_slurmd(self, node):
        host = self.hosts.hosts[self.nodes.index(node)]
        return self._spawn("slurmd-" + node, host.wrap([_which("slurmd"), "-D", "-N", node]))

    def kill_slurmd(self, node):
        """SIGKILL ``node``'s slurmd (a crash: its job steps go on without it)."""
        for name, proc in self.daemons:
            if name == "slurmd-" + node and proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)  # `ip netns exec` execs: slurmd itself
                proc.wait()
        self._killed.add(node)

    def start_slurmd(self, node=None):
        """Start ``node``'s slurmd again after :meth:`kill_slurmd` (every
        such node's without ``node``); nothing once the cluster is closed."""
        for name in sorted(self._killed) if node is None else [node]:
            if self._closed or name not in self._killed:
                continue
            self._killed.discard(name)
            self.daemons = [(n, p) for n, p in self.daemons
                            if n != "slurmd-" + name or p.poll() is None]
            self._spawn_slurmd(name)

    def _wait(self, ready, what, seconds):
        deadline = time.monotonic() + seconds
        while not ready():
            dead = [name for name, p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError("%s did not start%s: %s" % (
                    what, " (%s exited)" % ", ".join(dead) if dead else "", self.logs()))
            time.sleep(0.2)

    def logs(self, tail=3000):
        text = []
        for name in sorted(os.listdir(self.dir)) if self.dir else []:
            if name.endswith((".out", ".log")):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    text.append("== %s\n%s" % (name, f.read()[-tail:]))
        return "\n".join(text)

    def run(self, argv, check=True, timeout=60):
        """A Slurm client command on the launching machine."""
        done = subprocess.run(self.launcher.wrap(argv), env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError("%s failed: %s" % (" ".join(argv), done.stderr))
        return done

    def job_ids(self):
        """Ids of every job still known to slurmctld."""
        return self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()

    def steps(self):
        """``jobid.stepid name`` of every step still listed."""
        out = self.run(["squeue", "-h", "-s", "-o", "%i %j"], check=False).stdout
        return [line for line in out.splitlines() if line.strip()]

    def daemon_pids(self):
        """The daemons and their helpers (slurmctld forks slurmscriptd), not
        slurmd's step daemons (slurmstepd: they run jobs)."""
        pids = {p.pid for _, p in self.daemons if p.poll() is None}
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    fields = f.read().rsplit(")", 1)
                with open("/proc/%d/comm" % pid) as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if int(fields[1].split()[1]) in pids and comm != "slurmstepd":
                pids.add(pid)
        return pids

    def close(self):
        """Cancel every job, stop the daemons, remove namespaces and files."""
        self._closed = True
        try:
            if any(name == "slurmctld" and p.poll() is None for name, p in self.daemons):
                for job in self.job_ids():
                    self.run(["scancel", job], check=False, timeout=20)
        except (subprocess.SubprocessError, OSError):
            pass
        for _, proc in reversed(self.daemons):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        for _, proc in reversed(self.daemons):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
        try:
            self.hosts.close()  # also kills whatever is left in the namespaces
        finally:
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)
