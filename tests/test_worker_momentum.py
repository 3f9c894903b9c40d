"""momentum_path='worker' of bitsgd and cpsgd against the float64 numpy reference.

The rule (tests/reference.py, docs/algorithms/cpsgd.md): every worker keeps
u = beta * (lr(t-1)/lr(t)) * u + g + wd * W / (r * M), pushes u through MXNet's
2-bit quantizer (or dense on warm-up and correction rounds), the servers run SGD
without momentum or weight decay, and CP-SGD's local step reads u (or g).

* the rule itself, in numpy: with every push dense it is S-SGD with momentum,
  with weight decay and with a learning-rate schedule;
* real 2-worker jobs: with every push dense the store equals S-SGD with momentum
  (the reference's server-momentum S-SGD and MXNet's own dist_sync) to 1e-6;
  with 2-bit compression bitsgd and cpsgd follow the reference step by step;
* save/resume keeps u;
* bad settings are refused, naming the knob.
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (HERE, os.path.join(HERE, "workers")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import jobutil  # noqa: E402
import reference as ref  # noqa: E402
from jobutil import MOMENTUM, spec  # noqa: E402
from test_equivalence import assert_same_runs  # noqa: E402
from test_reference import (ATOL, LR_SCHEDULE, RTOL, assert_nontrivial_quantization,  # noqa: E402
                            assert_reference_differs, check_against_reference,
                            schedule_lr)
from test_resume import ITERS, _assert_close, _assert_restored, _final, _job, _resume  # noqa: E402

WORKER = {"momentum_path": "worker"}
#: every push dense: BIT-SGD with a correction every iteration is S-SGD
DENSE_BITSGD = dict(WORKER, threshold=1.0, correction_period=1)
#: CP-SGD with every push dense after a 3-step warm-up (the one-step-delay local step)
DENSE_CPSGD = dict(WORKER, threshold=1.0, warmup_steps=3, correction_period=1)
#: CP-SGD with 2-bit rounds: warm-up t = 0..3, then dense when (t + 1) % 3 == 0
CPSGD_2BIT = dict(WORKER, threshold=1.0, warmup_steps=4, correction_period=3)


# ----------------------------------------------------------- the rule in numpy
def _linear_problem(num_workers, size=5, seed=0):
    """Worker i's gradient at weights w: A_i w + b_i + noise_t (depends on w)."""
    rng = np.random.RandomState(seed)
    mats = [rng.randn(size, size) * 0.3 for _ in range(num_workers)]
    offsets = [rng.randn(size) for _ in range(num_workers)]
    noise = rng.randn(50, num_workers, size)

    def grad_fn(i, t, weights):
        return {"p": mats[i].dot(weights["p"]) + offsets[i] + noise[t, i]}
    return {"p": rng.randn(size)}, grad_fn


@pytest.mark.parametrize("with_schedule", [False, True], ids=["constant-lr", "schedule"])
def test_reference_worker_momentum_dense_is_ssgd_with_momentum(with_schedule):
    """Linearity: the sum of the workers' u is the servers' momentum of S-SGD
    (divided by -lr), weight decay included, so with every push dense the
    trajectory is S-SGD with momentum; with a schedule thanks to lr(t-1)/lr(t)."""
    w0, grad_fn = _linear_problem(3)
    lr, mu, wd, batch = 0.1, 0.9, 0.05, 4
    sched = schedule_lr(lr, {"step": [6, 11], "factor": 0.3}) if with_schedule else None
    args = (w0, grad_fn, 3, 20, batch, lr, mu, wd)
    ssgd = ref.simulate("ssgd", *args, lr_schedule=sched)
    worker = ref.simulate("bitsgd", *args, knobs=dict(DENSE_BITSGD), lr_schedule=sched)
    assert worker.push_kind == ["dense"] * 20
    for t in range(21):
        np.testing.assert_allclose(worker.server[t]["p"], ssgd.server[t]["p"], rtol=1e-12,
                                   atol=1e-12, err_msg="t=%d" % t)
    moved = np.abs(ssgd.server[20]["p"] - w0["p"]).max()
    assert moved > 0.1
    # CP-SGD's servers too (gradients that do not depend on the weights: its
    # workers compute theirs at their local weights)
    fixed = [[np.random.RandomState([t, i]).randn(5) for i in range(3)] for t in range(20)]

    def fixed_fn(i, t, _):
        return {"p": fixed[t][i]}
    args = (w0, fixed_fn, 3, 20, batch, lr, mu, wd)
    ssgd = ref.simulate("ssgd", *args, lr_schedule=sched)
    cp = ref.simulate("cpsgd", *args, knobs=dict(DENSE_CPSGD), lr_schedule=sched)
    for t in range(21):
        np.testing.assert_allclose(cp.server[t]["p"], ssgd.server[t]["p"], rtol=1e-12,
                                   atol=1e-12, err_msg="t=%d" % t)
    if with_schedule:
        # the lr ratio matters: plain u = beta u + g (PyTorch's rule) is another run
        mismatch = _ptorch_rule(w0, fixed_fn, 3, 20, batch, sched, mu, wd)
        assert not np.allclose(mismatch, ssgd.server[20]["p"], rtol=1e-6, atol=1e-9)


