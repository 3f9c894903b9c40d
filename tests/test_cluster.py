"""cpsgd-launch -H over real ssh: emulated hosts (network namespaces, each with
its own sshd and keys made for the test), real ps-lite jobs, no mocks.

The launcher runs on the emulated launching machine (namespace 0) and reaches
the hosts (198.18.0.11, ...) over ssh.  Every node carries the test's mark
(``--env CPSGD_TEST_MARK=...``; the launcher passes it explicitly to remote
nodes), so leftovers are found through /proc; every namespace is also checked
for processes other than its sshd.  Root only: skipped with the reason where
emulated hosts cannot be built (scripts/run_tests.sh installs openssh-server).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from procs import (MARK_VAR, described, kill_all, killed_after, listening,
                   marked_left_after, marked_processes, repo_pythonpath)

from mxnet_cpsgd.cluster import hosts as emulated
from mxnet_cpsgd.cluster import procfs
from mxnet_cpsgd.cluster.ports import FREE_PORT_LOW

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "workers"))
import jobutil  # noqa: E402

try:  # a generous per-test bound where pytest-timeout is installed
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(400)]
except ImportError:
    pytestmark = []


def _unavailable():
    try:
        emulated.check_available()
    except emulated.HostsUnavailable as err:
        return str(err)
    return None


_REASON = _unavailable()
if _REASON:
    pytestmark.append(pytest.mark.skip(reason="emulated ssh hosts unavailable: " + _REASON))

#: the issue's bound: a failure ends the whole job on every host within this
BOUND_S = 60
NODE_ENV = ["OMP_NUM_THREADS=1", "MXNET_CPU_WORKER_NTHREADS=1"]

# Every worker: a dist_sync store, a barrier, "store up", then push/pull forever.
KV_LOOP = r"""
import mxnet as mx
kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.ones((2, 3)))
mx.nd.waitall()
kv._barrier()
print("store up", flush=True)
out = mx.nd.zeros((2, 3))
while True:
    kv.push(3, mx.nd.ones((2, 3)))
    kv.pull(3, out=out)
    out.wait_to_read()
"""

CPSGD_SPEC = jobutil.spec("cpsgd", {"warmup_steps": 2, "correction_period": 3, "threshold": 1.0},
                          iterations=8, final_sync=True, record_grads=False)


class Launcher:
    """cpsgd-launch -H running on the emulated launching machine."""

    def __init__(self, hosts, mark, args, command, cwd=REPO):
        env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark})
        argv = [sys.executable, "-m", "mxnet_cpsgd.launch", "-H", hosts.hostfile,
                "--ssh-config", hosts.ssh_config, "--env", MARK_VAR + "=" + mark] \
            + ["--env=" + e for e in NODE_ENV] + list(args) + ["--"] + list(command)
        self.proc = subprocess.Popen(hosts.launcher.wrap(argv), cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []
        self.times = []  # when each line arrived (time.monotonic)
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self.times.append(time.monotonic())
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)
            self._cond.notify_all()

    @property
    def text(self):
        return "\n".join(line for line in self.lines if line is not None)

    def wait_for(self, needles, seconds=240):
        """Wait until every needle occurs in some line; False on timeout or EOF."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not all(any(n in (line or "") for line in self.lines) for n in needles):
                if None in self.lines or not self._cond.wait(deadline - time.monotonic()):
                    return all(any(n in (line or "") for line in self.lines) for n in needles)
            return True

    def finish(self, seconds):
        code = self.proc.wait(timeout=seconds)
        self._reader.join(5)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def make_hosts():
    """EmulatedHosts factory; everything is removed afterwards, pass or fail."""
    made = []

    def make(num_hosts, **options):
        hosts = emulated.EmulatedHosts(num_hosts, **options)
        made.append(hosts)
        hosts.setup()
        return hosts
    yield make
    for hosts in made:
        hosts.close()


@pytest.fixture
def launchers(mark):
    yield from killed_after(Launcher)


