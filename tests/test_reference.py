"""Every algorithm's stores against the independent numpy reference (tests/reference.py).

Each job test runs a real job (scheduler, server(s), 2 workers on loopback) whose
workers train a small Gluon model with ``tests/workers/record_weights.py`` on
different data and record their weights before and after every step.  The test
then replays the algorithm in numpy: at iteration t worker i's gradient is
computed exactly (float64) at the weights the worker recorded before that step
("teacher forcing"), the reference advances its own servers, residuals and
optimizer states, and its prediction of every worker's weights after every step
is compared with what the worker recorded (rtol 1e-5, atol 1e-6).

A-SGD's order is not deterministic; its test checks that the servers applied
every push exactly once and that training makes progress.

The first tests check the reference's own building blocks (SGD, 2-bit quantizer)
against MXNet's operators in this process.
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
from jobutil import MOMENTUM, PLAIN, SMALL_MLP, spec  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
#: CP-SGD schedule of the job tests: warm-up t = 0..3, then t % 3 == 0 dense
CPSGD_KNOBS = {"warmup_steps": 4, "correction_period": 3, "threshold": 1.0}
#: a tanh MLP whose first weight (40*30 = 1200 elements) is chunked when
#: MXNET_KVSTORE_BIGARRAY_BOUND=1000
CHUNKY_MLP = [{"kind": "mlp", "in": 40, "hidden": 30, "out": 3}]
#: Dense(1000, in_units=1001): a 1,001,000-element weight, above MXNet's default
#: big-array bound (1e6).  Only a few input columns are nonzero, so most gradient
#: elements are exactly zero (cheap, and no residual sits near a threshold).
BIG_LINEAR = [{"kind": "linear", "in": 1001, "out": 1000,
               "active_inputs": [0, 1, 2, 500, 999, 1000]}]


# ---------------------------------------------------------------- helpers
def reference_for(rec, algorithm, knobs):
    """Simulate ``algorithm`` with the recorded data and teacher-forced gradients."""
    s = rec.spec
    heads = s["heads"]
    data = [[rec.data(i, h) for h in range(len(heads))] for i in range(rec.num_workers)]

    def grad_at_recorded(i, t, _reference_weights):
        batches = [(x[t], y[t]) for x, y in data[i]]
        return ref.model_grad(heads, rec.weights(i, t), batches)

    opt = s["optimizer"]
    return ref.simulate(algorithm, rec.weights(0, 0), grad_at_recorded, rec.num_workers,
                        s["iterations"], s["batch"], opt["learning_rate"],
                        opt.get("momentum", 0.0), opt.get("wd", 0.0), knobs), grad_at_recorded


def check_setup(rec):
    """Sanity of a recording: parameters, equal initial weights, different data."""
    heads = rec.spec["heads"]
    expected = [n for i, h in enumerate(heads) for n in ref.head_param_names(i, h)]
    assert sorted(rec.params) == sorted(expected), (rec.params, expected)
    for i in range(1, rec.num_workers):
        for n in rec.params:
            assert np.array_equal(rec.weights(i, 0)[n], rec.weights(0, 0)[n]), \
                "worker %d starts from other weights than rank 0 (%s)" % (i, n)
        assert not np.array_equal(rec.data(i, 0)[0], rec.data(0, 0)[0]), \
            "workers 0 and %d got the same data" % i


def check_gradients(rec, grad_fn):
    """The numpy gradient used by the reference equals MXNet's (recorded) gradient."""
    if "g:" + rec.params[0] not in rec.ranks[0]:
        return
    for i in range(rec.num_workers):
        for t in range(rec.spec["iterations"]):
            mine = grad_fn(i, t, None)
            theirs = rec.grads(i, t)
            for n in rec.params:
                assert np.allclose(theirs[n], mine[n], rtol=1e-4, atol=1e-5), (
                    "the test's numpy gradient disagrees with MXNet's (worker %d, t=%d, %s): "
                    "%s -- the model/loss of record_weights.py and reference.py differ"
                    % (i, t, n, ref.describe_diff(theirs[n], mine[n], 1e-4, 1e-5)))


