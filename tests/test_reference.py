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


def test_reference_dcasgd_matches_mxnet_dcasgd():
    import mxnet as mx
    rng = np.random.RandomState(2)
    w0 = rng.randn(7).astype(np.float32)
    opt = mx.optimizer.DCASGD(learning_rate=0.1, momentum=0.0, wd=1e-3, rescale_grad=0.5,
                              lamda=0.3)
    updater = mx.optimizer.get_updater(opt)
    w = mx.nd.array(w0)
    mine = ref.DCASGD(0.1, 1e-3, rescale=0.5, lamda=0.3)
    expected = w0.astype(np.float64)
    for _ in range(5):
        g = rng.randn(7).astype(np.float32)
        w[:] = w + mx.nd.array(rng.randn(7) * 0.1)  # a new base, as OD-SGD's pull gives
        expected = w.asnumpy().astype(np.float64)
        updater(0, mx.nd.array(g), w)
        expected = mine.step("p", expected, g)
        np.testing.assert_allclose(w.asnumpy(), expected, rtol=1e-5, atol=1e-6)


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
    """The reference itself: warm-up dense, then compressed except when
    (t + 1) % k == 0 (the authors' 1-based count: the first step after warm-up is
    compressed), and the residual is neither reset nor fed by a dense push."""
    w0 = {"p": np.zeros(3)}
    grads = {0: np.array([0.3, -0.7, 2.5])}

    def grad_fn(i, t, weights):
        return {"p": grads[0] * (1 + i)}

    traj = ref.simulate("cpsgd", w0, grad_fn, 2, 9, 1, 0.1,
                        knobs={"warmup_steps": 3, "correction_period": 3, "threshold": 1.0})
    assert traj.push_kind == ["dense", "dense", "dense", "compressed", "compressed",
                              "dense", "compressed", "compressed", "dense"]
    # residual after t=4 (second compressed) is kept unchanged through the dense t=5
    assert traj.residual_abs[4] > 0 and traj.residual_abs[5] == traj.residual_abs[4]
    # warm-up is plain S-SGD, later local weights are W_t + own local step
    assert np.allclose(traj.local[1][0]["p"], traj.server[1]["p"])
    assert not np.allclose(traj.local[5][0]["p"], traj.local[5][1]["p"])


def test_reference_ssdsgd_glu_rule():
    """The reference's SSD-SGD, one worker, by hand: base W every k-th local step,
    GLU(w, g) = w - lr_l*(r*g + wd*w) - lr_l*lam*(w_s - w), snapshot after local
    steps 0, k, 2k."""
    w0 = {"p": np.array([1.0, -2.0])}
    g = np.array([0.5, 0.25])
    lr, wd, lam, k, warmup = 0.1, 0.01, 0.5, 2, 1
    traj = ref.simulate("ssdsgd", w0, lambda i, t, w: {"p": g}, 1, 6, 1, lr, 0.0, wd,
                        knobs={"warmup_steps": warmup, "sync_period": k, "glu_weight": lam})
    lr_l = 1 * lr  # M = 1: local lr = M x global lr
    W, L, snap, n_local = w0["p"].copy(), None, None, 0
    W = W - lr * (g + wd * W)  # warm-up round
    for t in range(warmup, 6):
        n = t - warmup
        base = W.copy() if n % k == 0 else L
        if snap is None:
            snap = base.copy()
        L = base - lr_l * (g + wd * base) - lr_l * lam * (snap - base)
        if n_local % k == 0:
            snap = L.copy()
        n_local += 1
        W = W - lr * (g + wd * W)
        np.testing.assert_allclose(traj.local[t + 1][0]["p"], L, rtol=1e-12)
        np.testing.assert_allclose(traj.server[t + 1]["p"], W, rtol=1e-12)


# ---------------------------------------------------------------- job tests
def test_ssgd_matches_reference(worker_job):
    rec = jobutil.run_recording(worker_job, spec("ssgd"))
    check_against_reference(rec, "ssgd")


