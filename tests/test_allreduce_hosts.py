"""cpsgd-launch --allreduce on several hosts: over real ssh (-H, the emulated
hosts of tests/test_cluster.py, each with its own sshd) and in a real Slurm
allocation (--launcher slurm, the daemons of tests/test_slurm.py).  Real
Horovod/Gloo workers, the rendezvous service on the launching machine, no
mocks.  The hosts share one host name, which each resolves to its own address
(``own_name``: as separate machines do); Horovod's Gloo needs that.

Root only, and horovod.mxnet; skipped with the reason elsewhere."""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from procs import listening, marked_processes
from test_cluster import _REASON as _SSH_REASON
from test_cluster import BOUND_S, NODE_ENV, launchers, make_hosts  # noqa: F401 (fixtures)
from test_cluster import assert_nothing_left as nothing_left_on_hosts
from test_slurm import _REASON as _SLURM_REASON
from test_slurm import allocated, cluster  # noqa: F401 (fixtures)
from test_slurm import assert_nothing_left as nothing_left_in_slurm

from mxnet_cpsgd.cluster import procfs
from mxnet_cpsgd.cluster.allreduce_nodes import slot_ranks
from mxnet_cpsgd.launch import run_job

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "horovod_worker.py")

try:
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(450)]
except ImportError:
    pytestmark = []

try:
    import horovod.mxnet  # noqa: F401
    _HOROVOD = None
except ImportError as err:
    _HOROVOD = "horovod.mxnet not importable: %s" % err

needs_hosts = pytest.mark.skipif(bool(_SSH_REASON or _HOROVOD), reason="emulated ssh hosts "
                                 "or Horovod unavailable: %s" % (_SSH_REASON or _HOROVOD))
needs_slurm = pytest.mark.skipif(bool(_SLURM_REASON or _HOROVOD), reason="Slurm cluster "
                                 "or Horovod unavailable: %s" % (_SLURM_REASON or _HOROVOD))

# all-reduce until stopped; five times after a restart (MXNET_CPSGD_RESTART set)
# or with an argument
HVD_LOOP = r"""
import os
import sys
import mxnet as mx
import horovod.mxnet as hvd
hvd.init()
x = mx.nd.ones((4,)) * (hvd.rank() + 1)
limit = 5 if os.environ.get("MXNET_CPSGD_RESTART") or sys.argv[1:] else None
n = 0
while limit is None or n < limit:
    y = hvd.allreduce(x, average=False, name="x")
    y.wait_to_read()
    n += 1
    if n == 1:
        print("all-reduce up: rank %d of %d, sum %g" % (hvd.rank(), hvd.size(),
                                                         y.asnumpy()[0]), flush=True)
print("done after %d all-reduces" % n, flush=True)
"""


def test_slot_ranks_follow_horovods_host_assignment():
    """Local and cross ranks of round-robin slots, checked against what
    horovodrun's own planner gives for the same hosts (up to rank order)."""
    pytest.importorskip("horovod.runner")
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    for hosts in (["a", "b"], ["a", "b", "a"], ["a", "b", "c", "a", "b"], ["a"] * 3):
        ours = slot_ranks(hosts)
        counts = {h: hosts.count(h) for h in dict.fromkeys(hosts)}
        plan = get_host_assignments(parse_hosts(",".join("%s:%d" % i for i in counts.items())),
                                    len(hosts))
        theirs = {(s.hostname, s.local_rank): (s.local_size, s.cross_rank, s.cross_size)
                  for s in plan}
        assert len(set(ours)) == len(hosts)
        for host, (local, local_size, cross, cross_size) in zip(hosts, ours):
            assert theirs[(host, local)] == (local_size, cross, cross_size), (hosts, ours)