def node_pids(mark, role, host):
    """(watchdog pid, node pid) of the job's node with this role on this host."""
    pids = [pid for pid in marked_processes(mark)
            if procfs.environ(pid).get("DMLC_ROLE") == role
            and procfs.environ(pid).get("DMLC_NODE_HOST") == host]
    watchdogs = [p for p in pids if procfs.ppid(p) not in pids]
    nodes = [p for p in pids if procfs.ppid(p) in pids]
    assert len(watchdogs) == 1 and len(nodes) == 1, (role, host, pids)
    return watchdogs[0], nodes[0]


def assert_nothing_left(hosts, mark):
    """No process of the job anywhere, and no process but its sshd in any
    emulated machine.  The job's processes get 10 s.  An sshd session
    process gets up to emulated.SSHD_SESSION_BOUND_S more: one whose client
    was killed while the host's link was down ends at TCP's next
    retransmission after the link is back (its backoff grew while the link
    was down: about 10 s measured) or by sshd's keep-alive, whichever first."""
    start = time.monotonic()
    while True:
        left = {h.address: hosts.processes(h) for h in hosts.machines}
        left = {a: p for a, p in left.items() if p}
        marked = marked_processes(mark)
        if not left and not marked:
            break
        only_sshd = not marked and all(hosts.is_sshd(p) for p in sum(left.values(), []))
        bound = 10 + (emulated.SSHD_SESSION_BOUND_S if only_sshd else 0)
        if time.monotonic() - start > bound:
            break
        time.sleep(0.2)
    per_machine = {a: [described(p) for p in pids] for a, pids in left.items()}
    kill_all(marked)
    assert not marked and not left, "left behind: marked %s, per machine %s" % (
        [described(p) for p in marked], per_machine)


def load_recording(out, num_workers, output):
    ranks, meta = [], []
    for r in range(num_workers):
        with np.load(os.path.join(out, "rank%d.npz" % r)) as f:
            ranks.append({k: f[k] for k in f.files})
        with open(os.path.join(out, "rank%d.json" % r)) as f:
            meta.append(json.load(f))
    return jobutil.Recording(CPSGD_SPEC, ranks, meta, output)


@pytest.mark.parametrize("num_hosts,num_workers,extra", [
    (2, 2, []),                                         # default: one server per host
    (3, 3, ["-s", "1", "--scheduler-on-first-host", "--copy-workdir"]),
])
def test_job_across_hosts_equals_one_machine(make_hosts, launchers, mark, worker_job,
                                             tmp_path, num_hosts, num_workers, extra):
    hosts = make_hosts(num_hosts)
    num_servers = int(extra[1]) if "-s" in extra else num_hosts
    spec = dict(CPSGD_SPEC, out=str(tmp_path))
    script, cwd = os.path.join(HERE, "workers", "record_weights.py"), REPO
    if "--copy-workdir" in extra:  # a directory with the script, copied to every host
        cwd, copy = tmp_path / "src", tmp_path / "copy"
        cwd.mkdir()
        shutil.copy(script, cwd)
        extra, script = extra + [str(copy)], "record_weights.py"
    launcher = launchers(hosts, mark, ["-n", str(num_workers)] + extra,
                         [sys.executable, script, json.dumps(spec)], cwd=cwd)
    code = launcher.finish(300)
    text = launcher.text
    assert code == 0, text[-6000:]
    assert "cpsgd-launch: job finished successfully" in text
    # placement: servers, then workers, round-robin over the host file
    addresses = [h.address for h in hosts.hosts]
    placed = ["server %d on %s" % (i, addresses[i % num_hosts]) for i in range(num_servers)] \
        + ["worker %d on %s" % (i, addresses[(num_servers + i) % num_hosts])
           for i in range(num_workers)]
    started = next(line for line in launcher.lines if "job started on" in (line or ""))
    for name in placed:
        assert name + " pid" in started, started
    scheduler = addresses[0] if extra else hosts.launcher.address
    assert "(scheduler on %s)" % scheduler in started
    # the port the first host (or this machine) picked: below its ephemeral range,
    # where the job's own ps-lite nodes, which bind port 0, cannot be handed it (an
    # emulated host is a new network namespace: the kernel's default range, from 32768)
    port = int(re.search(r"scheduler port (\d+)", started).group(1))
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = 32768 if extra else int(f.read().split()[0])
    assert FREE_PORT_LOW <= port < ephemeral_low, started
    assert re.search(r"^\[worker 0 on 198\.18\.0\.1\d\] ", text, re.M), text[-3000:]
    assert_nothing_left(hosts, mark)
    if "--copy-workdir" in extra:
        assert (copy / "record_weights.py").read_bytes() == \
            (cwd / "record_weights.py").read_bytes()

    remote = load_recording(str(tmp_path), num_workers, text)
    local = jobutil.run_recording(worker_job, CPSGD_SPEC, num_workers=num_workers,
                                  num_servers=num_servers)
    assert remote.params == local.params
    # two workers: the servers' sums are exact, so the runs are bitwise equal;
    # three: the order in which pushes arrive changes the last bits of a sum
    atol = 0.0 if num_workers == 2 else 1e-5
    for rank in range(num_workers):
        for t in range(CPSGD_SPEC["iterations"] + 1):
            for name in remote.params:
                a, b = remote.weights(rank, t)[name], local.weights(rank, t)[name]
                assert np.allclose(a, b, rtol=0, atol=atol) and (atol or np.array_equal(a, b)), \
                    "rank %d, before step %d, %s: max diff %g" % (
                        rank, t, name, np.abs(a - b).max())
        for name in remote.params:
            assert np.allclose(remote.final(rank)[name], local.final(rank)[name],
                               rtol=0, atol=atol)


