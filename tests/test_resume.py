"""Save and resume a real 2-worker job: trainer.save_states / trainer.load_states.

Every test runs real jobs on loopback (tests/workers/resume_worker.py): a small
two-layer Gluon net, SGD with momentum 0.9 on the servers, a different data
stream per worker, fixed per iteration.  Run A trains N iterations without a
stop; run B trains K iterations, saves ``net.save_parameters`` and
``trainer.save_states`` on every worker, and exits; run C is a new job that loads
both and trains on to N.

What a states file can restore, and what it cannot:

* restored: the per-parameter iteration counters (warm-up and the k-step
  correction schedule depend on them), each worker's own weights and the global
  weights it holds, the local optimizer's state (momentum of Opt_l), and the
  servers' weights and optimizer state (server momentum);
* not restored: MXNet's 2-bit residual.  MXNet keeps it in a C++ buffer that
  can be neither read nor written from Python, so a resumed run starts it at
  zero.  A resume is therefore bit-exact whenever the residual is zero at the
  stop: for algorithms that never compress (ssgd, odsgd), and for cpsgd when K
  lies inside the warm-up (no compressed push yet).  After compressed rounds the
  resumed run differs from A by what the lost residual would still have
  contributed: less than tau per element and worker (see
  ``test_cpsgd_resume_after_compressed_rounds`` for the bound used).

Run C follows the documented procedure as a user writes it: net.load_parameters,
gluon.Trainer, trainer.load_states (before any trainer.step; it initialises the
store), then training.
"""
import os
import pickle

import numpy as np
import pytest

ITERS = 10
LR, MOMENTUM, BATCH, WORKERS = 0.05, 0.9, 8, 2   # as in resume_worker.py
CPSGD_KNOBS = '{"warmup_steps": 4, "correction_period": 3, "threshold": 0.1}'
TAU = 0.1
K_WARMUP = 3     # inside warm-up: no compressed push before the stop
K_COMPRESSED = 7  # after compressed rounds 4 and 6 (5 is a correction round: (5+1) % 3 == 0)


def _job(worker_job, algo, knobs, out, *args, servers=1):
    result = worker_job("resume_worker.py", "--algo", algo, "--knobs", knobs, "--out", out,
                        *args, num_servers=servers, job_timeout=120)
    assert result.returncode == 0, result.text
    assert not result.leftover, result.leftover
    return result


def _final(out):
    return [dict(np.load(os.path.join(out, "final-rank%d.npz" % r))) for r in range(WORKERS)]


def _max_abs_diff(run_a, run_c):
    return max(float(np.max(np.abs(a[n] - c[n]))) for a, c in zip(run_a, run_c) for n in a)


def _assert_close(run_a, run_c, rtol):
    for rank, (a, c) in enumerate(zip(run_a, run_c)):
        assert sorted(a) == sorted(c)
        for name in a:
            np.testing.assert_allclose(c[name], a[name], rtol=rtol, atol=0,
                                       err_msg="rank %d %s" % (rank, name))


def _load_blob(path):
    import mxnet  # noqa: F401 - states files hold pickled NDArrays
    with open(path, "rb") as f:
        return pickle.load(f)


def _same(saved, reloaded, where="states", skip=()):
    """Deep, bitwise comparison of two states files' contents; returns differences
    (dict entries named in ``skip`` are not compared)."""
    import mxnet as mx
    if isinstance(saved, bytes) and isinstance(reloaded, bytes):
        if saved == reloaded:
            return []
        try:
            saved, reloaded = pickle.loads(saved), pickle.loads(reloaded)
        except Exception:  # noqa: BLE001 - plain bytes that differ
            return [where]
    if isinstance(saved, mx.optimizer.Optimizer):
        return []  # the Trainer's pickled optimizer: not state (gluon ignores it on load)
    if isinstance(saved, mx.nd.NDArray):
        saved, reloaded = saved.asnumpy(), reloaded.asnumpy()
    if isinstance(saved, np.ndarray):
        same = saved.shape == reloaded.shape and saved.dtype == reloaded.dtype \
            and np.array_equal(saved, reloaded)
        return [] if same else [where]
    if isinstance(saved, dict):
        if set(saved) != set(reloaded):
            return ["%s keys %s != %s" % (where, sorted(saved), sorted(reloaded))]
        return [d for k in saved if k not in skip
                for d in _same(saved[k], reloaded[k], "%s[%r]" % (where, k), skip)]
    if isinstance(saved, (list, tuple)):
        if len(saved) != len(reloaded):
            return ["%s length" % where]
        return [d for i, (s, r) in enumerate(zip(saved, reloaded))
                for d in _same(s, r, "%s[%d]" % (where, i), skip)]
    return [] if saved == reloaded else ["%s: %r != %r" % (where, saved, reloaded)]


