"""mxnet_cpsgd.launch on real loopback ps-lite jobs (no mocks).

Every node of a test job carries a unique LAUNCH_TEST_MARK in its environment;
the leftover check scans /proc for it, so it also finds descendants and never
mistakes a reused pid for a survivor.  Each test kills whatever carries its
mark at the end, pass or fail.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from procs import MARK_VAR, TimedStream, marked_processes, pid_alive, repo_pythonpath

from mxnet_cpsgd.launch import LaunchError, main, parse_env, run_job

try:  # a generous per-test bound where pytest-timeout is installed
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(180)]
except ImportError:
    pytestmark = []

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: one thread per process: the test machine may have 2 cores
NODE_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}

# A real dist_sync round: init, barrier, push rank+1 from every worker, pull sum.
KV_CHECK = r"""
import os, mxnet as mx
kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.ones((2, 3)))
mx.nd.waitall()
kv._barrier()
kv.push(3, mx.nd.ones((2, 3)) * (kv.rank + 1))
out = mx.nd.zeros((2, 3))
kv.pull(3, out=out)
n = kv.num_workers
assert (out.asnumpy() == n * (n + 1) / 2).all(), out.asnumpy()
print("rank %d of %d sum ok on %s" % (kv.rank, n, os.environ["DMLC_NODE_HOST"]))
"""

# Worker index 1 SIGKILLs itself once the store is up; the other blocks in
# push/pull (waiting for it) until the launcher stops it.
KV_SELF_KILL = r"""
import os, signal, mxnet as mx
kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.ones((2, 3)))
mx.nd.waitall()
kv._barrier()
print("store up", flush=True)
if os.environ["MXNET_CPSGD_WORKER_INDEX"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
out = mx.nd.zeros((2, 3))
while True:
    kv.push(3, mx.nd.ones((2, 3)))
    kv.pull(3, out=out)
    out.wait_to_read()
"""

# Worker index 0 finds this job's server through /proc (its DMLC_ROLE and
# DMLC_PS_ROOT_PORT) and SIGKILLs it; both workers then block in push/pull.
KV_KILL_SERVER = r"""
import os, signal, mxnet as mx
kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.ones((2, 3)))
mx.nd.waitall()
kv._barrier()
port = os.environ["DMLC_PS_ROOT_PORT"].encode()
if os.environ["MXNET_CPSGD_WORKER_INDEX"] == "0":
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(i.split(b"=", 1) for i in f.read().split(b"\0") if b"=" in i)
        except OSError:
            continue
        if env.get(b"DMLC_ROLE") == b"server" and env.get(b"DMLC_PS_ROOT_PORT") == port:
            print("killing server pid %s" % pid, flush=True)
            os.kill(int(pid), signal.SIGKILL)
out = mx.nd.zeros((2, 3))
while True:
    kv.push(3, mx.nd.ones((2, 3)))
    kv.pull(3, out=out)
    out.wait_to_read()
