"""kvstore='horovod': all-reduce S-SGD over Horovod/Gloo must equal ssgd.

Real jobs, no mocks: ``horovodrun -np 2 -H localhost:2 --gloo`` for the Horovod
runs and :func:`mxnet_cpsgd.launch.run_job` (scheduler, server, 2 workers on
loopback) for the ssgd baseline, all running ``tests/workers/horovod_worker.py``
with the same model, optimizer, per-rank data and ``trainer.step(B)``.

Tolerance: ``rtol=1e-5, atol=1e-6`` on the final weights after 12 steps.  Both
sides compute ``g_0 + g_1`` (exact in any order for two addends) and the same
MXNet ``sgd_mom_update``, so in practice they agree to the bit; the tolerance
only allows for a different float summation order in another Horovod/Gloo
build.

The tests that need Horovod skip where ``horovod.mxnet`` is not importable (the
optional extra is not installed); the missing-Horovod message test always runs.
Every process a test starts carries a unique HOROVOD_TEST_TAG in its environment
and is SIGKILLed at the end of the test, pass or fail; horovodrun runs in its own
process group, killed as a whole on timeout.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings

import numpy as np
import pytest
from procs import kill_marked, processes_with_env, shows_horovod_crash

try:  # a generous per-test bound where pytest-timeout is installed
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(300)]
except ImportError:
    pytestmark = []

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS_DIR)
WORKER = os.path.join(TESTS_DIR, "workers", "horovod_worker.py")
TAG_VAR = "HOROVOD_TEST_TAG"
#: one thread per process: the test machine may have 2 cores
NODE_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
RTOL, ATOL = 1e-5, 1e-6
JOB_TIMEOUT = 180


# ------------------------------------------------------------------ processes
def _tagged(tag):
    """pids of live processes carrying TAG_VAR=tag (zombies excluded)."""
    return processes_with_env(**{TAG_VAR: tag})


def _kill_tagged(tag):
    kill_marked(**{TAG_VAR: tag})


@pytest.fixture
def tag():
    """A unique tag for this test's processes; they are all killed afterwards."""
    value = uuid.uuid4().hex
    yield value
    _kill_tagged(value)


@pytest.fixture
def out_dir():
    path = tempfile.mkdtemp(prefix="cpsgd-hvd-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def horovodrun():
    """The horovodrun next to this Python; skips where Horovod is not installed."""
    pytest.importorskip("horovod.mxnet")
    exe = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(exe):
        pytest.skip("horovod.mxnet imports but %s does not exist" % exe)
    return exe


def _env(tag):
    env = dict(os.environ)
    env.update(NODE_ENV)
    # Gloo's rendezvous and collectives give up after 30 s by default: on a loaded
    # machine one rank can spend longer importing MXNet than the other
    env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(JOB_TIMEOUT - 30))
    env[TAG_VAR] = tag
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