def _ptorch_rule(w0, grad_fn, M, T, batch, lr_at, mu, wd):
    """u = mu u + g + wd-term without the lr ratio; final weights."""
    W = np.array(w0["p"], np.float64)
    u = [np.zeros_like(W) for _ in range(M)]
    for t in range(T):
        for i in range(M):
            u[i] = mu * u[i] + grad_fn(i, t, None)["p"] + wd * W * batch / M
        W = W - lr_at(t) / batch * sum(u)
    return W


def test_reference_worker_momentum_2bit_quantizes_u():
    """By hand, one worker, two steps: the quantizer sees u, not g."""
    w0 = {"p": np.array([0.0, 0.0])}
    grads = [np.array([0.6, -0.2]), np.array([0.6, 0.3])]
    traj = ref.simulate("bitsgd", w0, lambda i, t, w: {"p": grads[t]}, 1, 2, 1, 0.1, 0.5,
                        knobs={"threshold": 0.5, "momentum_path": "worker"})
    u0 = grads[0]                       # [0.6, -0.2] -> sends [0.5, 0], residual [0.1, -0.2]
    u1 = 0.5 * u0 + grads[1]            # [0.9, 0.2]; residual + u1 = [1.0, 0.0] -> [0.5, 0]
    np.testing.assert_allclose(traj.server[1]["p"], [-0.05, 0.0], atol=1e-12)
    np.testing.assert_allclose(traj.server[2]["p"], [-0.10, 0.0], atol=1e-12)
    np.testing.assert_allclose(traj.quantizers[0].residual["p"], [0.5, 0.0], atol=1e-12)
    assert np.allclose(u1, [0.9, 0.2])


# ------------------------------------------------------------- real jobs (a)
@pytest.mark.parametrize("schedule", [None, LR_SCHEDULE], ids=["constant-lr", "schedule"])
def test_bitsgd_worker_momentum_dense_equals_ssgd_with_momentum(worker_job, schedule):
    """Compression off (every push dense): the store is S-SGD with momentum, to
    1e-6 against the float64 reference of S-SGD with the servers' momentum, and
    against MXNet's own dist_sync (same data, same initial weights)."""
    extra = {"lr_schedule": schedule} if schedule else {}
    rec = jobutil.run_recording(worker_job, spec("bitsgd", DENSE_BITSGD, **extra))
    assert rec.spec["optimizer"] == MOMENTUM and MOMENTUM["wd"] > 0
    assert rec.meta[0]["config"]["momentum_path"] == "worker"
    s = rec.spec
    sched = schedule_lr(s["optimizer"]["learning_rate"], schedule) if schedule else None
    check_worker_run(rec, "ssgd", None, sched)
    base = jobutil.run_recording(worker_job, spec("dist_sync", **extra))
    assert_same_runs(rec, base, "bitsgd (worker momentum, every push dense) vs MXNet "
                     "dist_sync", atol=1e-6)