def test_bitsgd_matches_reference(worker_job):
    knobs = {"threshold": 1.0}
    rec = jobutil.run_recording(worker_job, spec("bitsgd", knobs))
    traj = check_against_reference(rec, "bitsgd", knobs)
    assert_nontrivial_quantization(traj)


def test_reference_bitsgd_ablation_schedule():
    """The reference itself: BIT-SGD's warm-up and correction are dense pushes that
    leave the residual alone; the others are compressed; no local weights."""
    w0 = {"p": np.zeros(3)}

    def grad_fn(i, t, weights):
        return {"p": np.array([0.3, -0.7, 2.5]) * (1 + i)}

    traj = ref.simulate("bitsgd", w0, grad_fn, 2, 9, 1, 0.1,
                        knobs={"warmup_steps": 2, "correction_period": 3, "threshold": 1.0})
    assert traj.push_kind == ["dense", "dense", "dense", "compressed", "compressed",
                              "dense", "compressed", "compressed", "dense"]
    assert traj.residual_abs[1] == 0 and traj.residual_abs[2] == 0
    assert traj.residual_abs[4] > 0 and traj.residual_abs[5] == traj.residual_abs[4]
    for t in range(10):
        assert np.array_equal(traj.local[t][0]["p"], traj.server[t]["p"])
    plain = ref.simulate("bitsgd", w0, grad_fn, 2, 9, 1, 0.1, knobs={"threshold": 1.0})
    assert plain.push_kind == ["compressed"] * 9


#: BIT-SGD's ablation knobs: warm-up t = 0..3, then dense when (t + 1) % 3 == 0
BITSGD_ABLATION_KNOBS = {"threshold": 1.0, "warmup_steps": 4, "correction_period": 3}


@pytest.mark.parametrize("knobs", [
    {"threshold": 1.0, "warmup_steps": 4},
    BITSGD_ABLATION_KNOBS,
], ids=["warmup", "warmup-correction"])
def test_bitsgd_ablation_knobs_match_reference(worker_job, knobs):
    """BIT-SGD with a dense warm-up, and with CP-SGD's correction but no local update."""
    rec = jobutil.run_recording(worker_job, spec("bitsgd", knobs, iterations=14))
    traj = check_against_reference(rec, "bitsgd", knobs)
    assert traj.push_kind[:4] == ["dense"] * 4
    assert ("dense" in traj.push_kind[4:]) == ("correction_period" in knobs)
    assert_nontrivial_quantization(traj)
    # the knobs matter: plain BIT-SGD (compressed from t = 0) is another trajectory
    assert_reference_differs(rec, "bitsgd", {"threshold": 1.0}, "warm-up must be dense")
    if "correction_period" in knobs:
        assert_reference_differs(rec, "bitsgd", dict(knobs, correction_period=None),
                                 "every 3rd step after warm-up must be dense")


def test_cpsgd_without_correction_matches_reference(worker_job):
    """CP-SGD whose correction period exceeds the run: the local update alone."""
    knobs = dict(CPSGD_KNOBS, correction_period=1000)
    rec = jobutil.run_recording(worker_job, spec("cpsgd", knobs, iterations=14))
    traj = check_against_reference(rec, "cpsgd", knobs)
    assert traj.push_kind[4:] == ["compressed"] * 10
    assert_reference_differs(rec, "cpsgd", CPSGD_KNOBS, "no correction must happen")


def assert_reference_differs(rec, algorithm, knobs, why):
    """The recorded run does NOT match the reference with ``knobs``: the test can
    tell the default it checks from the alternative."""
    traj, _ = reference_for(rec, algorithm, knobs)
    ok, _ = ref.compare_trajectories(rec.weights, lambda i, t: traj.local[t][i],
                                     rec.num_workers, rec.spec["iterations"], rec.params,
                                     rtol=RTOL, atol=ATOL)
    assert not ok, "the recording also matches the reference with %s (%s)" % (knobs, why)