def check_against_reference(rec, algorithm, knobs=None):
    """Assert that every worker's weights after every step match the reference."""
    check_setup(rec)
    traj, grad_fn = reference_for(rec, algorithm, knobs)
    check_gradients(rec, grad_fn)
    T = rec.spec["iterations"]
    labels = [None] + ["reference: %s push" % k if k else "reference: no push"
                       for k in traj.push_kind]
    ok, message = ref.compare_trajectories(
        rec.weights, lambda i, t: traj.local[t][i], rec.num_workers, T, rec.params,
        rtol=RTOL, atol=ATOL, labels=labels)
    if not ok:
        quant = ""
        if traj.quantizers:
            quant = ("\nreference 2-bit outputs %s; smallest |residual -+ tau| met %.3g "
                     "(a value near 0 would mean float rounding could flip a decision)"
                     % (traj.quant_counts(), traj.min_margin()))
        pytest.fail("kvstore %r (%d workers, knobs %s, optimizer %s) differs from the numpy "
                    "reference:\n%s%s" % (rec.spec["kvstore"], rec.num_workers, knobs,
                                          rec.spec["optimizer"], message, quant),
                    pytrace=False)
    return traj


def assert_nontrivial_quantization(traj):
    counts = traj.quant_counts()
    assert counts["zero"] > 0 and counts["pos"] > 0 and counts["neg"] > 0, \
        "the threshold makes the 2-bit quantization trivial: %s" % counts


# ------------------------------------------------- the reference's building blocks
@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 1e-3)])
def test_reference_sgd_matches_mxnet_sgd(momentum, wd):
    import mxnet as mx
    rng = np.random.RandomState(0)
    w0 = rng.randn(7).astype(np.float32)
    opt = mx.optimizer.SGD(learning_rate=0.1, momentum=momentum, wd=wd, rescale_grad=0.25)
    updater = mx.optimizer.get_updater(opt)
    w = mx.nd.array(w0)
    mine = ref.SGD(0.1, momentum, wd, rescale=0.25)
    expected = w0.astype(np.float64)
    for _ in range(5):
        g = rng.randn(7).astype(np.float32)
        updater(0, mx.nd.array(g), w)
        expected = mine.step("p", expected, g)
    np.testing.assert_allclose(w.asnumpy(), expected, rtol=1e-6, atol=1e-7)


def test_reference_quantizer_matches_mxnet_2bit():
    """Two 'devices' of MXNet's local 2-bit store = two workers' quantizers, summed."""
    import mxnet as mx
    tau = 0.5
    kv = mx.kv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": tau})
    shape = (37,)
    kv.init(0, mx.nd.zeros(shape))
    out = mx.nd.zeros(shape)
    quantizers = [ref.TwoBitQuantizer(tau), ref.TwoBitQuantizer(tau)]
    rng = np.random.RandomState(1)
    for _ in range(12):
        # multiples of 1/16: residual arithmetic is exact in float32 and float64
        grads = [np.round(rng.randn(*shape) * 8) / 16 for _ in quantizers]
        kv.push(0, [mx.nd.array(g, ctx=mx.cpu(d)) for d, g in enumerate(grads)])
        kv.pull(0, out=out)
        expected = sum(q("p", g) for q, g in zip(quantizers, grads))
        np.testing.assert_array_equal(out.asnumpy(), expected)
    assert_nontrivial_quantization(ref.Trajectory(quantizers=quantizers))


