"""Stores that must reproduce another training run exactly (real jobs, 2 workers).

(a) S-SGD, and CP-SGD whose warm-up outlasts the run, give bit-identical
    weights to MXNet's own ``kvstore='dist_sync'`` (also with 2 servers and a
    parameter that the store chunks, i.e. one above MXNET_KVSTORE_BIGARRAY_BOUND);
(b) CP-SGD with ``correction_period=1`` (every push full precision) equals OD-SGD;
(c) BIT-SGD equals stock MXNet 2-bit compression driven by a manual
    push-then-pull loop (the Trainer cannot drive it in MXNet 1.9.1).

Every worker's weights after every step are compared (workers are matched by
rank: rank r gets the same data in every job).
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
from jobutil import spec  # noqa: E402

CHUNKY_MLP = [{"kind": "mlp", "in": 40, "hidden": 30, "out": 3}]
SMALL_BOUND = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}


def assert_same_runs(a, b, what, atol=0.0):
    """Every weight of every worker after every step: bitwise (atol 0) or within atol."""
    assert a.params == b.params, (a.params, b.params)
    assert a.num_workers == b.num_workers
    T = a.spec["iterations"]
    assert b.spec["iterations"] == T
    first, worst, count = None, 0.0, 0
    for t in range(T + 1):
        for i in range(a.num_workers):
            wa, wb = a.weights(i, t), b.weights(i, t)
            for n in a.params:
                same = np.array_equal(wa[n], wb[n]) if atol == 0 else \
                    np.allclose(wa[n], wb[n], rtol=0, atol=atol)
                diff = float(np.abs(wa[n].astype(np.float64) - wb[n]).max())
                worst = max(worst, diff)
                if not same:
                    count += 1
                    if first is None:
                        first = "weights after iteration %d, worker %d, %s: %s" % (
                            t - 1, i, n, ref.describe_diff(wa[n], wb[n], 0.0, atol))
    if first is not None:
        pytest.fail("%s: %d (iteration, worker, parameter) triples differ (%s); first: %s; "
                    "largest |diff| %.3g" % (what, count, "bitwise" if atol == 0 else
                                             "atol %g" % atol, first, worst), pytrace=False)


# (a) ----------------------------------------------------------------------
def test_ssgd_bitwise_equals_dist_sync(worker_job):
    base = jobutil.run_recording(worker_job, spec("dist_sync"))
    mine = jobutil.run_recording(worker_job, spec("ssgd"))
    assert_same_runs(mine, base, "ssgd vs MXNet dist_sync")


@pytest.mark.parametrize("servers", [1, 2])
def test_cpsgd_in_warmup_bitwise_equals_dist_sync(worker_job, servers):
    knobs = {"warmup_steps": 1000, "correction_period": 3, "threshold": 1.0}
    if servers == 1:
        kwargs, env = {}, None
    else:  # a 1200-element weight above the bound: dense pushes of a chunked key
        kwargs, env = {"heads": CHUNKY_MLP, "iterations": 12}, SMALL_BOUND
    base = jobutil.run_recording(worker_job, spec("dist_sync", **kwargs),
                                 num_servers=servers, env=env)
    mine = jobutil.run_recording(worker_job, spec("cpsgd", knobs, **kwargs),
                                 num_servers=servers, env=env)
    assert_same_runs(mine, base, "cpsgd (warm-up longer than the run, %d server(s)) vs "
                     "MXNet dist_sync" % servers)


# (b) ----------------------------------------------------------------------
def test_cpsgd_correction_every_step_equals_odsgd(worker_job):
    # cpsgd's local weight decay defaults to 0 (CD-SGD), odsgd's to the Trainer's; cpsgd's
    # local momentum defaults to the Trainer's, odsgd's to 0 (the authors')
    od = jobutil.run_recording(worker_job, spec("odsgd", {
        "warmup_steps": 3, "local_wd": 0.0,
        "local_momentum": jobutil.MOMENTUM["momentum"]}))
    cp = jobutil.run_recording(worker_job, spec("cpsgd", {"warmup_steps": 3,
                                                           "correction_period": 1,
                                                           "threshold": 1.0}))
    assert_same_runs(cp, od, "cpsgd with correction_period=1 vs odsgd", atol=1e-7)


# (c) ----------------------------------------------------------------------
def test_bitsgd_bitwise_equals_stock_mxnet_2bit(worker_job):
    knobs = {"threshold": 1.0}
    stock = jobutil.run_recording(worker_job, spec("stock_2bit",
                                                   {"type": "2bit", "threshold": 1.0}))
    mine = jobutil.run_recording(worker_job, spec("bitsgd", knobs))
    assert_same_runs(mine, stock, "bitsgd vs stock MXNet 2-bit (push then pull)")


# (d) ----------------------------------------------------------------------
#: two devices per worker, and the Trainer's last parameter frozen (grad_req='null')
#: from iteration 5: the store carries a step out when its last trainable key arrives
TWO_DEVICES_FROZEN = {"devices": 2, "freeze": {"at": 5, "params": ["h0_out_bias"]}}


@pytest.mark.parametrize("kvstore,knobs", [
    ("ssgd", None),
    ("cpsgd", {"warmup_steps": 1000, "correction_period": 3, "threshold": 1.0}),
])
def test_two_devices_and_frozen_parameter_equal_dist_sync(worker_job, kvstore, knobs):
    base = jobutil.run_recording(worker_job, spec("dist_sync", **TWO_DEVICES_FROZEN))
    mine = jobutil.run_recording(worker_job, spec(kvstore, knobs, **TWO_DEVICES_FROZEN))
    frozen = base.params.index("h0_out_bias")
    assert frozen == len(base.params) - 1
    T = base.spec["iterations"]
    w = [base.weights(0, t)["h0_out_bias"] for t in range(T + 1)]
    assert not np.array_equal(w[4], w[5]) and all(np.array_equal(w[5], v) for v in w[5:])
    assert_same_runs(mine, base, "%s vs MXNet dist_sync (2 devices per worker, last "
                     "parameter frozen at iteration 5)" % kvstore)
