"""The mxlaunch shim stopped stops its job.

A 2-worker, 1-server job of tests/workers/idle_worker.py under MXNet's
tools/launch.py (local launcher) through ``python -m mxnet_cpsgd.cluster.mxlaunch``;
once both workers joined, the shim gets SIGTERM (an outer ``timeout``), SIGINT
(Ctrl-C), SIGHUP (a closed terminal), or loses its parent process (SIGKILL of
the shell that started it).  The shim must print one line saying why, stop
scheduler, server and workers, and exit (128 + the signal, 1 for a lost parent),
leaving no process of the job behind.
"""
import os
import re
import signal
import subprocess
import time

import pytest

from procs import MARK_VAR, kill_launched, marked_processes

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(TESTS_DIR, "workers", "idle_worker.py")
START_BOUND_S = 90   # both workers joined (shared 2-core machine)
STOP_BOUND_S = 60    # the project's bound for ending a job (the shim needs a few s)


def _default_signals():
    # as from a terminal: a suite started under nohup or as a background job of a
    # script inherits SIGHUP or SIGINT ignored, and the shim keeps an ignored signal
    # ignored on purpose (nohup), so these cases would test nothing
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _start(python, mark, log, parent_shell):
    command = ("DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NODE_HOST=127.0.0.1 OMP_NUM_THREADS=1 "
               "PS_VERBOSE=0 %s %s" % (python, WORKER))
    shim = [python, "-m", "mxnet_cpsgd.cluster.mxlaunch", "-n", "2", "-s", "1",
            "--launcher", "local", command]
    if parent_shell:  # a shell that waits for the shim: the parent the test kills
        shim = ["bash", "-c", '"$@" & echo "SHIM $!"; wait', "bash"] + shim
    out = open(log, "wb")
    proc = subprocess.Popen(shim, env=dict(os.environ, **{MARK_VAR: mark}), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_default_signals)
    out.close()
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline and len(re.findall(r"JOINED \d", log.read_text())) < 2:
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    assert len(re.findall(r"JOINED \d", log.read_text())) == 2, log.read_text()[-3000:]
    return proc


def _wait_gone(pid, bound):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGHUP", "parent"])
def test_stopped_shim_stops_its_job(python, mark, tmp_path, how):
    log = tmp_path / "out.log"
    proc = _start(python, mark, log, parent_shell=how == "parent")
    try:
        if how == "parent":
            shim = int(re.search(r"SHIM (\d+)", log.read_text()).group(1))
            proc.kill()  # the shell
            proc.wait(10)
            assert _wait_gone(shim, STOP_BOUND_S), log.read_text()[-3000:]
            expected = "mxlaunch: its parent process (pid %d) is gone; stopping the job " \
                       "(4 nodes)" % proc.pid
        else:
            proc.send_signal(getattr(signal, how))
            proc.wait(STOP_BOUND_S)
            assert proc.returncode == 128 + getattr(signal, how), log.read_text()[-3000:]
            expected = "mxlaunch: received %s; stopping the job (4 nodes)" % how
        text = log.read_text()
        assert re.findall(r"mxlaunch: .*", text) == [expected], text[-3000:]
        assert "Stop launcher" not in text  # tools/launch.py's own Ctrl-C handler
        left = marked_processes(mark)
        assert not left, "nodes outlived the shim:\n" + text[-3000:]
    finally:
        kill_launched(proc, mark)