@pytest.mark.parametrize("target", ["worker", "server", "session"])
def test_remote_death_ends_the_job(make_hosts, launchers, mark, tmp_path, target):
    """SIGKILL of a remote worker, a remote server, or of the sshd session
    process running a remote worker: the job ends on every host with one line."""
    hosts = make_hosts(2)
    (tmp_path / "loop.py").write_text(KV_LOOP)
    # -s 1: server 0 on host 1; worker 0 on host 2, worker 1 on host 1
    launcher = launchers(hosts, mark, ["-n", "2", "-s", "1"],
                         [sys.executable, str(tmp_path / "loop.py")])
    h1, h2 = (h.address for h in hosts.hosts)
    assert launcher.wait_for(["[worker 0 on %s] store up" % h2,
                              "[worker 1 on %s] store up" % h1]), launcher.text[-4000:]
    if target == "worker":
        victim = node_pids(mark, "worker", h2)[1]
        expected = "worker 0 on %s exited with signal SIGKILL; stopping the job" % h2
    elif target == "server":
        victim = node_pids(mark, "server", h1)[1]
        expected = "server 0 on %s exited with signal SIGKILL; stopping the job" % h1
    else:
        watchdog = node_pids(mark, "worker", h2)[0]
        victim = procfs.ppid(watchdog)
        assert victim in hosts.sshd_sessions(hosts.hosts[1]), (victim, described(victim))
        expected = "worker 0 on %s lost its ssh session (ssh exited with code 255" % h2
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    code = launcher.finish(BOUND_S + 30)
    took = time.monotonic() - killed
    text = launcher.text
    assert code != 0, text[-4000:]
    failures = [line for line in launcher.lines if line and "stopping the job" in line]
    assert len(failures) == 1 and failures[0].startswith("cpsgd-launch: " + expected), \
        text[-4000:]
    assert took < BOUND_S, "the job took %.1f s to end" % took
    assert_nothing_left(hosts, mark)


