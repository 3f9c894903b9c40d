"""mxnet_cpsgd.cluster.procfs against real child processes, checked with ps(1)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from mxnet_cpsgd.cluster import procfs

MARK = "CPSGD_PROCFS_TEST"


def _ps(pid, field):
    out = subprocess.run(["ps", "-o", "%s=" % field, "-p", str(pid)], capture_output=True,
                         text=True)
    return out.stdout.strip()


def _until(predicate, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def child():
    """A sleeping Python child with a mark in its environment and an argv with
    a space and a ')' in it (the stat file's command name may hold both)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "a b)"],
                            env=dict(os.environ, **{MARK: "yes=really"}))
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()


def test_a_live_child(child):
    assert child.pid in procfs.pids()
    assert procfs.ppid(child.pid) == os.getpid() == int(_ps(child.pid, "ppid"))
    assert procfs.environ(child.pid)[MARK] == "yes=really"
    assert procfs.cmdline(child.pid) == [sys.executable, "-c", "import time; time.sleep(600)",
                                         "a b)"]
    stat = procfs.stat(child.pid)
    assert stat.ppid == os.getpid() and stat.state == procfs.state(child.pid)
    assert stat.cpu_s >= 0
    assert procfs.alive(child.pid)
    # the first letter of ps's STAT is the same state (S sleeping, R running)
    assert _until(lambda: procfs.state(child.pid) == "S")
    assert _ps(child.pid, "stat")[0] == "S"


def test_stopped_then_zombie_then_gone(child):
    os.kill(child.pid, signal.SIGSTOP)
    assert _until(lambda: procfs.state(child.pid) == "T"), procfs.state(child.pid)
    assert _ps(child.pid, "stat")[0] == "T" and procfs.alive(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    assert _until(lambda: procfs.state(child.pid) == "Z"), procfs.state(child.pid)
    assert not procfs.alive(child.pid)
    child.wait()
    pid = child.pid
    assert pid not in procfs.pids()
    assert procfs.stat(pid) is None and procfs.state(pid) is None and procfs.ppid(pid) is None
    assert procfs.environ(pid) == {} and procfs.cmdline(pid) == []
    assert not procfs.alive(pid)


def test_cpu_time_of_a_busy_child():
    # a child that spins until it has used 0.3 s of CPU itself (its own clock)
    proc = subprocess.Popen([sys.executable, "-c",
                             "import time\nwhile time.process_time() < 0.3: pass\n"
                             "print('spun', flush=True)\ntime.sleep(600)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "spun\n"
        cpu = procfs.stat(proc.pid).cpu_s
        assert cpu >= 0.25, cpu   # clock ticks: 1/100 s resolution
        # ps's TIME (whole seconds) agrees within its rounding
        h, m, s = (int(x) for x in _ps(proc.pid, "time").split(":")[-3:])
        assert abs(h * 3600 + m * 60 + s - cpu) <= 1
    finally:
        proc.kill()
        proc.wait()