def test_odsgd_matches_reference(worker_job):
    knobs = {"warmup_steps": 3}
    rec = jobutil.run_recording(worker_job, spec("odsgd", knobs))
    assert rec.spec["optimizer"]["momentum"] == 0.9
    check_against_reference(rec, "odsgd", knobs)
    T = rec.spec["iterations"]
    # after warm-up each worker trains on its own local step
    assert not np.array_equal(rec.weights(0, T)[rec.params[0]], rec.weights(1, T)[rec.params[0]])
    # the local optimizer's momentum is 0 by default, not the Trainer's 0.9
    assert_reference_differs(rec, "odsgd", dict(knobs, local_momentum=0.9),
                             "local momentum must default to 0")


def test_odsgd_dcasgd_local_optimizer_matches_reference(worker_job):
    """local_optimizer='dcasgd' (MXNet's DCASGD, the DC-ASGD family the OD-SGD
    scripts use) with local weight decay 0 and local lr 0.3."""
    knobs = {"warmup_steps": 3, "local_optimizer": "dcasgd", "local_wd": 0.0,
             "local_lr": 0.3}
    rec = jobutil.run_recording(worker_job, spec("odsgd", knobs, optimizer=PLAIN,
                                                 iterations=12))
    check_against_reference(rec, "odsgd", knobs)
    assert_reference_differs(rec, "odsgd", dict(knobs, local_optimizer="sgd"),
                             "the delay compensation must act")


#: a Trainer schedule (MultiFactorScheduler) that decays at global update counts 6, 9
LR_SCHEDULE = {"step": [6, 9], "factor": 0.5}


def schedule_lr(lr, schedule):
    """The global lr of iteration t: MultiFactorScheduler at update count t + 1."""
    return lambda t: lr * schedule["factor"] ** sum(t + 1 > s for s in schedule["step"])


@pytest.mark.parametrize("algorithm,knobs", [
    ("odsgd", {"warmup_steps": 3}),
    ("ssdsgd", {"warmup_steps": 3, "sync_period": 3, "glu_weight": 0.5, "local_lr": 0.3}),
])
def test_local_schedule_follows_global_iteration(worker_job, algorithm, knobs):
    """With a Trainer lr schedule the local lr at iteration t is ratio * lr(t): the
    local schedule keeps pace with the global one (it does not count local steps)."""
    rec = jobutil.run_recording(worker_job, spec(algorithm, knobs, iterations=14,
                                                 lr_schedule=LR_SCHEDULE))
    lr = rec.spec["optimizer"]["learning_rate"]
    s = rec.spec
    check_setup(rec)
    heads = s["heads"]
    data = [[rec.data(i, h) for h in range(len(heads))] for i in range(rec.num_workers)]

    def grad_fn(i, t, _):
        return ref.model_grad(heads, rec.weights(i, t), [(x[t], y[t]) for x, y in data[i]])

    opt = s["optimizer"]

    def run(schedule, local_schedule=None):
        traj = ref.simulate(algorithm, rec.weights(0, 0), grad_fn, rec.num_workers,
                            s["iterations"], s["batch"], lr, opt["momentum"], opt["wd"],
                            knobs, lr_schedule=schedule, local_lr_schedule=local_schedule)
        return ref.compare_trajectories(rec.weights, lambda i, t: traj.local[t][i],
                                        rec.num_workers, s["iterations"], rec.params,
                                        rtol=RTOL, atol=ATOL)

    global_pace = schedule_lr(lr, LR_SCHEDULE)
    ok, message = run(global_pace)
    assert ok, "the local lr does not follow the global schedule:\n" + message
    # the old behaviour, a local schedule counting local steps only, lags by the
    # warm-up; it does not match
    warmup = knobs["warmup_steps"]
    ok, _ = run(global_pace, lambda t: global_pace(max(t - warmup, 0)))
    assert not ok, "a local schedule lagging by the warm-up matches as well"