#: read back from the servers right after load_states, the servers' weights are
#: still those of the broadcast (see test_save_right_after_load_keeps_server_weights)
LAZY = ("server_weights",)


def _assert_restored(run_b, run_c, k, skip=LAZY):
    """Run C saved its states again right after load_states: the file must equal
    the one it loaded (every worker: counters, weights, global weights, local
    optimizer state; and the servers' optimizer state read back from the
    servers), bit for bit, and the iteration counter must be K."""
    for rank in range(WORKERS):
        saved = _load_blob(os.path.join(run_b, "ckpt-%d-rank%d.states" % (k, rank)))
        reloaded = _load_blob(os.path.join(run_c, "reloaded-rank%d.states" % rank))
        assert set(reloaded["steps"].values()) == {k}, reloaded["steps"]
        differences = _same(saved, reloaded, skip=skip)
        assert not differences, "rank %d: state after load_states differs from the " \
                                "saved state in %s" % (rank, differences)


@pytest.fixture(scope="module")
def cpsgd_runs(worker_job, tmp_path_factory):
    """Run A (uninterrupted) and run B (saves at K_WARMUP and K_COMPRESSED, stops)."""
    run_a = str(tmp_path_factory.mktemp("cpsgd-A"))
    run_b = str(tmp_path_factory.mktemp("cpsgd-B"))
    _job(worker_job, "cpsgd", CPSGD_KNOBS, run_a, "--iters", ITERS)
    _job(worker_job, "cpsgd", CPSGD_KNOBS, run_b, "--iters", K_COMPRESSED,
         "--save-at", K_WARMUP, K_COMPRESSED)
    return run_a, run_b


def _resume(worker_job, algo, knobs, run_b, out, k, *extra, servers=1):
    """Run C: a new job resuming from run B's files at K, writing to ``out``."""
    return _job(worker_job, algo, knobs, str(out), "--iters", ITERS, "--resume-from", k,
                "--ckpt-dir", run_b, *extra, servers=servers)


def test_cpsgd_resume_in_warmup_is_exact(worker_job, cpsgd_runs, tmp_path):
    """K inside warm-up: the residual is still zero at the stop, so nothing is
    lost and C must end where A ends (float tolerance 1e-6 relative; in practice
    bit-identical).  After the resume C goes through the end of warm-up, a
    compressed round and a correction round: a wrong step counter, local
    momentum or server momentum would change the result."""
    run_a, run_b = cpsgd_runs
    _resume(worker_job, "cpsgd", CPSGD_KNOBS, run_b, tmp_path, K_WARMUP)
    _assert_restored(run_b, tmp_path, K_WARMUP)
    _assert_close(_final(run_a), _final(tmp_path), rtol=1e-6)


def test_cpsgd_resume_without_load_states_differs(worker_job, cpsgd_runs, tmp_path):
    """Control: loading only the parameters (no trainer.load_states) restarts the
    step counter (warm-up again) and the momenta at zero, and must end elsewhere;
    otherwise the exactness test above could not fail."""
    run_a, run_b = cpsgd_runs
    _resume(worker_job, "cpsgd", CPSGD_KNOBS, run_b, tmp_path, K_WARMUP, "--no-load-states")
    diff = _max_abs_diff(_final(run_a), _final(tmp_path))
    print("without load_states: max |A - C| = %g" % diff)
    assert diff > 1e-3


@pytest.fixture(scope="module")
def cpsgd_resumed_late(worker_job, cpsgd_runs, tmp_path_factory):
    """Run C from K_COMPRESSED."""
    run_c = tmp_path_factory.mktemp("cpsgd-C-late")
    _resume(worker_job, "cpsgd", CPSGD_KNOBS, cpsgd_runs[1], run_c, K_COMPRESSED)
    return run_c


def test_cpsgd_resume_after_compressed_rounds(cpsgd_runs, cpsgd_resumed_late):
    """K after compressed rounds: MXNet's residual (up to tau per element and
    worker) cannot be saved, so C restarts it at zero and cannot match A exactly.

    What the lost residual can change: every element of each worker's residual
    is below tau in magnitude, and error feedback keeps each worker's total sent
    gradient within tau of its total true gradient at every round, in both runs.
    The cumulative sum the servers received therefore differs between A and C by
    at most 3 * tau per worker and element (A's residual at K, A's and C's at the
    end).  With momentum mu a gradient difference moves the weights at most
    1/(1-mu) times its size, and the servers scale by lr/batch, so
    |W_A - W_C| <= 3 * WORKERS * tau * lr / batch / (1 - mu) = 0.0375 here
    (the local step adds only a second-order term in 3 iterations).  Measured:
    about 0.007 (1.9 % of the weights' norm).  The control run without
    load_states differs by about 0.17, far beyond the bound.

    The part that can be exact is exact: the states file restores the counters
    (iteration counter = K after load), weights and both optimizers' momenta bit
    for bit (checked by saving again right after load_states).
    """
    run_a, run_b = cpsgd_runs
    _assert_restored(run_b, cpsgd_resumed_late, K_COMPRESSED)
    bound = 3 * WORKERS * TAU * LR / BATCH / (1 - MOMENTUM)
    diff = _max_abs_diff(_final(run_a), _final(cpsgd_resumed_late))
    print("resumed after compressed rounds: max |A - C| = %g (bound %g)" % (diff, bound))
    assert diff <= bound, "resumed run is %g away from the uninterrupted one (bound %g)" \
                          % (diff, bound)


