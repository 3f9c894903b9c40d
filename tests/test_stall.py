"""Stalled nodes and restarts (cpsgd-launch --stall-timeout, --max-restarts) on
real loopback ps-lite jobs: nodes SIGSTOPped, workers that stop reporting
progress, slow phases that must not count as a stall, jobs started again.

Stall timeouts are a few seconds here; every job also has a --job-timeout so
that a missed stall fails the test instead of hanging it.
"""
import os
import re
import signal
import sys
import threading
import time

import pytest
from procs import MARK_VAR, TimedStream, marked_processes, processes_with_env, repo_pythonpath

from mxnet_cpsgd.launch import LaunchError, main, run_job

try:  # a generous per-test bound where pytest-timeout is installed
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(180)]
except ImportError:
    pytestmark = []

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
#: the project's bound for a failure to end a job; a missed stall runs into --job-timeout
BOUND_S = 60

# dist_sync steps forever, each reported as progress (every 0.2 s at most).
KV_STEPS = r"""
import mxnet as mx
from kvstore_ext.progress import ProgressReporter
reporter = ProgressReporter(min_interval=0.2)
reporter.report("start", 0)
kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.ones((2, 3)))
mx.nd.waitall()
kv._barrier()
print("store up", flush=True)
out = mx.nd.zeros((2, 3))
step = 0
while True:
    kv.push(3, mx.nd.ones((2, 3)))
    kv.pull(3, out=out)
    out.wait_to_read()
    step += 1
    reporter.report("train", step)
    if step == 20 and __import__("os").environ["MXNET_CPSGD_WORKER_INDEX"] == "1":
        print("worker 1 loops forever", flush=True)
        while LOOP:
            pass
"""


def script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return [sys.executable, str(path)]


def node_env(mark, **extra):
    env = dict(NODE_ENV, PYTHONPATH=repo_pythonpath(REPO), **extra)
    env[MARK_VAR] = mark
    return env


class Background:
    """run_job in a thread (the test meanwhile stops one of its nodes)."""

    def __init__(self, *args, **kwargs):
        self.stream = TimedStream()
        self.result = None
        self.ended = None
        kwargs.update(stream=self.stream)

        def run():
            try:
                self.result = run_job(*args, **kwargs)
            finally:
                self.ended = time.monotonic()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, seconds):
        self.thread.join(seconds)
        assert not self.thread.is_alive(), "run_job still running:\n" + "\n".join(
            line for _, line in self.stream.lines[-40:])
        return self.result


def role_pid(mark, role):
    pids = [p for p in marked_processes(mark) if p in processes_with_env(DMLC_ROLE=role)]
    assert len(pids) == 1, (role, pids)
    return pids[0]


def worker_pid(mark, index):
    pids = [p for p in processes_with_env(MXNET_CPSGD_WORKER_INDEX=str(index))
            if p in marked_processes(mark)]
    assert len(pids) == 1, (index, pids)
    return pids[0]


@pytest.mark.parametrize("victim", ["worker 1", "server 0", "scheduler"])
def test_stopped_node_ends_the_job(tmp_path, mark, victim):
    """SIGSTOP of a worker, a server or the scheduler: the job ends with one
    line naming the node and what it last did (the scheduler is not needed
    for the steps: only its stopped state can tell)."""
    job = Background(script(tmp_path, "steps.py", KV_STEPS.replace("step == 20", "False")),
                     2, 1, env=node_env(mark), timeout=10, job_timeout=150, stall_timeout=3)
    assert job.stream.wait_for(["[worker 0] store up", "[worker 1] store up"], 120), \
        "\n".join(line for _, line in job.stream.lines)
    time.sleep(1)  # a few steps
    pid = worker_pid(mark, 1) if victim == "worker 1" else role_pid(mark, victim.split()[0])
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    result = job.join(BOUND_S + 30)
    took = job.ended - stopped
    noticed = next(t for t, line in job.stream.lines if "stopping the job" in line) - stopped
    print("%s SIGSTOPped: stall reported after %.1f s, job ended after %.1f s (stall "
          "timeout 3 s)" % (victim, noticed, took))
    assert result.returncode == 1, result.output[-3000:]
    pattern = r"^%s made no progress for \d+\.\d s: its process is stopped \(state T\)" \
        r"( and no worker reports progress)?" % victim
    if victim == "worker 1":
        pattern += r" \(last report: phase train step \d+, \d+\.\d s ago\)"
    assert re.match(pattern + "; stopping the job$", result.failure), result.failure
    assert [line for line in result.output.splitlines() if "stopping the job" in line] == \
        ["cpsgd-launch: " + result.failure]
    assert "[cpsgd-progress]" not in result.output
    assert took < BOUND_S
    assert marked_processes(mark) == []