def check_worker_run(rec, algorithm, knobs, sched=None):
    """check_against_reference, with an optional schedule (the lr of iteration t)."""
    if sched is None:
        return check_against_reference(rec, algorithm, knobs)
    s = rec.spec
    heads = s["heads"]
    data = [[rec.data(i, h) for h in range(len(heads))] for i in range(rec.num_workers)]

    def grad_fn(i, t, _):
        return ref.model_grad(heads, rec.weights(i, t), [(x[t], y[t]) for x, y in data[i]])

    opt = s["optimizer"]
    traj = ref.simulate(algorithm, rec.weights(0, 0), grad_fn, rec.num_workers,
                        s["iterations"], s["batch"], opt["learning_rate"], opt["momentum"],
                        opt["wd"], knobs, lr_schedule=sched)
    ok, message = ref.compare_trajectories(rec.weights, lambda i, t: traj.local[t][i],
                                           rec.num_workers, s["iterations"], rec.params,
                                           rtol=RTOL, atol=ATOL)
    assert ok, message
    return traj


def test_cpsgd_worker_momentum_dense_matches_reference(worker_job):
    """CP-SGD with every push dense (warm-up 3, correction every step): the
    servers run S-SGD with momentum on the workers' gradients, each worker's local
    step is Opt_l(W_t, u).  Reading g instead is another trajectory."""
    rec = jobutil.run_recording(worker_job, spec("cpsgd", DENSE_CPSGD, iterations=14))
    traj = check_against_reference(rec, "cpsgd", DENSE_CPSGD)
    assert traj.push_kind == ["dense"] * 14
    assert_reference_differs(rec, "cpsgd", dict(DENSE_CPSGD, local_input="gradient"),
                             "the local step must read u")
    assert_reference_differs(rec, "cpsgd", dict(DENSE_CPSGD, momentum_path="server"),
                             "momentum must be on the workers")


# ------------------------------------------------------------- real jobs (b)
@pytest.mark.parametrize("algorithm,knobs", [
    ("bitsgd", dict(WORKER, threshold=1.0)),
    ("bitsgd", dict(WORKER, threshold=1.0, warmup_steps=4, correction_period=3)),
    ("cpsgd", CPSGD_2BIT),
    ("cpsgd", dict(CPSGD_2BIT, local_input="gradient")),
], ids=["bitsgd", "bitsgd-warmup-correction", "cpsgd", "cpsgd-local-gradient"])
def test_worker_momentum_2bit_matches_reference(worker_job, algorithm, knobs):
    """2-bit rounds: the workers quantize u with MXNet's residual; every worker's
    weights after every step follow the reference."""
    rec = jobutil.run_recording(worker_job, spec(algorithm, knobs, iterations=16))
    traj = check_against_reference(rec, algorithm, knobs)
    assert "compressed" in traj.push_kind
    assert_nontrivial_quantization(traj)
    assert_reference_differs(rec, algorithm, dict(knobs, momentum_path="server",
                                                  **({"local_input": None}
                                                     if "local_input" in knobs else {})),
                             "momentum must be on the workers")


# ------------------------------------------------------------- save / resume (c)
@pytest.mark.parametrize("algo,knobs,k", [
    ("bitsgd", '{"correction_period": 1, "momentum_path": "worker"}', 5),
    ("cpsgd", '{"warmup_steps": 2, "correction_period": 1, "momentum_path": "worker"}', 6),
])
def test_worker_momentum_resume_is_exact(worker_job, tmp_path_factory, algo, knobs, k):
    """Every push dense (no 2-bit residual to lose): a run resumed from
    trainer.save_states at K ends where the uninterrupted run ends, which needs u
    (nonzero with momentum 0.9 at K); saving again right after load_states gives
    the same file, u included."""
    run_a = str(tmp_path_factory.mktemp(algo + "-wm-A"))
    _job(worker_job, algo, knobs, run_a, "--iters", ITERS, "--save-at", k)
    saved = _saved_u(run_a, k)
    assert saved and all(np.abs(u).max() > 0 for u in saved.values())
    run_c = tmp_path_factory.mktemp(algo + "-wm-C")
    _resume(worker_job, algo, knobs, run_a, run_c, k)
    _assert_restored(run_a, run_c, k)
    _assert_close(_final(run_a), _final(run_c), rtol=1e-6)