CPSGD_CASES = {
    # name: (optimizer, heads, iterations, knobs, servers, env)
    "plain-1server": (PLAIN, SMALL_MLP, 30, CPSGD_KNOBS, 1, None),
    "momentum-1server": (MOMENTUM, SMALL_MLP, 30, CPSGD_KNOBS, 1, None),
    # the authors' local momentum 0 beside the default (the Trainer's momentum)
    "momentum-1server-authors": (MOMENTUM, SMALL_MLP, 30,
                                 dict(CPSGD_KNOBS, local_momentum=0.0), 1, None),
    "plain-2servers-chunked": (PLAIN, CHUNKY_MLP, 30, CPSGD_KNOBS, 2,
                               {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}),
    # t = 0, 1 warm-up; 2 dense ((t + 1) % 3 == 0); 3, 4 compressed; 5 dense; 6 compressed
    "momentum-2servers-1M-param": (MOMENTUM, BIG_LINEAR, 7,
                                   dict(CPSGD_KNOBS, warmup_steps=2), 2, None),
    # the first weight (30 of 53 elements) is cut across servers by the balance
    "momentum-4servers-cut": (MOMENTUM, SMALL_MLP, 30, CPSGD_KNOBS, 4, None),
}


def assert_cut_across_servers(rec, num_servers):
    """The job's largest parameter was cut into chunks on several servers.

    It holds more than a server's share of the elements, so the stores' layout
    cuts it whatever the order of the others; this recomputes that layout."""
    from mxnet_cpsgd.stores.key_layout import KeyLayout, server_of
    shapes = {i: rec.weights(0, 0)[n].shape for i, n in enumerate(rec.params)}
    sizes = {i: int(np.prod(s)) for i, s in shapes.items()}
    largest = max(sizes, key=sizes.get)
    assert sizes[largest] > sum(sizes.values()) / num_servers
    layout = KeyLayout(shapes, num_servers, 1, 10 ** 6)
    assert len({server_of(c.key, num_servers) for c in layout.chunks[largest]}) > 1


def test_bitsgd_with_cut_parameters_matches_reference(worker_job):
    """BIT-SGD with 4 servers, its first weight cut across them, dense warm-up and
    correction rounds mixed with compressed ones on the same chunk keys."""
    knobs = BITSGD_ABLATION_KNOBS
    rec = jobutil.run_recording(worker_job, spec("bitsgd", knobs, iterations=14),
                                num_servers=4)
    assert_cut_across_servers(rec, 4)
    traj = check_against_reference(rec, "bitsgd", knobs)
    assert {"dense", "compressed"} <= set(traj.push_kind[4:])
    assert_nontrivial_quantization(traj)


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
    corrections = [t for t in range(warmup, iterations) if (t + 1) % k == 0]
    if (warmup + 1) % k != 0:
        assert kinds[warmup] == "compressed"  # the first step after warm-up
    assert corrections and all(kinds[t] == "dense" for t in corrections)
    assert_nontrivial_quantization(traj)
    # a residual was carried across at least one correction round
    assert any(traj.residual_abs[t - 1] > 0 for t in corrections if t > warmup)
    if big:
        assert max(int(np.prod(rec.weights(0, 0)[n].shape)) for n in rec.params) >= 10 ** 6
    if servers > 2:
        assert_cut_across_servers(rec, servers)


#: two heads (an MLP and a linear one): 6 parameters of 4 sizes over 3 phases
STAGGER_HEADS = [{"kind": "mlp", "in": 6, "hidden": 5, "out": 3},
                 {"kind": "linear", "in": 4, "out": 2, "loss": "linear"}]
STAGGERED_KNOBS = dict(CPSGD_KNOBS, correction_schedule="staggered")


def test_staggered_phases_match_reference_and_spread_the_bytes():
    """The store's phases equal the reference's independent statement of the
    rule, and each phase holds about 1/k of the elements."""
    from mxnet_cpsgd.stores.policies.cpsgd import staggered_phases
    rng = np.random.RandomState(3)
    for k in (1, 2, 3, 5):
        sizes = [int(s) for s in rng.choice([1, 3, 30, 64, 64, 500, 2304], size=20)]
        w0 = {"p%02d" % i: np.zeros(s) for i, s in enumerate(sizes)}
        expected = ref.staggered_phases(w0, k)
        got = staggered_phases({i: s for i, s in enumerate(sizes)}, k)
        assert [got[i] for i in range(len(sizes))] == [expected["p%02d" % i]
                                                       for i in range(len(sizes))]
        load = np.bincount([got[i] for i in range(len(sizes))], weights=sizes, minlength=k)
        # greedy by size: no phase exceeds the mean by more than the largest parameter
        assert load.max() <= sum(sizes) / k + max(sizes)