def test_reference_cpsgd_schedule():
    """The reference itself: warm-up dense, then compressed except every k-th step,
    and the residual is neither reset nor fed by a dense push."""
    w0 = {"p": np.zeros(3)}
    grads = {0: np.array([0.3, -0.7, 2.5])}

    def grad_fn(i, t, weights):
        return {"p": grads[0] * (1 + i)}

    traj = ref.simulate("cpsgd", w0, grad_fn, 2, 9, 1, 0.1,
                        knobs={"warmup_steps": 2, "correction_period": 3, "threshold": 1.0})
    assert traj.push_kind == ["dense", "dense", "compressed", "dense", "compressed",
                              "compressed", "dense", "compressed", "compressed"]
    # residual after t=2 (first compressed) is kept unchanged through the dense t=3
    assert traj.residual_abs[2] > 0 and traj.residual_abs[3] == traj.residual_abs[2]
    # warm-up is plain S-SGD, later local weights are W_t + own local step
    assert np.allclose(traj.local[1][0]["p"], traj.server[1]["p"])
    assert not np.allclose(traj.local[5][0]["p"], traj.local[5][1]["p"])


# ---------------------------------------------------------------- job tests
def test_ssgd_matches_reference(worker_job):
    rec = jobutil.run_recording(worker_job, spec("ssgd"))
    check_against_reference(rec, "ssgd")


def test_bitsgd_matches_reference(worker_job):
    knobs = {"threshold": 1.0}
    rec = jobutil.run_recording(worker_job, spec("bitsgd", knobs))
    traj = check_against_reference(rec, "bitsgd", knobs)
    assert_nontrivial_quantization(traj)


def test_odsgd_matches_reference(worker_job):
    knobs = {"warmup_steps": 3}
    rec = jobutil.run_recording(worker_job, spec("odsgd", knobs))
    check_against_reference(rec, "odsgd", knobs)
    T = rec.spec["iterations"]
    # after warm-up each worker trains on its own local step
    assert not np.array_equal(rec.weights(0, T)[rec.params[0]], rec.weights(1, T)[rec.params[0]])


CPSGD_CASES = {
    # name: (optimizer, heads, iterations, knobs, servers, env)
    "plain-1server": (PLAIN, SMALL_MLP, 30, CPSGD_KNOBS, 1, None),
    "momentum-1server": (MOMENTUM, SMALL_MLP, 30, CPSGD_KNOBS, 1, None),
    "plain-2servers-chunked": (PLAIN, CHUNKY_MLP, 30, CPSGD_KNOBS, 2,
                               {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}),
    # t = 0, 1 warm-up; 2 compressed; 3 dense; 4, 5 compressed; 6 dense
    "momentum-2servers-1M-param": (MOMENTUM, BIG_LINEAR, 7,
                                   dict(CPSGD_KNOBS, warmup_steps=2), 2, None),
}


@pytest.mark.parametrize("case", sorted(CPSGD_CASES))
def test_cpsgd_matches_reference(worker_job, case):
    optimizer, heads, iterations, knobs, servers, env = CPSGD_CASES[case]
    big = heads is BIG_LINEAR
    rec = jobutil.run_recording(
        worker_job, spec("cpsgd", knobs, optimizer=optimizer, heads=heads,
                         iterations=iterations, record_grads=not big),
        num_servers=servers, env=env)
    traj = check_against_reference(rec, "cpsgd", knobs)
    warmup, k = knobs["warmup_steps"], knobs["correction_period"]
    kinds = traj.push_kind
    assert kinds[:warmup] == ["dense"] * warmup
    assert "compressed" in kinds[warmup:]
    corrections = [t for t in range(warmup, iterations) if t % k == 0]
    assert corrections and all(kinds[t] == "dense" for t in corrections)
    assert_nontrivial_quantization(traj)
    # a residual was carried across at least one correction round
    assert any(traj.residual_abs[t - 1] > 0 for t in corrections if t > warmup)
    if big:
        assert max(int(np.prod(rec.weights(0, 0)[n].shape)) for n in rec.params) >= 10 ** 6