@pytest.mark.parametrize("target", ["server", "worker", "scheduler"])
def test_stopped_remote_node_ends_the_job(make_hosts, launchers, mark, tmp_path, target):
    """Every node listens on its own cluster address only; then SIGSTOP of a
    remote server, worker or scheduler (--scheduler-on-first-host): its
    watchdog reports the stopped state and the launcher ends the job
    (--stall-timeout 3) with one line naming it."""
    hosts = make_hosts(2)
    (tmp_path / "loop.py").write_text(KV_LOOP)
    extra = ["--scheduler-on-first-host"] if target == "scheduler" else []
    launcher = launchers(hosts, mark, ["-n", "2", "-s", "1", "--stall-timeout", "3"] + extra,
                         [sys.executable, str(tmp_path / "loop.py")])
    h1, h2 = (h.address for h in hosts.hosts)
    assert launcher.wait_for(["[worker 0 on %s] store up" % h2,
                              "[worker 1 on %s] store up" % h1]), launcher.text[-4000:]
    # security model: nothing listens on a wildcard or another host's address
    for pid in marked_processes(mark):
        host = procfs.environ(pid).get("DMLC_NODE_HOST", "")
        for address, _ in listening(pid):
            assert address == host, (described(pid), address, host)
    assert any(listening(p) for p in marked_processes(mark))
    victim = node_pids(mark, target, h2 if target == "worker" else h1)[1]
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    code = launcher.finish(BOUND_S + 30)
    took = time.monotonic() - stopped
    text = launcher.text
    noticed = next(t for t, line in zip(launcher.times, launcher.lines)
                   if "stopping the job" in line) - stopped
    print("remote %s SIGSTOPped: stall reported after %.1f s, launcher exited after %.1f s "
          "(stall timeout 3 s)" % (target, noticed, took))
    name = {"server": "server 0 on %s" % h1, "worker": "worker 0 on %s" % h2,
            "scheduler": "scheduler on %s" % h1}[target]
    failures = [line for line in launcher.lines if line and "stopping the job" in line]
    assert code == 1, text[-4000:]
    assert len(failures) == 1 and re.match(
        r"^cpsgd-launch: %s made no progress for \d+\.\d s: its process is stopped \(state T\)"
        % re.escape(name), failures[0]), text[-4000:]
    assert took < BOUND_S
    assert_nothing_left(hosts, mark)


# Worker 1 fails on the first attempt; every worker checks the restart count.
FAIL_ONCE = r"""
import os, sys
restart = os.environ.get("MXNET_CPSGD_RESTART")
print("attempt with MXNET_CPSGD_RESTART=%s" % restart, flush=True)
if restart is None and os.environ["MXNET_CPSGD_WORKER_INDEX"] == "1":
    raise ValueError("first attempt fails")
sys.exit(0 if restart in (None, "1") else 7)
"""


def test_restart_across_hosts(make_hosts, launchers, mark, tmp_path):
    hosts = make_hosts(2)
    (tmp_path / "once.py").write_text(FAIL_ONCE)
    launcher = launchers(hosts, mark, ["-n", "2", "-s", "1", "--max-restarts", "2"],
                         [sys.executable, str(tmp_path / "once.py")])
    code = launcher.finish(240)
    text = launcher.text
    assert code == 0, text[-4000:]
    h1 = hosts.hosts[0].address
    assert "cpsgd-launch: restart 1 of 2 (MXNET_CPSGD_RESTART=1) after: worker 1 on %s " \
           "exited with code 1 after raising ValueError: first attempt fails" % h1 in text, text
    assert "[worker 1 on %s] attempt with MXNET_CPSGD_RESTART=1" % h1 in text
    assert text.count("job started on hosts") == 2
    assert launcher.lines[-2] == "cpsgd-launch: job finished successfully", text[-2000:]
    assert_nothing_left(hosts, mark)


def test_unreachable_host_fails_before_anything_starts(make_hosts, launchers, mark):
    hosts = make_hosts(1)
    with open(hosts.hostfile, "a") as f:
        f.write("198.18.0.99\n")  # on the emulated network, but nobody has it
    started = time.monotonic()
    launcher = launchers(hosts, mark, ["-n", "2", "--ssh-connect-timeout", "5"],
                         [sys.executable, "-c", "print('never')"])
    code = launcher.finish(120)
    text = launcher.text
    assert code == 1, text
    assert "cpsgd-launch: cannot reach 198.18.0.99 over ssh" in text
    assert "nothing was started" in text
    assert "job started" not in text and "never" not in text
    assert time.monotonic() - started < BOUND_S
    assert_nothing_left(hosts, mark)