def test_staggered_schedule_rejects_bad_values():
    from mxnet_cpsgd.stores import config
    from mxnet_cpsgd.stores.policies import BITSGD, CPSGD
    for bad in ("random", "", 3, "stagger"):
        with pytest.raises(config.ConfigError, match="correction_schedule.*one of 'aligned', "
                                                    "'staggered'"):
            config.resolve("cpsgd", CPSGD.defaults, {"correction_schedule": bad})
    assert config.resolve("cpsgd", CPSGD.defaults, {"correction_schedule": "Staggered"}
                          ).correction_schedule == "staggered"
    assert config.resolve("cpsgd", CPSGD.defaults, {}).correction_schedule == "aligned"
    with pytest.raises(config.ConfigError, match="not used by kvstore 'bitsgd'"):
        config.resolve("bitsgd", BITSGD.defaults, {"correction_schedule": "staggered"})


def test_cpsgd_staggered_matches_reference(worker_job):
    """correction_schedule='staggered' in a real 2-worker job: every parameter is
    dense every k-th iteration at its own phase, the others compressed."""
    knobs = STAGGERED_KNOBS
    rec = jobutil.run_recording(worker_job, spec("cpsgd", knobs, optimizer=MOMENTUM,
                                                 heads=STAGGER_HEADS, iterations=16))
    traj = check_against_reference(rec, "cpsgd", knobs)
    warmup, k = knobs["warmup_steps"], knobs["correction_period"]
    phases = ref.staggered_phases(rec.weights(0, 0), k)
    assert len(set(phases.values())) == k  # every phase is used
    # after warm-up every iteration corrects some parameters and compresses others
    assert all(traj.push_kind[t] == "mixed" for t in range(warmup, 16))
    for n in rec.params:
        dense_at = [t for t in range(warmup, 16) if n in traj.dense_params[t]]
        assert dense_at and all(b - a == k for a, b in zip(dense_at, dense_at[1:])), (n, dense_at)
    assert_nontrivial_quantization(traj)
    # the aligned reference differs: the test can tell the schedules apart
    aligned, _ = reference_for(rec, "cpsgd", CPSGD_KNOBS)
    ok, _ = ref.compare_trajectories(rec.weights, lambda i, t: aligned.local[t][i],
                                     rec.num_workers, 16, rec.params, rtol=RTOL, atol=ATOL)
    assert not ok


@pytest.mark.parametrize("algorithm,knobs,device_ids", [
    ("cpsgd", CPSGD_KNOBS, None),
    ("localsgd", {"sync_period": 4}, None),
    # the parameters' first device is not the default context (as with mx.gpu(1) first):
    # the stores' buffers live there and the other device gets copies
    ("cpsgd", CPSGD_KNOBS, [1, 0]),
])
def test_two_devices_per_worker_match_reference(worker_job, algorithm, knobs, device_ids):
    """Each worker sums its 2 devices' gradients; every device gets the same weights
    (record_weights.py fails otherwise); the reference sees the whole batch."""
    extra = {"device_ids": device_ids} if device_ids else {}
    rec = jobutil.run_recording(worker_job, spec(algorithm, knobs, iterations=14, devices=2,
                                                 **extra))
    check_against_reference(rec, algorithm, knobs)


def test_ssdsgd_matches_reference(worker_job):
    """SSD-SGD: a GLU local step every iteration after warm-up, from the pulled
    global weights every sync_period-th one; background pulls only."""
    knobs = {"warmup_steps": 3, "sync_period": 4, "glu_weight": 0.5}
    rec = jobutil.run_recording(worker_job, spec("ssdsgd", knobs))
    check_against_reference(rec, "ssdsgd", knobs)
    # the GLU term acts (lr_l * 0.5 * (w_s - w) is not negligible here)
    assert_reference_differs(rec, "ssdsgd", dict(knobs, glu_weight=0.0),
                             "the GLU snapshot term must act")


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