@pytest.mark.parametrize("algorithm,knobs", [
    ("cpsgd", CPSGD_KNOBS),
    ("localsgd", {"sync_period": 4}),
])
def test_two_devices_per_worker_match_reference(worker_job, algorithm, knobs):
    """Each worker sums its 2 devices' gradients; every device gets the same weights
    (record_weights.py fails otherwise); the reference sees the whole batch."""
    rec = jobutil.run_recording(worker_job, spec(algorithm, knobs, iterations=14, devices=2))
    check_against_reference(rec, algorithm, knobs)


def test_ssdsgd_matches_reference(worker_job):
    knobs = {"warmup_steps": 3, "sync_period": 4, "glu_weight": 0.5}
    rec = jobutil.run_recording(worker_job, spec("ssdsgd", knobs))
    check_against_reference(rec, "ssdsgd", knobs)


def test_localsgd_matches_reference(worker_job):
    knobs = {"sync_period": 4, "local_lr": 0.05, "local_momentum": 0.5}
    rec = jobutil.run_recording(worker_job, spec("localsgd", knobs, iterations=22))
    check_against_reference(rec, "localsgd", knobs)
    # the run ends between two averages: the workers' models differ
    n = rec.params[0]
    assert np.array_equal(rec.weights(0, 20)[n], rec.weights(1, 20)[n])
    assert not np.array_equal(rec.weights(0, 22)[n], rec.weights(1, 22)[n])


# ---------------------------------------------------------------- A-SGD
ASGD_HEADS = [
    # loss linear in the weights: the gradient does not depend on them
    {"kind": "linear", "in": 4, "out": 2, "loss": "linear"},
    # a small regression problem with a learnable (linear teacher) target
    {"kind": "mlp", "in": 6, "hidden": 8, "out": 2, "target": "teacher"},
]


def test_asgd_applies_every_push_once_and_learns(worker_job):
    lr, batch, iterations = 0.05, 4, 30
    rec = jobutil.run_recording(
        worker_job, spec("asgd", None, optimizer={"learning_rate": lr, "momentum": 0.0,
                                                  "wd": 0.0},
                         heads=ASGD_HEADS, iterations=iterations, batch=batch,
                         final_sync=True))
    check_setup(rec)
    heads = rec.spec["heads"]
    linear = ref.head_param_names(0, heads[0])
    # 1. exactly-once: W_final = W0 - lr/B * (every push of every worker)
    pushes = []
    for i in range(rec.num_workers):
        x, y = rec.data(i, 0)
        for t in range(iterations):
            pushes.append(ref.head_grad(0, heads[0], rec.weights(i, t), x[t], y[t]))
            recorded = rec.grads(i, t)
            for n in linear:
                assert np.allclose(recorded[n], pushes[-1][n], rtol=1e-4, atol=1e-5)
    w0 = {n: rec.weights(0, 0)[n] for n in linear}
    expected = ref.asgd_linear_final(w0, pushes, lr, batch)
    one_push = min(float(np.abs(lr / batch * p[n]).max()) for p in pushes for n in linear)
    for i in range(rec.num_workers):
        final = rec.final(i)
        for n in linear:
            assert np.allclose(final[n], expected[n], rtol=RTOL, atol=ATOL), (
                "A-SGD worker %d, %s: the final global weights are not W0 - lr/B * sum of "
                "all %d pushes (one push moves a weight by up to %.3g): %s"
                % (i, n, len(pushes), one_push,
                   ref.describe_diff(final[n], expected[n], RTOL, ATOL)))
    # the servers really ran asynchronously-applied updates on both workers' pushes
    assert np.abs(expected[linear[0]] - w0[linear[0]]).max() > 100 * ATOL
    # 2. progress on the regression head, measured on all workers' data
    data = [rec.data(i, 1) for i in range(rec.num_workers)]

    def loss(weights):
        return sum(ref.head_loss(1, heads[1], weights, x.reshape(-1, x.shape[-1]),
                                 y.reshape(-1, y.shape[-1])) for x, y in data)

    before, after = loss(rec.weights(0, 0)), loss(rec.final(0))
    assert after < 0.5 * before, "A-SGD did not learn: loss %.4g -> %.4g" % (before, after)