def _run_group(cmd, env, timeout):
    """Run ``cmd`` in its own process group; kill the whole group on timeout.

    Returns (returncode, output); returncode None means it timed out.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, cwd=REPO, start_new_session=True,
                            universal_newlines=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_horovod_job(cmd, env, timeout):
    """``_run_group(cmd, env, timeout)``, run once more after a kernel crash: for a job
    that a module fixture runs for many tests (a fixture's error is cached, so the
    test-level rerun of tests/horovod_rerun.py would not repeat the job; a test's own
    job is left to that rerun).

    A job whose output shows :data:`procs.HOROVOD_CRASH` is repeated once, with a warning
    that keeps the first output's tail; any other failure (wrong results, a
    timeout, an error of ours) is returned as it is, and so is a second crash.
    """
    code, out = _run_group(cmd, env, timeout)
    if code not in (0, None) and shows_horovod_crash(out):
        warnings.warn("horovod job crashed inside MXNet (exit %s); running it once more. "
                      "First output:\n%s" % (code, out[-3000:]))
        code, out = _run_group(cmd, env, timeout)
    return code, out


def run_horovod(horovodrun, mode, init, out_dir, tag):
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
           sys.executable, WORKER, mode, init, out_dir]
    code, out = _run_group(cmd, _env(tag), JOB_TIMEOUT)
    assert code == 0, "horovodrun %s %s %s:\n%s" % (
        mode, init, "timed out" if code is None else "exited %s" % code, out[-6000:])
    return load(out_dir, mode, init, out)


def run_ssgd(init, out_dir, tag):
    from mxnet_cpsgd.launch import run_job
    env = dict(NODE_ENV)
    env[TAG_VAR] = tag
    result = run_job([sys.executable, WORKER, "ssgd", init, out_dir], 2, num_servers=1,
                     env=env, timeout=30, job_timeout=JOB_TIMEOUT, stream=None)
    assert result.returncode == 0 and not result.failure, \
        "ssgd job failed (%r, %r):\n%s" % (result.returncode, result.failure,
                                           result.output[-6000:])
    return load(out_dir, "ssgd", init, result.output)


def load(out_dir, mode, init, output):
    ranks = []
    for r in range(2):
        path = os.path.join(out_dir, "%s-%s-rank%d.npz" % (mode, init, r))
        assert os.path.exists(path), "%s %s rank %d wrote nothing:\n%s" % (
            mode, init, r, output[-6000:])
        with np.load(path) as f:
            ranks.append({k: f[k] for k in f.files})
    return ranks


def assert_same(actual, expected, what):
    assert sorted(actual) == sorted(expected), what
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=RTOL, atol=ATOL,
                                   err_msg="%s: %s" % (what, name))


_SSGD = {}


@pytest.fixture(scope="module")
def ssgd_weights():
    """``ssgd_weights(init)``: final weights of a 2-worker ssgd job (one job per init)."""
    def get(init):
        if init not in _SSGD:
            tag = uuid.uuid4().hex
            path = tempfile.mkdtemp(prefix="cpsgd-hvd-ssgd-")
            try:
                ranks = run_ssgd(init, path, tag)
            finally:
                _kill_tagged(tag)
                shutil.rmtree(path, ignore_errors=True)
            # both ssgd workers hold the servers' weights
            assert_same(ranks[1], ranks[0], "ssgd %s: rank 1 vs rank 0" % init)
            _SSGD[init] = ranks[0]
        return _SSGD[init]
    return get


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("mode,init", [
    # the main case: every worker starts from the same weights
    ("kvstore", "same"),
    ("trainer", "same"),
    # ranks start from different weights: only the store's broadcast of rank 0's
    # weights makes them agree, and (as with ssgd) it happens at the first step
    ("kvstore", "rank"),
])
def test_horovod_matches_ssgd(horovodrun, ssgd_weights, mode, init, out_dir, tag):
    """kvstore='horovod' and distributed_trainer() end where 2-worker ssgd ends."""
    expected = ssgd_weights(init)
    ranks = run_horovod(horovodrun, mode, init, out_dir, tag)
    assert_same(ranks[1], ranks[0], "%s %s: rank 1 vs rank 0" % (mode, init))
    assert_same(ranks[0], expected, "%s %s vs ssgd" % (mode, init))
    diff = max(float(np.abs(ranks[0][n] - expected[n]).max()) for n in expected)
    print("%s %s vs ssgd: max |difference| %.3g" % (mode, init, diff))


def test_store_api_two_processes(horovodrun, tag):
    """broadcast / pushpull semantics of the store itself, on 2 Horovod processes."""
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, "api"]
    code, out = _run_group(cmd, _env(tag), JOB_TIMEOUT)
    assert code == 0, out[-6000:]
    assert "api ok rank=0 size=2" in out and "api ok rank=1 size=2" in out, out[-6000:]


def test_store_api_single_process(horovodrun, tag):
    """Without horovodrun Horovod runs one process of size 1; the store still works."""
    code, out = _run_group([sys.executable, WORKER, "api"], _env(tag), JOB_TIMEOUT)
    assert code == 0 and "api ok rank=0 size=1" in out, out[-6000:]


def _python_c(code, tag, timeout=120, extra_env=None):
    env = _env(tag)
    env.update(extra_env or {})
    return _run_group([sys.executable, "-c", code], env, timeout)


HIDE_HOROVOD = "import sys; sys.modules['horovod'] = None  # make the optional import fail\n"

MISSING_HOROVOD = HIDE_HOROVOD + r"""
import mxnet as mx
from mxnet import autograd, gluon
import mxnet_cpsgd
assert 'horovod' in mxnet_cpsgd.ALGORITHMS, mxnet_cpsgd.ALGORITHMS
net = gluon.nn.Dense(2, in_units=3)
net.initialize()
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                        kvstore='horovod')
with autograd.record():
    loss = net(mx.nd.ones((1, 3))).sum()
loss.backward()
try:
    trainer.step(1)
except ImportError as err:
    print('IMPORT ERROR:', err)
    sys.exit(0)