def test_worker_that_stops_progressing_ends_the_job(tmp_path, mark):
    """Worker 1 loops forever in Python after step 20 (running, not stopped):
    no worker reports progress any more; the busy one is named."""
    job = Background(script(tmp_path, "loop.py", "LOOP = True\n" + KV_STEPS), 2, 1,
                     env=node_env(mark), timeout=10, job_timeout=150, stall_timeout=3)
    result = job.join(150 + 30)
    assert result.returncode == 1, result.output[-3000:]
    assert "[worker 1] worker 1 loops forever" in result.output
    assert re.match(r"^worker 1 made no progress for \d+\.\d s: no worker reports progress, "
                    r"and it kept a CPU busy \(last report: phase train step \d+, \d+\.\d s ago\); "
                    r"stopping the job$", result.failure), result.failure
    assert marked_processes(mark) == []


# Worker 0 reports a slow start, trains (steps slowing down beyond the stall
# timeout, each at most 3 times the longest gap before), evaluates (reporting) for longer than
# the stall timeout, then one slow evaluation batch and a slow save, then
# exits 0; worker 1 never reports and sleeps meanwhile.  No store: servers
# and scheduler only wait.  Every silence is longer than the stall timeout T (a
# watch without the phase's allowance would stop the job) and at least 0.25 T
# shorter than the allowance (start, eval, save: 4 T; train: 3 x the longest gap).
SLOW_PHASES = r"""
import os, sys, time
from kvstore_ext.progress import ProgressReporter
T = float(sys.argv[1])
reporter = ProgressReporter(min_interval=0.1)
if os.environ["MXNET_CPSGD_WORKER_INDEX"] == "1":
    time.sleep(6 * T)
    sys.exit(0)
reporter.report("start", 0)
time.sleep(1.5 * T)                 # a slow first step
for step in range(1, 6):
    time.sleep(0.2)
    reporter.report("train", step)
# steps that get slower (a slow network): 0.75 T within T, then 1.5 T and 2 T
for step, gap in ((6, 0.75), (7, 1.5), (8, 2.0)):
    time.sleep(gap * T)
    reporter.report("train", step)
for batch in range(1, int(1.5 * T / 0.4) + 1):  # a long evaluation pass, reporting
    time.sleep(0.4)
    reporter.report("eval", batch)
time.sleep(1.5 * T)                 # one slow evaluation batch
reporter.report("save", 8)
time.sleep(1.5 * T)                 # a slow checkpoint
reporter.report("train", 9)
print("done", flush=True)
"""


def test_slow_start_eval_and_save_are_no_stall(tmp_path, mark):
    result = run_job(script(tmp_path, "slow.py", SLOW_PHASES) + ["2"], 2, 1,
                     env=node_env(mark), timeout=10, job_timeout=150, stall_timeout=2,
                     stream=None)
    assert result.returncode == 0, result.output[-3000:]
    assert "[worker 0] done" in result.output
    assert "[cpsgd-progress]" not in result.output
    assert marked_processes(mark) == []


# Fails on the first attempt; the second checks that it is the first restart.
FAIL_ONCE = r"""
import os, sys
restart = os.environ.get("MXNET_CPSGD_RESTART")
print("attempt with MXNET_CPSGD_RESTART=%s" % restart, flush=True)
if restart is None and os.environ["MXNET_CPSGD_WORKER_INDEX"] == "1":
    raise ValueError("first attempt fails")
sys.exit(0 if restart in (None, "1") else 7)
"""


def test_restart_after_a_failure(tmp_path, mark):
    log_dir = tmp_path / "logs"
    result = run_job(script(tmp_path, "once.py", FAIL_ONCE), 2, 1, env=node_env(mark),
                     timeout=10, job_timeout=150, max_restarts=2, log_dir=str(log_dir),
                     stream=None)
    assert result.returncode == 0, result.output[-3000:]
    assert result.restarts == 1 and result.failure is None
    lines = result.output.splitlines()
    assert "cpsgd-launch: restart 1 of 2 (MXNET_CPSGD_RESTART=1) after: worker 1 exited with " \
           "code 1 after raising ValueError: first attempt fails; stopping the job" in lines
    assert lines.count("[worker 1] attempt with MXNET_CPSGD_RESTART=1") == 1
    assert lines[-1] == "cpsgd-launch: job finished successfully"
    # the node logs hold both attempts
    assert "MXNET_CPSGD_RESTART=None" in (log_dir / "worker-1.log").read_text()
    assert "MXNET_CPSGD_RESTART=1" in (log_dir / "worker-1.log").read_text()
    assert marked_processes(mark) == []