@pytest.mark.parametrize("args,message", [
    (["--launcher", "mpi"], "--allreduce runs on this machine, over ssh (-H) or in a Slurm "
                            "allocation (--launcher slurm), not with mpirun"),
    (["-H", os.devnull, "--scheduler-on-first-host"],
     "--allreduce runs its rendezvous service on this machine; leave out "
     "--scheduler-on-first-host"),
])
def test_allreduce_refuses_what_it_cannot_do(args, message):
    run = subprocess.run([sys.executable, "-m", "mxnet_cpsgd.launch", "--allreduce", "-n", "2"]
                         + args + ["--", "true"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "cpsgd-launch: error: " + message in run.stderr, run.stderr


def one_machine_weights(tmp_path, num_workers):
    """Final weights of the same job on this machine (cpsgd-launch --allreduce)."""
    out = tmp_path / "local"
    out.mkdir()
    result = run_job([sys.executable, WORKER, "kvstore", "same", str(out)], num_workers,
                     env=dict(e.split("=", 1) for e in NODE_ENV), allreduce=True,
                     stream=None, timeout=30, job_timeout=240)
    assert result.returncode == 0, result.output[-4000:]
    return load_weights(out, num_workers)


def load_weights(out, num_workers):
    weights = []
    for rank in range(num_workers):
        with np.load(os.path.join(str(out), "kvstore-same-rank%d.npz" % rank)) as f:
            weights.append({k: f[k] for k in f.files})
    return weights


def assert_same_weights(remote, local):
    """To the bit: with two workers every sum has two addends, exact in any
    order, and both jobs run the same MXNet updates."""
    assert len(remote) == len(local)
    for rank, (a, b) in enumerate(zip(remote, local)):
        assert sorted(a) == sorted(b)
        for name in a:
            assert np.array_equal(a[name], b[name]), "rank %d %s: max diff %g" % (
                rank, name, np.abs(a[name] - b[name]).max())


def worker_pids(mark, index):
    """(watchdog pid, worker pid) of all-reduce worker ``index``."""
    pids = [pid for pid in marked_processes(mark)
            if procfs.environ(pid).get("MXNET_CPSGD_WORKER_INDEX") == str(index)
            and "HOROVOD_RANK" in procfs.environ(pid)]
    watchdogs = [p for p in pids if procfs.ppid(p) not in pids]
    nodes = [p for p in pids if procfs.ppid(p) in pids]
    assert len(watchdogs) == 1 and len(nodes) == 1, (index, pids)
    return watchdogs[0], nodes[0]


def failure_lines(lines):
    """The launcher's lines saying why it stops the job (not the restart lines)."""
    return [l for l in lines if l and l.startswith("cpsgd-launch: ")
            and l.endswith("stopping the job") and " after: " not in l]


def started_line(lines):
    return next(line for line in lines if "job started on" in (line or ""))


@needs_hosts
def test_allreduce_across_hosts_equals_one_machine(make_hosts, launchers, mark, tmp_path):
    """kvstore='horovod' on 2 hosts over ssh ends with the weights of the
    one-machine job."""
    num_workers = 2
    hosts = make_hosts(2, own_name=True)
    out = tmp_path / "hosts"
    out.mkdir()
    launcher = launchers(hosts, mark, ["--allreduce", "-n", str(num_workers)],
                         [sys.executable, WORKER, "kvstore", "same", str(out)])
    code = launcher.finish(300)
    text = launcher.text
    assert code == 0, text[-6000:]
    assert text.rstrip().endswith("cpsgd-launch: job finished successfully"), text[-3000:]
    started = started_line(launcher.lines)
    addresses = [h.address for h in hosts.hosts]
    assert "hosts %s (rendezvous on %s)" % (", ".join(addresses),
                                            hosts.launcher.address) in started, started
    for i in range(num_workers):
        assert "worker %d on %s pid" % (i, addresses[i % 2]) in started, started
    assert "[rendezvous 0] rendezvous: serving %d slots" % num_workers in text
    nothing_left_on_hosts(hosts, mark)
    assert_same_weights(load_weights(out, num_workers),
                        one_machine_weights(tmp_path, num_workers))


@needs_hosts
def test_two_slots_on_one_host(make_hosts, launchers, mark):
    """-n 3 on 2 hosts: workers 0 and 2 share the first host (local ranks 0
    and 1); every rank gets the sum 1 + 2 + 3."""
    hosts = make_hosts(2, own_name=True)
    h1, h2 = (h.address for h in hosts.hosts)
    launcher = launchers(hosts, mark, ["--allreduce", "-n", "3"],
                         [sys.executable, "-c", HVD_LOOP, "5"])
    code = launcher.finish(300)
    text = launcher.text
    assert code == 0, text[-6000:]
    for rank, host in enumerate((h1, h2, h1)):
        assert "[worker %d on %s] all-reduce up: rank %d of 3, sum 6" % (rank, host, rank) \
            in text, text[-4000:]
        assert "[worker %d on %s] done after 5 all-reduces" % (rank, host) in text
    assert text.rstrip().endswith("cpsgd-launch: job finished successfully")
    nothing_left_on_hosts(hosts, mark)


@needs_hosts
def test_host_name_on_loopback_fails_before_the_rendezvous(make_hosts, launchers, mark):
    """Hosts whose name resolves to loopback (the machine's /etc/hosts): each
    worker ends at once saying so; one failure line, nothing left."""
    hosts = make_hosts(2)
    launcher = launchers(hosts, mark, ["--allreduce", "-n", "2"],
                         [sys.executable, "-c", HVD_LOOP])
    code = launcher.finish(120)
    text = launcher.text
    assert code == 1, text[-4000:]
    failures = failure_lines(launcher.lines)
    assert len(failures) == 1, text[-4000:]
    assert re.match(r"^cpsgd-launch: worker \d on 198\.18\.0\.1\d exited with code 1 after "
                    r"raising GlooHostError: this host's name '[^']+' resolves to "
                    r"127\.\d+\.\d+\.\d+ \(loopback\)", failures[0]), failures
    assert "all-reduce up" not in text
    nothing_left_on_hosts(hosts, mark)


@needs_hosts
@pytest.mark.parametrize("max_restarts", [0, 1])
def test_killed_remote_allreduce_worker(make_hosts, launchers, mark, tmp_path, max_restarts):
    """SIGKILL of the worker on the second host in the middle of all-reduces:
    the job ends on every host within the bound with one line naming it; with
    --max-restarts 1 it is started again and finishes."""
    hosts = make_hosts(2, own_name=True)
    h1, h2 = (h.address for h in hosts.hosts)
    launcher = launchers(hosts, mark, ["--allreduce", "-n", "2", "--max-restarts",
                                       str(max_restarts)],
                         [sys.executable, "-c", HVD_LOOP])
    assert launcher.wait_for(["[worker 0 on %s] all-reduce up: rank 0 of 2, sum 3" % h1,
                              "[worker 1 on %s] all-reduce up: rank 1 of 2, sum 3" % h2]), \
        launcher.text[-4000:]
    # nothing on a wildcard address: the rendezvous service on the launching
    # machine's address towards the hosts, each worker (if still listening
    # once connected) on its host's
    started = started_line(launcher.lines)
    port = int(re.search(r"port (\d+):", started).group(1))
    rendezvous = int(re.search(r"rendezvous 0 pid (\d+)", started).group(1))
    assert listening(rendezvous) == [(hosts.launcher.address, port)]
    for index, host in enumerate((h1, h2)):
        assert {a for a, _ in listening(worker_pids(mark, index)[1])} <= {host}
    os.kill(worker_pids(mark, 1)[1], signal.SIGKILL)
    killed = time.monotonic()
    if max_restarts:
        assert launcher.wait_for(["restart 1 of 1"], BOUND_S), launcher.text[-4000:]
    else:
        assert launcher.finish(BOUND_S + 30) == 1, launcher.text[-4000:]
    took = time.monotonic() - killed
    failures = failure_lines(launcher.lines)
    assert failures and failures[0] == "cpsgd-launch: worker 1 on %s exited with signal " \
        "SIGKILL; stopping the job" % h2, launcher.text[-4000:]
    assert took < BOUND_S, "the job took %.1f s to end" % took
    if max_restarts:
        assert launcher.finish(240) == 0, launcher.text[-4000:]
        text = launcher.text
        assert len(failures) == 1
        assert "cpsgd-launch: restart 1 of 1 (MXNET_CPSGD_RESTART=1) after: worker 1 on " \
               "%s exited with signal SIGKILL" % h2 in text
        for i, host in enumerate((h1, h2)):
            assert "[worker %d on %s] done after 5 all-reduces" % (i, host) in text, text
        assert text.rstrip().endswith("cpsgd-launch: job finished successfully")
    nothing_left_on_hosts(hosts, mark)


@needs_slurm
def test_allreduce_in_slurm_equals_one_machine(cluster, allocated, mark, tmp_path):
    """kvstore='horovod' as two srun steps on two Slurm nodes ends with the
    weights of the one-machine job; no step, job or process left."""
    c = cluster(2, own_name=True)
    out = tmp_path / "slurm"
    out.mkdir()
    job = allocated(c, mark, ["-N", "2", "--ntasks-per-node=1"], ["--allreduce"],
                    [sys.executable, WORKER, "kvstore", "same", str(out)])
    code = job.finish(300)
    text = job.text
    assert code == 0, text[-6000:] + c.logs()
    assert text.rstrip().endswith("cpsgd-launch: job finished successfully"), text[-3000:]
    n1, n2 = c.nodes
    started = started_line(job.lines)
    assert re.search(r"job started on Slurm job \d+ nodes %s, %s \(rendezvous on %s\)"
                     % (n1, n2, re.escape(c.launcher.address)), started), started
    for name in ("worker 0 on " + n1, "worker 1 on " + n2):
        assert name + " pid" in started, started
    nothing_left_in_slurm(c, mark)
    assert_same_weights(load_weights(out, 2), one_machine_weights(tmp_path, 2))


@needs_slurm
def test_killed_allreduce_worker_in_slurm_restarts(cluster, allocated, mark):
    """SIGKILL of worker 1's process in its srun step: one line naming it
    within the bound, the job started again (--max-restarts 1) and finished."""
    c = cluster(2, own_name=True)
    n1, n2 = c.nodes
    job = allocated(c, mark, ["-N", "2", "--ntasks-per-node=1"],
                    ["--allreduce", "--max-restarts", "1"], [sys.executable, "-c", HVD_LOOP])
    assert job.wait_for(["[worker 0 on %s] all-reduce up: rank 0 of 2, sum 3" % n1,
                         "[worker 1 on %s] all-reduce up: rank 1 of 2, sum 3" % n2]), \
        job.text[-4000:] + c.logs()
    os.kill(worker_pids(mark, 1)[1], signal.SIGKILL)
    killed = time.monotonic()
    assert job.wait_for(["restart 1 of 1"], BOUND_S), job.text[-4000:]
    assert time.monotonic() - killed < BOUND_S
    assert job.finish(240) == 0, job.text[-4000:] + c.logs()
    text = job.text
    failures = failure_lines(job.lines)
    assert failures == ["cpsgd-launch: worker 1 on %s exited with signal SIGKILL; "
                        "stopping the job" % n2], text[-4000:]
    for i, node in enumerate((n1, n2)):
        assert "[worker %d on %s] done after 5 all-reduces" % (i, node) in text, text
    assert text.rstrip().endswith("cpsgd-launch: job finished successfully")
    nothing_left_in_slurm(c, mark)


@needs_hosts
def test_stopped_remote_allreduce_worker_is_named(make_hosts, launchers, mark):
    """SIGSTOP of the worker on the second host, Gloo's timeout (5 s) shorter
    than --stall-timeout: the other worker fails first, and the one line
    names the stopped worker before it."""
    hosts = make_hosts(2, own_name=True)
    h1, h2 = (h.address for h in hosts.hosts)
    launcher = launchers(hosts, mark, ["--allreduce", "-n", "2", "--stall-timeout", "120",
                                       "--env", "HOROVOD_GLOO_TIMEOUT_SECONDS=5"],
                         [sys.executable, "-c", HVD_LOOP])
    assert launcher.wait_for(["[worker 0 on %s] all-reduce up" % h1,
                              "[worker 1 on %s] all-reduce up" % h2]), launcher.text[-4000:]
    os.kill(worker_pids(mark, 1)[1], signal.SIGSTOP)
    stopped = time.monotonic()
    assert launcher.finish(BOUND_S + 30) == 1, launcher.text[-4000:]
    assert time.monotonic() - stopped < BOUND_S
    failures = failure_lines(launcher.lines)
    assert len(failures) == 1, launcher.text[-4000:]
    assert failures[0].startswith("cpsgd-launch: worker 1 on %s is stopped (state T) while "
                                  "worker 0 on %s exited with code 1" % (h2, h1)), failures
    nothing_left_on_hosts(hosts, mark)
