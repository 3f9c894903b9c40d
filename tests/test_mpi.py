"""cpsgd-launch --launcher mpi and MXNet's tools/launch.py --launcher mpi
(through the shim) with Debian's Open MPI: real mpirun processes starting the
nodes on emulated hosts (network namespaces with sshd, as in
tests/test_cluster.py; mpirun reaches them with ssh) and on loopback.  No
mocks.  Skipped with the reason where mpirun or the emulated hosts are
missing (scripts/run_tests.sh installs openmpi-bin as root)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from procs import MARK_VAR, killed_after, marked_left_after, repo_pythonpath
from test_cluster import (BOUND_S, CPSGD_SPEC, KV_LOOP, NODE_ENV, Launcher, _REASON,
                          assert_nothing_left, load_recording, node_pids)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "workers"))
import jobutil  # noqa: E402

try:
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(400)]
except ImportError:
    pytestmark = []
if shutil.which("mpirun") is None:
    pytestmark.append(pytest.mark.skip(reason="Open MPI's mpirun not installed (Debian "
                                              "openmpi-bin)"))
needs_hosts = pytest.mark.skipif(_REASON is not None,
                                 reason="emulated ssh hosts unavailable: %s" % _REASON)


def mpi_env(hosts):
    """How mpirun reaches the emulated hosts: their ssh configuration, and its
    own connections (orted back to mpirun) on the emulated network only.  The
    emulated hosts share one /tmp and one host name, so every mpirun and orted of
    every test would share Open MPI's session directory (/tmp/ompi.HOST.UID),
    which the last one to leave removes: a test's mpirun could then find it gone
    while creating it ("A call to mkdir was unable to create the desired
    directory ... File exists", seen once, the test right after another MPI
    test, under load).  Each set of hosts gets a session directory of its own."""
    return {"OMPI_MCA_orte_tmpdir_base": os.path.join(hosts.dir, "ompi"),
            "OMPI_MCA_plm_rsh_agent": "ssh -F %s" % hosts.ssh_config,
            "OMPI_MCA_oob_tcp_if_include": "198.18.0.0/16",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


class MpiLauncher(Launcher):
    """cpsgd-launch --launcher mpi -H HOSTFILE on the emulated launching machine."""

    def __init__(self, hosts, mark, args, command):
        saved = dict(os.environ)
        os.environ.update(mpi_env(hosts))
        try:
            # Launcher adds -H and --ssh-config (ignored by mpirun's engine)
            super().__init__(hosts, mark, ["--launcher", "mpi"] + list(args), command)
        finally:
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture
def mpi_launchers(mark):
    yield from killed_after(MpiLauncher)


@pytest.fixture
def make_hosts():
    from mxnet_cpsgd.cluster import hosts as emulated
    made = []

    def make(num_hosts):
        hosts = emulated.EmulatedHosts(num_hosts)
        made.append(hosts)
        hosts.setup()
        return hosts
    yield make
    for hosts in made:
        hosts.close()


def test_loopback_job(mark, tmp_path):
    """Without -H every node runs here, each under its own mpirun."""
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark})
    run = subprocess.run(
        [sys.executable, "-m", "mxnet_cpsgd.launch", "--launcher", "mpi", "-n", "2", "-s",
         "1", "--env", MARK_VAR + "=" + mark] + ["--env=" + e for e in NODE_ENV] +
        ["--", sys.executable, "-c",
         "import os; print('index', os.environ['MXNET_CPSGD_WORKER_INDEX'], "
         "os.environ['DMLC_NODE_HOST'])"],
        env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "job started on mpirun hosts localhost (scheduler on 127.0.0.1)" in run.stdout
    assert "[worker 1 on localhost] index 1 127.0.0.1" in run.stdout
    assert "cpsgd-launch: job finished successfully" in run.stdout
    assert not marked_left_after(mark, 10)


@needs_hosts
def test_two_host_job_equals_one_machine(make_hosts, mpi_launchers, mark, worker_job,
                                         tmp_path):
    hosts = make_hosts(2)
    spec = dict(CPSGD_SPEC, out=str(tmp_path))
    launcher = mpi_launchers(hosts, mark, ["-n", "2"],
                             [sys.executable, os.path.join(HERE, "workers",
                                                           "record_weights.py"),
                              json.dumps(spec)])
    code = launcher.finish(300)
    text = launcher.text
    assert code == 0, text[-6000:]
    h1, h2 = (h.address for h in hosts.hosts)
    started = next(line for line in launcher.lines if "job started on" in (line or ""))
    assert "mpirun hosts %s, %s (scheduler on %s)" % (h1, h2, hosts.launcher.address) \
        in started, started
    for name in ("server 0 on " + h1, "server 1 on " + h2, "worker 0 on " + h1,
                 "worker 1 on " + h2):
        assert name + " pid" in started, started
    assert_nothing_left(hosts, mark)
    remote = load_recording(str(tmp_path), 2, text)
    local = jobutil.run_recording(worker_job, CPSGD_SPEC, num_workers=2, num_servers=2)
    for rank in range(2):
        for t in range(CPSGD_SPEC["iterations"] + 1):
            for name in remote.params:
                assert np.array_equal(remote.weights(rank, t)[name],
                                      local.weights(rank, t)[name]), (rank, t, name)


@needs_hosts
def test_killed_remote_worker_ends_the_job(make_hosts, mpi_launchers, mark, tmp_path):
    hosts = make_hosts(2)
    (tmp_path / "loop.py").write_text(KV_LOOP)
    launcher = mpi_launchers(hosts, mark, ["-n", "2", "-s", "1"],
                             [sys.executable, str(tmp_path / "loop.py")])
    h1, h2 = (h.address for h in hosts.hosts)
    assert launcher.wait_for(["[worker 0 on %s] store up" % h2,
                              "[worker 1 on %s] store up" % h1]), launcher.text[-4000:]
    os.kill(node_pids(mark, "worker", h2)[1], signal.SIGKILL)
    killed = time.monotonic()
    code = launcher.finish(BOUND_S + 30)
    took = time.monotonic() - killed
    text = launcher.text
    assert code == 1, text[-4000:]
    failures = [l for l in launcher.lines if l and "stopping the job" in l]
    assert failures == ["cpsgd-launch: worker 0 on %s exited with signal SIGKILL; "
                        "stopping the job" % h2], text[-4000:]
    assert took < BOUND_S
    assert_nothing_left(hosts, mark)


@needs_hosts
def test_mxnet_tools_launch_mpi(make_hosts, mark, worker_job, tmp_path):
    """MXNet's tools/launch.py --launcher mpi through the shim (which lets
    mpirun start as root): the cpsgd job on two emulated hosts gives the
    weights of the one-machine job."""
    hosts = make_hosts(2)
    out = tmp_path / "rec"
    out.mkdir()
    spec = json.dumps(dict(CPSGD_SPEC, out=str(out)), separators=(",", ":"))
    # the tracker passes only DMLC_* through mpirun: the rest goes in front
    command = "env %s=%s PYTHONPATH=%s OMP_NUM_THREADS=1 MXNET_CPU_WORKER_NTHREADS=1 " \
              "%s %s '%s'" % (MARK_VAR, mark, REPO, sys.executable,
                              os.path.join(HERE, "workers", "record_weights.py"), spec)
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark})
    env.update(mpi_env(hosts))
    for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        del env[name]  # the shim sets them
    log = tmp_path / "launch.log"
    with open(log, "w") as f:
        launcher = subprocess.Popen(
            hosts.launcher.wrap([sys.executable, "-m", "mxnet_cpsgd.cluster.mxlaunch",
                                 "--host-ip", hosts.launcher.address, "-n", "2", "-s", "2",
                                 "-H", hosts.hostfile, "--launcher", "mpi", command]),
            cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        launcher.wait(timeout=300)  # tools/launch.py does not bound itself
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        text = log.read_text()
    assert launcher.returncode == 0, text[-6000:]
    assert_nothing_left(hosts, mark)
    remote = load_recording(str(out), 2, text)
    local = jobutil.run_recording(worker_job, CPSGD_SPEC, num_workers=2, num_servers=2)
    for rank in range(2):
        for name in remote.params:
            assert np.array_equal(remote.final(rank)[name], local.final(rank)[name]), name