"""

SLEEPER = "import time; print('up', flush=True); time.sleep(300)"


def script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return [sys.executable, str(path)]


def node_env(mark, **extra):
    env = dict(NODE_ENV, **extra)
    env[MARK_VAR] = mark
    return env


def test_two_workers_dist_sync(tmp_path, mark):
    logs = tmp_path / "logs"
    result = run_job(script(tmp_path, "kv.py", KV_CHECK), 2, 1, env=node_env(mark),
                     timeout=20, job_timeout=150, log_dir=str(logs), stream=None)
    assert result.returncode == 0, result.output
    assert result.failure is None
    for index in (0, 1):
        assert any(line.startswith("[worker %d] rank " % index) and "sum ok on 127.0.0.1" in line
                   for line in result.output.splitlines()), result.output
    assert "cpsgd-launch: job finished successfully" in result.output
    assert sorted(result.pids) == ["scheduler", "server 0", "worker 0", "worker 1"]
    assert not [pid for pid in result.pids.values() if pid_alive(pid)]
    assert marked_processes(mark) == []
    # per-node logs hold the lines without prefix
    names = sorted(os.listdir(logs))
    assert names == ["launcher.log", "scheduler.log", "server-0.log", "worker-0.log",
                     "worker-1.log"]
    assert "sum ok" in (logs / "worker-1.log").read_text()
    assert not (logs / "worker-1.log").read_text().startswith("[")


def test_worker_sigkill_fails_and_cleans_up(tmp_path, mark):
    stream = TimedStream()
    timeout = 10
    result = run_job(script(tmp_path, "kill.py", KV_SELF_KILL), 2, 1, env=node_env(mark),
                     timeout=timeout, job_timeout=150, stream=stream)
    ended = time.monotonic()
    assert result.returncode == 1, result.output
    assert result.failure == "worker 1 exited with signal SIGKILL; stopping the job"
    assert "cpsgd-launch: worker 1 exited with signal SIGKILL; stopping the job" in result.output
    assert "[worker 1] store up" in result.output
    assert ended - stream.time_of("stopping the job") < timeout
    assert not [pid for pid in result.pids.values() if pid_alive(pid)]
    assert marked_processes(mark) == []


def test_killed_server_fails_the_job(tmp_path, mark):
    result = run_job(script(tmp_path, "ks.py", KV_KILL_SERVER), 2, 1, env=node_env(mark),
                     timeout=10, job_timeout=150, stream=None)
    assert result.returncode == 1, result.output
    assert result.failure == "server 0 exited with signal SIGKILL; stopping the job"
    assert "[worker 0] killing server pid %d" % result.pids["server 0"] in result.output
    assert marked_processes(mark) == []


def test_worker_exit_code_is_the_job_exit_code(mark):
    result = run_job([sys.executable, "-c", "import sys; sys.exit(3)"], 1, 1,
                     env=node_env(mark), timeout=10, stream=None)
    assert result.returncode == 3
    assert result.failure == "worker 0 exited with code 3; stopping the job"
    assert marked_processes(mark) == []


def test_job_timeout(mark):
    started = time.monotonic()
    result = run_job([sys.executable, "-c", SLEEPER], 1, 1, env=node_env(mark), timeout=10,
                     job_timeout=3, stream=None)
    assert result.returncode == 1
    assert result.failure == "job timeout of 3 s expired; stopping the job"
    assert time.monotonic() - started < 3 + 10 + 5
    assert marked_processes(mark) == []


def _read_until(proc, needles, seconds):
    """Lines of proc.stdout until every needle was seen (or the time is up)."""
    lines = []
    done = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if all(any(n in seen for seen in lines) for n in needles):
                done.set()
        done.set()
    threading.Thread(target=read, daemon=True).start()
    done.wait(seconds)
    return lines


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_tears_down(mark, signum, code):
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark})
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mxnet_cpsgd.launch", "-n", "2", "-s", "1", "--timeout", "10",
         "--", sys.executable, "-c", SLEEPER],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = _read_until(launcher, ["[worker 0] up", "[worker 1] up"], 60)
        assert any("[worker 1] up" in line for line in lines), "".join(lines)
        sent = time.monotonic()
        launcher.send_signal(signum)
        assert launcher.wait(timeout=15) == code
        assert time.monotonic() - sent < 10 + 1
        time.sleep(0.2)  # let the reader take the last lines
        text = "".join(lines)
        assert "cpsgd-launch: received %s; stopping the job" % signum.name in text, text
        assert marked_processes(mark) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_workers=0), "workers must be >= 1"),
    (dict(num_servers=0), "servers must be >= 1"),
    (dict(command=[]), "no command"),
    (dict(command=["no-such-program-here"]), "command not found"),
    (dict(timeout=0), "timeout must be > 0"),
    (dict(env={"DMLC_ROLE": "worker"}), "DMLC_ROLE is set by the launcher"),
    (dict(env={"BAD-NAME": "1"}), "malformed environment variable"),
])
def test_run_job_rejects_bad_input(kwargs, message):
    args = dict(command=[sys.executable, "-c", "pass"], num_workers=1, num_servers=1,
                stream=None)
    args.update(kwargs)
    with pytest.raises(LaunchError, match=message):
        run_job(**args)


@pytest.mark.parametrize("items,message", [
    (["NOVALUE"], "malformed --env 'NOVALUE'"),
    (["=x"], "malformed --env"),
    (["DMLC_PS_ROOT_PORT=1"], "DMLC_PS_ROOT_PORT is set by the launcher"),
])
def test_parse_env_rejects(items, message):
    with pytest.raises(LaunchError, match=message):
        parse_env(items)


def test_parse_env_accepts():
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}


@pytest.mark.parametrize("argv,message", [
    (["-n", "0", "-s", "1", "--", "true"], "workers must be >= 1"),
    (["-n", "1", "-s", "0", "--", "true"], "servers must be >= 1"),
    (["-n", "1", "-s", "1", "--"], "no command"),
    (["-n", "1", "-s", "1"], "no command"),
    (["-n", "1", "-s", "1", "--env", "FOO", "--", "true"], "malformed --env 'FOO'"),
    (["-n", "1", "-s", "1", "--emulate-network", "100mb", "--", "true"], "bad rate '100mb'"),
    (["-n", "1", "-s", "1", "--emulate-network", "1gbit,2", "--", "true"], "bad delay '2'"),
    (["-n", "1", "-s", "1", "--time-scale", "10", "--", "true"], "give --emulate-network"),
    (["-n", "1", "-s", "1", "--emulate-network", "100mbit", "--time-scale", "0.5", "--",
      "true"], "bad time scale '0.5'"),
    (["-n", "1", "-s", "1", "--emulate-network", "100mbit", "--time-scale", "x", "--",
      "true"], "bad time scale 'x'"),
])
def test_cli_rejects_bad_input(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "cpsgd-launch: error:" in err


@pytest.mark.parametrize("launcher", ["ssh", "mpi"])
def test_host_file_slots_bound_the_workers(tmp_path, capsys, launcher):
    """Lines stating slots=N take that many workers in all (a line without
    counts as one): more are refused in one line before any host is
    contacted (the addresses are unroutable documentation ones), and the
    workers go round-robin over the slots, within each host's count."""
    from collections import Counter
    from mxnet_cpsgd.cluster import engines, mpi, ssh
    from mxnet_cpsgd.cluster.remote_nodes import build_host_nodes
    hostfile = tmp_path / "hosts"
    hostfile.write_text("192.0.2.1 slots=1  # one core\n192.0.2.2 slots=2\n192.0.2.3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--launcher", launcher, "-H", str(hostfile), "-n", "5", "--", "true"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "cpsgd-launch: error: -n 5: the host file states 4 slots (1 on 192.0.2.1, 2 on " \
           "192.0.2.2, 1 on 192.0.2.3; a line without slots= counts as 1), one per " \
           "worker; add hosts or raise slots=N, give -n 4 or fewer, or add " \
           "--oversubscribe; nothing was started" in err, err
    hosts = ssh.parse_hostfile(str(hostfile))
    assert [h.slots for h in hosts] == [1, 2, None]
    for servers in (1, 3):
        if launcher == "ssh":
            nodes = build_host_nodes(["true"], 4, servers, {}, 9000, ssh.Cluster(hosts),
                                     "192.0.2.9", "id", heartbeat=10)
        else:
            nodes = mpi.build_nodes(["true"], 4, servers, {}, 9000, mpi.MpiCluster(hosts),
                                    "192.0.2.9", "id", heartbeat=10)
        placed = Counter(n.host.name for n in nodes if n.role == "worker")
        assert placed == {"192.0.2.1": 1, "192.0.2.2": 2, "192.0.2.3": 1}, (servers, placed)
    engines.check_capacity(ssh.Cluster(hosts, oversubscribe=True), 5)
    # no line states slots: no bound, placement over the lines as before
    plain = [ssh.Host(h.name) for h in hosts]
    engines.check_capacity(ssh.Cluster(plain), 50)
    assert ssh.slot_hosts(plain) == plain
    hostfile.write_text("192.0.2.1 slots=0\n")
    with pytest.raises(ssh.HostError, match="slots=N \\(N >= 1\\)"):
        ssh.parse_hostfile(str(hostfile))


# A service that listens only after a second and a half, and a worker that tries
# it once, at its start: it can only succeed if the launcher waited for the service.
SLOW_SERVICE = r"""
import socket, sys, time
time.sleep(1.5)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(8)
while True:
    s.accept()[0].close()
"""
CONNECT_ONCE = r"""
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
except OSError as err:
    sys.exit("service not up when the worker started: %s" % err)
print("connected at start", flush=True)
"""


def test_workers_start_once_the_served_node_accepts(tmp_path, mark):
    """A node with ``serves`` (the rendezvous service of an all-reduce job) is
    waited for before the nodes after it start."""
    from mxnet_cpsgd.cluster.nodes import Node, free_port
    from mxnet_cpsgd.cluster.supervise import Job, Output
    port = free_port()
    env = dict(os.environ, **{MARK_VAR: mark})
    service = Node("rendezvous", 0, [sys.executable, "-c", SLOW_SERVICE, str(port)], env,
                   serves=("127.0.0.1", port))
    workers = [Node("worker", i, [sys.executable, "-c", CONNECT_ONCE, str(port)], env)
               for i in range(2)]
    job = Job([service] + workers, Output(None, None), timeout=20, job_timeout=60)
    started = time.monotonic()
    try:
        job.start(lambda: None)
        waited = time.monotonic() - started
        code, failure = job.monitor()
    finally:
        job.teardown()
    text = "\n".join(job.out.lines)
    assert (code, failure) == (0, None), text
    assert text.count("connected at start") == 2, text
    assert waited >= 1.0, waited
    assert marked_processes(mark) == []


AUTOGROUP = "/proc/sys/kernel/sched_autogroup_enabled"


@pytest.mark.skipif(not os.path.exists(AUTOGROUP) or open(AUTOGROUP).read().strip() != "1",
                    reason="the kernel does not group scheduling by session")
def test_niced_launcher_lowers_its_nodes_sessions(tmp_path, mark):
    """``nice cpsgd-launch``: every node's session (its own autogroup) gets the
    launcher's niceness, not only the processes."""
    script = tmp_path / "report.py"
    script.write_text("import os, time\n"
                      "time.sleep(0.5)  # the launcher sets it right after the start\n"
                      "print('autogroup', open('/proc/self/autogroup').read().split()[-1],\n"
                      "      'nice', os.nice(0), flush=True)\n")
    proc = subprocess.run(
        ["nice", "-n", "7", sys.executable, "-m", "mxnet_cpsgd.launch", "-n", "2", "-s", "1",
         "--", sys.executable, str(script)],
        env=dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark}),
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if "autogroup" in l]
    nice = min(19, os.nice(0) + 7)  # the test itself may run niced
    assert len(lines) == 2 and all(l.endswith("autogroup %d nice %d" % (nice, nice))
                                   for l in lines), proc.stdout[-3000:]
    assert marked_processes(mark) == []


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    """Scheduler ports come from below the kernel's ephemeral range, where ps-lite's
    servers and workers (which bind port 0) cannot be handed them."""
    import socket
    from mxnet_cpsgd.cluster.nodes import FREE_PORT_LOW, free_port
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    for _ in range(20):
        port = free_port()
        if ephemeral_low - FREE_PORT_LOW >= 1000:
            assert FREE_PORT_LOW <= port < ephemeral_low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