def _saved_u(run_dir, k):
    from test_resume import _load_blob
    blob = _load_blob(os.path.join(run_dir, "ckpt-%d-rank0.states" % k))
    return blob["worker_momentum"]


# ------------------------------------------------------------------ refusals
def test_bad_settings_are_refused():
    from mxnet_cpsgd.stores import config
    from mxnet_cpsgd.stores.policies import BITSGD, CPSGD, ODSGD
    for bad in ("workers", "", 1):
        with pytest.raises(config.ConfigError, match="momentum_path.*one of 'server', 'worker'"):
            config.resolve("cpsgd", CPSGD.defaults, {"momentum_path": bad})
    with pytest.raises(config.ConfigError, match="local_input.*one of 'momentum', 'gradient'"):
        config.resolve("cpsgd", CPSGD.defaults, {"momentum_path": "worker", "local_input": "u"})
    with pytest.raises(config.ConfigError, match="local_input='gradient' needs "
                                                "momentum_path='worker'"):
        config.resolve("cpsgd", CPSGD.defaults, {"local_input": "gradient"})
    with pytest.raises(config.ConfigError, match="local_input.*not used by kvstore 'bitsgd'"):
        config.resolve("bitsgd", BITSGD.defaults, {"local_input": "gradient"})
    with pytest.raises(config.ConfigError, match="momentum_path.*not used by kvstore 'odsgd'"):
        config.resolve("odsgd", ODSGD.defaults, {"momentum_path": "worker"})
    with pytest.raises(config.ConfigError, match="MXNET_CPSGD_MOMENTUM_PATH.*one of"):
        config.resolve("bitsgd", BITSGD.defaults, {}, {"MXNET_CPSGD_MOMENTUM_PATH": "both"})
    assert config.resolve("bitsgd", BITSGD.defaults, {}).momentum_path == "server"
    assert config.resolve("cpsgd", CPSGD.defaults, {"momentum_path": "Worker"}
                          ).momentum_path == "worker"


def test_other_optimizers_are_refused():
    import mxnet as mx
    from mxnet_cpsgd.stores.config import ConfigError
    from mxnet_cpsgd.stores.worker_momentum import WorkerMomentum
    for opt in (mx.optimizer.NAG(momentum=0.9), mx.optimizer.Adam()):
        with pytest.raises(ConfigError, match="momentum_path='worker' needs the Trainer's "
                                              "optimizer to be 'sgd'"):
            WorkerMomentum().adopt(opt, 2, mx.optimizer.SGD())
    with pytest.raises(ConfigError, match="clip_gradient"):
        WorkerMomentum().adopt(mx.optimizer.SGD(momentum=0.9, clip_gradient=1.0), 2,
                               mx.optimizer.SGD())
    sgd = mx.optimizer.SGD(momentum=0.9, wd=1e-4)
    server = mx.optimizer.SGD(momentum=0.9, wd=1e-4)
    WorkerMomentum().adopt(sgd, 2, server)
    assert (server.momentum, server.wd) == (0.0, 0.0) and sgd.momentum == 0.9


def test_states_of_the_other_path_are_refused():
    from mxnet_cpsgd.stores import worker_momentum
    mine = worker_momentum.WorkerMomentum()
    with pytest.raises(ValueError, match="saved with momentum_path='server' but this store "
                                         "runs momentum_path='worker'"):
        worker_momentum.load(mine, {"worker_momentum": None}, "f.states")
    with pytest.raises(ValueError, match="saved with momentum_path='worker'"):
        worker_momentum.load(None, {"worker_momentum": {0: np.zeros(3)}}, "f.states")
    worker_momentum.load(None, {}, "old.states")  # files from before the knob: server