def test_restarts_run_out(tmp_path, mark):
    result = run_job([sys.executable, "-c", "import sys; sys.exit(5)"], 1, 1,
                     env=node_env(mark), timeout=10, job_timeout=150, max_restarts=1,
                     stream=None)
    assert result.returncode == 5 and result.restarts == 1
    assert result.failure == "worker 0 exited with code 5; stopping the job"
    assert result.output.splitlines()[-1] == "cpsgd-launch: giving up after 1 restart"
    assert marked_processes(mark) == []


def test_no_restart_after_the_job_timeout(mark):
    result = run_job([sys.executable, "-c", "import time; time.sleep(60)"], 1, 1,
                     env=node_env(mark), timeout=10, job_timeout=3, max_restarts=3,
                     stream=None)
    assert result.returncode == 1 and result.restarts == 0
    assert result.failure == "job timeout of 3 s expired; stopping the job"
    assert marked_processes(mark) == []


@pytest.mark.parametrize("kwargs,message", [
    (dict(stall_timeout=-1), "stall timeout must be >= 0"),
    (dict(max_restarts=-1), "max restarts must be an integer >= 0"),
    (dict(connect_timeout=-1), "connect timeout must be >= 0"),
    (dict(env={"MXNET_CPSGD_RESTART": "1"}), "MXNET_CPSGD_RESTART is set by the launcher"),
])
def test_bad_stall_and_restart_input(kwargs, message):
    args = dict(command=[sys.executable, "-c", "pass"], num_workers=1, stream=None)
    args.update(kwargs)
    with pytest.raises(LaunchError, match=message):
        run_job(**args)


def test_cli_restart(tmp_path, mark, capsys):
    (tmp_path / "once.py").write_text(FAIL_ONCE)
    old = os.environ.get(MARK_VAR)
    code = main(["-n", "2", "-s", "1", "--max-restarts", "1", "--stall-timeout", "5",
                 "--timeout", "10", "--env", "%s=%s" % (MARK_VAR, mark),
                 "--env", "PYTHONPATH=" + REPO, "--", sys.executable, str(tmp_path / "once.py")])
    assert old == os.environ.get(MARK_VAR)
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "cpsgd-launch: restart 1 of 1 (MXNET_CPSGD_RESTART=1)" in out
    assert marked_processes(mark) == []


# An unchanged Gluon script (it knows nothing of progress reports): the
# launcher's worker_site hook reports its Trainer steps, marked as inferred.
# Worker 1 then sleeps after its steps, the other waits for it: silence after
# inferred reports is no stall (the hook cannot see an evaluation pass); the
# test SIGSTOPs worker 1 and reads its last step in the failure line.
GLUON_STEPS = r"""
import os, time, mxnet as mx
from mxnet import autograd, gluon
net = gluon.nn.Dense(2, in_units=3)
net.initialize(mx.init.Constant(0.1))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                        kvstore="dist_sync")
x = mx.nd.ones((4, 3))
for step in range(1, 8):
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(4)
    mx.nd.waitall()
    time.sleep(0.2)
print("trained 7 steps", flush=True)
if os.environ["MXNET_CPSGD_WORKER_INDEX"] == "1":
    time.sleep(300)
trainer.step(4)  # waits for worker 1's push
"""


def test_unchanged_gluon_script_reports_its_steps(tmp_path, mark):
    job = Background(script(tmp_path, "gluon_steps.py", GLUON_STEPS), 2, 1,
                     env=node_env(mark), timeout=10, job_timeout=150, stall_timeout=2)
    assert job.stream.wait_for(["[worker 0] trained 7 steps", "[worker 1] trained 7 steps"],
                               120), "\n".join(line for _, line in job.stream.lines)
    time.sleep(6)  # 3 stall timeouts of silence after inferred reports: no stall
    assert job.thread.is_alive(), "\n".join(line for _, line in job.stream.lines)
    os.kill(worker_pid(mark, 1), signal.SIGSTOP)
    result = job.join(BOUND_S + 30)
    assert result.returncode == 1, result.output[-3000:]
    assert re.match(r"^worker 1 made no progress for \d+\.\d s: its process is stopped "
                    r"\(state T\) \(last report: phase train step \d+, \d+\.\d s ago\); "
                    r"stopping the job$", result.failure), result.failure
    assert "[cpsgd-progress]" not in result.output
    assert marked_processes(mark) == []