print('NO ERROR')
sys.exit(1)
"""


def test_missing_horovod_says_how_to_install(tag):
    from mxnet_cpsgd.stores.allreduce.horovod import INSTALL_HINT
    code, out = _python_c(MISSING_HOROVOD, tag)
    assert code == 0, out[-4000:]
    assert "IMPORT ERROR: kvstore 'horovod' needs Horovod" in out, out[-4000:]
    assert INSTALL_HINT in out, out[-4000:]
    assert "horovodrun -np 2 -H localhost:2 --gloo" in out, out[-4000:]


def test_import_does_not_import_horovod(tag):
    code, out = _python_c(
        "import sys, mxnet_cpsgd, mxnet_cpsgd.stores.allreduce.horovod as h\n"
        "assert h.Horovod.__name__ == 'Horovod'\n"
        "import mxnet as mx\n"
        "assert mx.kv.KVStoreBase.kv_registry['horovod'] is h.Horovod\n"
        "assert not [m for m, mod in sys.modules.items()\n"
        "            if m.split('.')[0] == 'horovod' and mod is not None], "
        "sorted(m for m in sys.modules if 'horovod' in m)\n"
        "print('OK')\n", tag)
    assert code == 0 and "OK" in out, out[-4000:]


def test_knob_in_environment_is_rejected(tag):
    """MXNET_CPSGD_* knobs are checked before Horovod is imported."""
    code, out = _python_c(
        HIDE_HOROVOD +
        "import mxnet as mx, mxnet_cpsgd\n"
        "try:\n"
        "    mx.kv.create('horovod')\n"
        "except mxnet_cpsgd.ConfigError as err:\n"
        "    print('CONFIG ERROR:', err); sys.exit(0)\n"
        "sys.exit(1)\n", tag, extra_env={"MXNET_CPSGD_THRESHOLD": "0.5"})
    assert code == 0, out[-4000:]
    assert "MXNET_CPSGD_THRESHOLD is not used by kvstore 'horovod'" in out, out[-4000:]


def test_compression_params_are_rejected(horovodrun, tag):
    """Any compression_params knob fails with a clear error (one process, size 1)."""
    code, out = _python_c(
        "import sys, mxnet as mx, mxnet_cpsgd\n"
        "from mxnet import autograd, gluon\n"
        "net = gluon.nn.Dense(2, in_units=3)\n"
        "net.initialize()\n"
        "trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},\n"
        "                        kvstore='horovod', compression_params={'threshold': 0.5})\n"
        "with autograd.record():\n"
        "    loss = net(mx.nd.ones((1, 3))).sum()\n"
        "loss.backward()\n"
        "try:\n"
        "    trainer.step(1)\n"
        "except mxnet_cpsgd.ConfigError as err:\n"
        "    print('CONFIG ERROR:', err); sys.exit(0)\n"
        "print('NO ERROR'); sys.exit(1)\n", tag)
    assert code == 0, out[-4000:]
    assert "compression_params['threshold'] is not used by kvstore 'horovod'; " \
           "it accepts: no settings" in out, out[-4000:]


# ----------------------------------------------------------------------------
# a rendezvous service that starts after the workers

_RANK_SCRIPT = ("import mxnet as mx, mxnet_cpsgd; kv = mx.kv.create('horovod'); "
                "print('rank', kv.rank, 'of', kv.num_workers, flush=True)")


def _start(cmd, env):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=REPO, start_new_session=True, universal_newlines=True)


def test_workers_wait_for_a_late_rendezvous(horovodrun, tag):
    """Workers started 15 s before the rendezvous service (a loaded machine, a cold
    import of Horovod) wait for it instead of aborting in Horovod's HTTP client."""
    from mxnet_cpsgd.cluster.launch import _horovod_env, free_port
    port = free_port()
    procs = []
    for rank in range(2):
        env = _env(tag)
        env.update(_horovod_env(rank, ["localhost"] * 2, "127.0.0.1", port, own_hosts=False))
        procs.append(_start([sys.executable, "-c", _RANK_SCRIPT], env))
    time.sleep(15)
    assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
    server = _start([sys.executable, "-m", "mxnet_cpsgd.cluster.rendezvous", "--port",
                     str(port), "--hosts", "localhost,localhost"], _env(tag))
    try:
        outs = [p.communicate(timeout=JOB_TIMEOUT)[0] for p in procs]
        for rank, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode == 0, out[-3000:]
            assert "rank %d of 2" % rank in out, out[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_missing_rendezvous_fails_with_a_message(horovodrun, tag):
    from mxnet_cpsgd.cluster.launch import _horovod_env, free_port
    env = _env(tag)
    env.update(_horovod_env(0, ["localhost"], "127.0.0.1", free_port(), own_hosts=False))
    env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "2"
    code, out = _run_group([sys.executable, "-c", _RANK_SCRIPT], env, JOB_TIMEOUT)
    assert code not in (0, None), out
    assert "rendezvous service at 127.0.0.1:" in out and "within 2 s" in out, out[-3000:]