@pytest.mark.parametrize("algo,knobs,k", [
    # K after warm-up: one-step-delay rounds; local momentum so that Opt_l has a state
    ("odsgd", '{"warmup_steps": 2, "local_momentum": 0.9}', 5),
    # K inside a sync period: the GLU snapshots and counters must be restored
    ("ssdsgd", '{"warmup_steps": 2, "sync_period": 3}', 6),
    ("ssgd", "{}", 5),
])
def test_uncompressed_resume_is_exact(worker_job, tmp_path_factory, algo, knobs, k):
    """No compression means no residual: the resume restores everything, and C
    must end where A ends (1e-6 relative; in practice bit-identical).  For odsgd
    K lies after warm-up, where each worker's weights differ from the global
    weights: both must be restored.  To save a job, run A also writes the
    checkpoint at K (saving only reads from the servers) and so serves as run B;
    the stop-and-exit variant is covered by the cpsgd tests."""
    run_a = str(tmp_path_factory.mktemp(algo + "-A"))
    _job(worker_job, algo, knobs, run_a, "--iters", ITERS, "--save-at", k)
    run_c = tmp_path_factory.mktemp(algo + "-C")
    _resume(worker_job, algo, knobs, run_a, run_c, k)
    _assert_restored(run_a, run_c, k)
    _assert_close(_final(run_a), _final(run_c), rtol=1e-6)


def test_save_right_after_load_keeps_server_weights(cpsgd_runs, cpsgd_resumed_late):
    """save_states works at any time: saving right after load_states must write
    the servers' weights that were just loaded (after compressed rounds each
    worker's weights differ from the servers', so a stale read shows)."""
    _assert_restored(cpsgd_runs[1], cpsgd_resumed_late, K_COMPRESSED, skip=())


def test_resume_on_more_servers_is_exact(worker_job, tmp_path_factory):
    """A states file does not depend on how the servers' keys cut the parameters:
    saved by a 1-server job, loaded by a 3-server job whose layout cuts the first
    weight (72 of 123 elements) across the servers, the resume ends where A ends;
    so does one from the same file rewritten in the earlier per-chunk format."""
    import shutil
    k = 5
    run_a = str(tmp_path_factory.mktemp("servers-A"))
    _job(worker_job, "ssgd", "{}", run_a, "--iters", ITERS, "--save-at", k)
    blob = _load_blob(os.path.join(run_a, "ckpt-%d-rank0.states" % k))
    assert blob["format"] == "mxnet-cpsgd-states-2"
    states = [entry["server_state"] for entry in blob["params"].values()]
    # one momentum value per element of each parameter, whole
    assert sorted(s.shape for s in states) == [(1, 3), (1, 12), (1, 36), (1, 72)]
    assert all(np.any(s != 0) for s in states)
    run_c = tmp_path_factory.mktemp("servers-C")
    _resume(worker_job, "ssgd", "{}", run_a, run_c, k, servers=3)
    _assert_restored(run_a, str(run_c), k)
    _assert_close(_final(run_a), _final(str(run_c)), rtol=1e-6)
    # the earlier format: one state array per chunk of the saving layout (here one chunk)
    old = str(tmp_path_factory.mktemp("servers-old-format"))
    for rank in range(WORKERS):
        name = "ckpt-%d-rank%d" % (k, rank)
        shutil.copy(os.path.join(run_a, name + ".params"), old)
        blob = _load_blob(os.path.join(run_a, name + ".states"))
        blob["format"] = "mxnet-cpsgd-states-1"
        for entry in blob["params"].values():
            entry["server_state"] = [entry["server_state"].reshape(-1)]
        with open(os.path.join(old, name + ".states"), "wb") as f:
            pickle.dump(blob, f)
    run_d = tmp_path_factory.mktemp("servers-D")
    _resume(worker_job, "ssgd", "{}", old, run_d, k, servers=3)
    _assert_close(_final(run_a), _final(str(run_d)), rtol=1e-6)