# Every worker points ps-lite at a port where no scheduler listens, as a firewall
# or the wrong interface would: MXNet's mx.kv.create then waits forever.
UNREACHABLE_SCHEDULER = r"""
import os, socket
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
os.environ["DMLC_PS_ROOT_PORT"] = str(probe.getsockname()[1])
probe.close()
import mxnet as mx
print("joining", flush=True)
kv = mx.kv.create("dist_sync")
print("joined", flush=True)
"""


def test_workers_that_cannot_reach_the_scheduler_end_the_job(tmp_path, mark):
    """The workers wait in mx.kv.create (phase connect, reported by the
    launcher's worker site): after --connect-timeout the job ends naming them,
    nothing left; the stall timeout alone would not end it (no report but
    connect's)."""
    started = time.monotonic()
    result = run_job(script(tmp_path, "unreachable.py", UNREACHABLE_SCHEDULER), 2, 1,
                     env=node_env(mark), stream=None, timeout=10, job_timeout=150,
                     stall_timeout=1, connect_timeout=6)
    took = time.monotonic() - started
    print("unreachable scheduler: job ended after %.1f s (connect timeout 6 s)" % took)
    assert result.returncode == 1, result.output[-3000:]
    assert re.match(r"^worker \d(, worker \d)* waited \d+\.\d s in mx\.kv\.create for the "
                    r"job's other nodes to register with the scheduler \(.*--connect-timeout "
                    r"sets the wait\); stopping the job$", result.failure), result.failure
    assert "[worker 0] joining" in result.output and "joined" not in result.output
    assert "[cpsgd-progress]" not in result.output
    assert marked_processes(mark) == []


def test_restart_after_a_stall(tmp_path, mark):
    """SIGSTOP of the server, --max-restarts 1: the stalled job is torn down
    and started again; the second attempt (MXNET_CPSGD_RESTART=1) succeeds."""
    text = "import os, sys\nif os.environ.get('MXNET_CPSGD_RESTART') == '1':\n" \
           "    print('restarted', flush=True)\n    sys.exit(0)\n" \
           + KV_STEPS.replace("step == 20", "False")
    job = Background(script(tmp_path, "steps.py", text), 2, 1, env=node_env(mark), timeout=10,
                     job_timeout=150, stall_timeout=3, max_restarts=1)
    assert job.stream.wait_for(["[worker 0] store up", "[worker 1] store up"], 120), \
        "\n".join(line for _, line in job.stream.lines)
    os.kill(role_pid(mark, "server"), signal.SIGSTOP)
    result = job.join(BOUND_S + 60)
    assert result.returncode == 0 and result.restarts == 1, result.output[-3000:]
    assert re.search(r"^cpsgd-launch: restart 1 of 1 \(MXNET_CPSGD_RESTART=1\) after: server 0 "
                     r"made no progress for \d+\.\d s: its process is stopped", result.output,
                     re.M), result.output[-3000:]
    assert "[worker 0] restarted" in result.output and "[worker 1] restarted" in result.output
    assert marked_processes(mark) == []


# Reports a train step every 0.2 s for about 9 s, then exits 0.
STEADY = r"""
import time
from kvstore_ext.progress import ProgressReporter
reporter = ProgressReporter(min_interval=0.1)
print("reporting", flush=True)
for step in range(45):
    reporter.report("train", step)
    time.sleep(0.2)
print("done", flush=True)
"""


def test_stopped_launcher_raises_no_false_alarm(tmp_path, mark):
    """The launcher itself SIGSTOPped for 2 stall timeouts while its workers
    keep reporting: once continued, it must not take the silence it did not
    watch for a stall (the reports wait unread in the pipes); the workers go on
    reporting for about 4 s after that."""
    import subprocess
    (tmp_path / "steady.py").write_text(STEADY)
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark})
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mxnet_cpsgd.launch", "-n", "2", "-s", "1", "--stall-timeout",
         "2", "--timeout", "10", "--job-timeout", "120", "--", sys.executable,
         str(tmp_path / "steady.py")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while sum("reporting" in line for line in lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        launcher.send_signal(signal.SIGSTOP)
        time.sleep(4)
        launcher.send_signal(signal.SIGCONT)
        code = launcher.wait(120)
        reader.join(5)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    text = "".join(lines)
    assert code == 0, text[-3000:]
    assert "[worker 1] done" in text and "stopping the job" not in text
    assert marked_processes(mark) == []