def test_ctrl_c_tears_down_every_host(make_hosts, launchers, mark, tmp_path):
    """SIGINT to the launcher: the teardown goes through the live ssh sessions
    (each watchdog reports its node's end), the final sweep finds nothing."""
    hosts = make_hosts(2)
    (tmp_path / "loop.py").write_text(KV_LOOP)
    launcher = launchers(hosts, mark, ["-n", "2", "-s", "1"],
                         [sys.executable, str(tmp_path / "loop.py")])
    assert launcher.wait_for(["[worker 0 on", "[worker 1 on"]), launcher.text[-4000:]
    sent = time.monotonic()
    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.finish(BOUND_S + 30) == 130
    assert time.monotonic() - sent < BOUND_S
    text = launcher.text
    assert "cpsgd-launch: received SIGINT; stopping the job" in text
    assert "left on" not in text, text[-3000:]  # the sweep had nothing to kill
    assert_nothing_left(hosts, mark)


def test_sigkilled_launcher_remote_nodes_die_with_their_sessions(make_hosts, launchers,
                                                                 mark, tmp_path):
    """No teardown at all: the launcher is SIGKILLed, its ssh clients die with
    it (parent-death signal), every remote watchdog sees its session end and
    stops its node."""
    hosts = make_hosts(2)
    (tmp_path / "loop.py").write_text(KV_LOOP)
    launcher = launchers(hosts, mark, ["-n", "2", "-s", "1"],
                         [sys.executable, str(tmp_path / "loop.py")])
    assert launcher.wait_for(["[worker 0 on", "[worker 1 on"]), launcher.text[-4000:]
    launcher.proc.kill()
    launcher.proc.wait()
    marked_left_after(mark, BOUND_S)
    assert_nothing_left(hosts, mark)


def test_mxnet_tools_launch_over_ssh(make_hosts, mark, worker_job, tmp_path):
    """MXNet's own tools/launch.py, ssh launcher, through the project's shim
    (python -m mxnet_cpsgd.cluster.mxlaunch): the same cpsgd job across two
    emulated hosts gives the same weights as on one machine."""
    hosts = make_hosts(2)
    bindir = tmp_path / "bin"  # tools/launch.py runs plain `ssh HOST ...`: add our config
    bindir.mkdir()
    (bindir / "ssh").write_text('#!/bin/sh\nexec %s -F %s "$@"\n' % (shutil.which("ssh"),
                                                                   hosts.ssh_config))
    (bindir / "ssh").chmod(0o755)
    out = tmp_path / "rec"
    out.mkdir()
    spec = json.dumps(dict(CPSGD_SPEC, out=str(out)), separators=(",", ":"))
    # tools/launch.py passes only DMLC_* and a few variables over ssh: the rest
    # goes at the front of the command, which every node (scheduler too) runs
    command = "%s=%s PYTHONPATH=%s OMP_NUM_THREADS=1 MXNET_CPU_WORKER_NTHREADS=1 %s %s \"%s\"" % (
        MARK_VAR, mark, REPO, sys.executable, os.path.join(HERE, "workers", "record_weights.py"),
        spec.replace('"', '\\"'))
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), PATH="%s:%s" % (bindir, os.environ["PATH"]),
               **{MARK_VAR: mark})
    log = tmp_path / "launch.log"  # a file: processes it leaves could hold a pipe open
    with open(log, "w") as f:
        launcher = subprocess.Popen(
            hosts.launcher.wrap([sys.executable, "-m", "mxnet_cpsgd.cluster.mxlaunch",
                                 "--host-ip", hosts.launcher.address, "-n", "2", "-s", "2",
                                 "-H", hosts.hostfile, "--launcher", "ssh", command]),
            cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        # tools/launch.py never stops on its own when a node fails: bound it here
        launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        text = log.read_text()
    assert launcher.returncode == 0, text[-6000:]
    assert_nothing_left(hosts, mark)
    remote = load_recording(str(out), 2, text)
    local = jobutil.run_recording(worker_job, CPSGD_SPEC, num_workers=2, num_servers=2)
    for rank in range(2):
        for name in remote.params:
            assert np.array_equal(remote.final(rank)[name], local.final(rank)[name]), name
            assert np.array_equal(remote.weights(rank, CPSGD_SPEC["iterations"])[name],
                                  local.weights(rank, CPSGD_SPEC["iterations"])[name]), name
