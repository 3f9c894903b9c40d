"""cpsgd's ``correction_delay``: the correction round may take two compute periods.

The rule (docs/algorithms/cpsgd.md, "Correction round over two periods"): the
correction step pulls nothing, the step after it starts its local update from
the worker's own weights, the step after that from the newest global weights.
With 2 the step before the correction pulls nothing either and the correction
step builds on the own weights too.
A real 2-worker job is checked step by step against tests/reference.py's
independent float64 statement of it (teacher-forced, as in test_reference.py).
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
from test_reference import (CPSGD_KNOBS, assert_nontrivial_quantization,  # noqa: E402
                            assert_reference_differs, check_against_reference)

from mxnet_cpsgd.stores import config  # noqa: E402
from mxnet_cpsgd.stores.policies import CPSGD  # noqa: E402
from mxnet_cpsgd.stores.policies.cpsgd import DELAY_FROM_WORKERS  # noqa: E402
from mxnet_cpsgd.stores.policies.base import Local, Pull, Push  # noqa: E402

#: warm-up t = 0..3, corrections at t = 5, 8, 11, ...; local momentum set here so
#: that the test does not depend on the store's default
DELAY_KNOBS = dict(CPSGD_KNOBS, correction_delay=1, local_momentum=0.5)
DELAY2_KNOBS = dict(DELAY_KNOBS, correction_delay=2)


def _plans(knobs, steps):
    policy = CPSGD(config.resolve("cpsgd", CPSGD.defaults, knobs, environ={}))
    return [policy.plan(t, 0) for t in range(steps)]


def _assert_plans(plans, expected):
    """``expected``: (push, pull, local) -> the steps that must plan exactly that."""
    for kinds, steps in expected.items():
        for t in steps:
            assert (plans[t].push, plans[t].pull, plans[t].local) == kinds, t


def test_plan_of_each_step():
    """warm-up synchronous; the correction pulls nothing; the step after it builds
    on the own weights and pulls; the others as without the knob."""
    plans = _plans(DELAY_KNOBS, 12)
    for t in range(4):
        assert plans[t].pull is Pull.SYNC
    _assert_plans(plans, {(Push.DENSE, Pull.NONE, Local.FROM_GLOBAL): (5, 8, 11),
                          (Push.COMPRESSED, Pull.BACKGROUND, Local.FROM_LOCAL): (6, 9),
                          (Push.COMPRESSED, Pull.BACKGROUND, Local.FROM_GLOBAL): (4, 7, 10)})
    # without the knob nothing changes: the correction pulls, nothing builds on L
    plain = _plans(CPSGD_KNOBS, 12)
    assert all(p.local is not Local.FROM_LOCAL for p in plain)
    assert plain[5].pull is Pull.BACKGROUND


def test_a_correction_on_the_last_warmup_step_is_not_delayed():
    """warm-up 4, period 4: t = 3 is warm-up (synchronous), so t = 4 starts from W."""
    plans = _plans(dict(DELAY_KNOBS, correction_period=4), 9)
    assert plans[3].pull is Pull.SYNC
    assert plans[4].local is Local.FROM_GLOBAL
    assert plans[7].pull is Pull.NONE and plans[8].local is Local.FROM_LOCAL


def test_plan_of_each_step_with_delay_2():
    """the step before the correction pulls nothing; the correction and the step
    after it build on the own weights; the step after them on W again."""
    plans = _plans(DELAY2_KNOBS, 12)
    for t in range(4):
        assert plans[t].pull is Pull.SYNC
    _assert_plans(plans, {(Push.COMPRESSED, Pull.NONE, Local.FROM_GLOBAL): (4, 7, 10),
                          (Push.DENSE, Pull.NONE, Local.FROM_LOCAL): (5, 8, 11),
                          (Push.COMPRESSED, Pull.BACKGROUND, Local.FROM_LOCAL): (6, 9)})
    # period 4 (corrections at 7, 11): 6, 7, 10, 11 pull nothing; 7, 8, 11, 12 build
    # on the own weights
    plans = _plans(dict(DELAY2_KNOBS, correction_period=4), 13)
    assert [t for t in range(4, 13) if plans[t].pull is Pull.NONE] == [6, 7, 10, 11]
    assert [t for t in range(4, 13) if plans[t].local is Local.FROM_LOCAL] == [7, 8, 11, 12]


def test_a_correction_after_the_last_warmup_step_builds_on_the_pull():
    """warm-up 4, period 5, delay 2: t = 3 is warm-up, so its synchronous pull is the
    base of the correction at t = 4; t = 5 builds on the own weights."""
    plans = _plans(dict(DELAY2_KNOBS, warmup_steps=4, correction_period=5), 11)
    assert plans[3].pull is Pull.SYNC
    _assert_plans(plans, {(Push.DENSE, Pull.NONE, Local.FROM_GLOBAL): (4,)})
    assert plans[5].local is Local.FROM_LOCAL and plans[5].pull is Pull.BACKGROUND
    assert (plans[8].pull, plans[9].local, plans[10].local) == \
        (Pull.NONE, Local.FROM_LOCAL, Local.FROM_LOCAL)


def test_plan_of_a_store_without_the_knob():
    """the all-reduce cpsgd_<compressor> stores have no correction_delay (None): their
    plans are the authors' rule"""
    from mxnet_cpsgd.stores import catalog
    _, defaults = catalog.stores()["cpsgd_fp16"]
    cfg = config.resolve("cpsgd_fp16", defaults, {"warmup_steps": 4, "correction_period": 3},
                         environ={})
    assert cfg.correction_delay is None
    policy = CPSGD(cfg)
    plans = [policy.plan(t, 0) for t in range(12)]
    assert all(p.local is not Local.FROM_LOCAL for p in plans)
    assert [t for t in range(4, 12) if plans[t].push is Push.DENSE] == [5, 8, 11]


def _delay_at(knobs, workers):
    policy = CPSGD(config.resolve("cpsgd", CPSGD.defaults, knobs, environ={}))
    policy.set_num_workers(workers)
    return policy.correction_delay


def test_unset_delay_is_2_from_8_workers_where_the_other_knobs_allow_it():
    assert DELAY_FROM_WORKERS == 8
    assert [_delay_at({}, m) for m in (1, 2, 4, 7, 8, 16, 32, 64)] == [0] * 4 + [2] * 4
    for knobs in ({"correction_period": 2}, {"correction_schedule": "staggered"},
                  {"momentum_path": "worker"}):
        assert _delay_at(knobs, 16) == 0, knobs
    # a value the user sets is kept at every worker count
    assert [_delay_at({"correction_delay": d}, m) for d in (0, 1, 2) for m in (4, 16)] == \
        [0, 0, 1, 1, 2, 2]
    # before the store tells the worker count, an unset delay plans as 0
    policy = CPSGD(config.resolve("cpsgd", CPSGD.defaults, {}, environ={}))
    assert policy.correction_delay == 0
    policy.set_num_workers(16)
    assert policy.plan(1003, 0).pull is Pull.NONE  # (1003 + 2) % 5 == 0: before a correction


def test_bad_combinations_are_refused():
    resolve = config.resolve
    for bad in (3, -1, "x", 0.5, True):
        with pytest.raises(config.ConfigError,
                           match="correction_delay.*must be 0, 1 or 2"):
            resolve("cpsgd", CPSGD.defaults, {"correction_delay": bad}, environ={})
    with pytest.raises(config.ConfigError, match="correction_period >= 2"):
        resolve("cpsgd", CPSGD.defaults, {"correction_delay": 1, "correction_period": 1},
                environ={})
    with pytest.raises(config.ConfigError,
                       match="correction_delay=2 .*correction_period >= 3 \\(got 2\\)"):
        resolve("cpsgd", CPSGD.defaults, {"correction_delay": 2, "correction_period": 2},
                environ={})
    assert resolve("cpsgd", CPSGD.defaults, {"correction_delay": 2, "correction_period": 3},
                   environ={}).correction_delay == 2
    with pytest.raises(config.ConfigError, match="correction_schedule='aligned'"):
        resolve("cpsgd", CPSGD.defaults, {"correction_delay": 1,
                                          "correction_schedule": "staggered"}, environ={})
    with pytest.raises(config.ConfigError, match="momentum_path='server'"):
        resolve("cpsgd", CPSGD.defaults, {"correction_delay": 1, "momentum_path": "worker"},
                environ={})
    assert resolve("cpsgd", CPSGD.defaults, {}, environ={}).correction_delay is None
    assert resolve("cpsgd", CPSGD.defaults, {}, environ={"MXNET_CPSGD_CORRECTION_DELAY": "1"}
                   ).correction_delay == 1
    from mxnet_cpsgd.stores import catalog
    accepting = [name for name, (_, d) in catalog.stores().items() if "correction_delay" in d]
    assert accepting == ["cpsgd"]


def test_reference_rule_by_hand():
    """The reference itself, one worker, plain SGD: bases W, W, own, W, ..."""
    w0 = {"p": np.array([1.0, -2.0])}
    grads = [np.array([0.5, 0.25]) * (t + 1) for t in range(8)]
    lr, warmup, k = 0.1, 2, 3  # corrections at t = 2, 5; delayed steps t = 3, 6
    knobs = {"warmup_steps": warmup, "correction_period": k, "threshold": 1.0,
             "correction_delay": 1}
    traj = ref.simulate("cpsgd", w0, lambda i, t, w: {"p": grads[t]}, 1, 8, 1, lr,
                        knobs=knobs)
    W, L, q_res = w0["p"].copy(), None, np.zeros(2)
    for t in range(8):
        g = grads[t]
        if t < warmup:
            W = W - lr * g
            L = W.copy()
            continue
        base = L if t in (3, 6) else W
        L = base - lr * g  # M = 1: local lr = lr
        if (t + 1) % k == 0:
            push = g
        else:
            q_res = q_res + g
            push = np.where(q_res >= 1.0, 1.0, np.where(q_res <= -1.0, -1.0, 0.0))
            q_res = q_res - push
        W = W - lr * push
        np.testing.assert_allclose(traj.local[t + 1][0]["p"], L, rtol=1e-12)
        np.testing.assert_allclose(traj.server[t + 1]["p"], W, rtol=1e-12)


def test_reference_rule_by_hand_with_delay_2():
    """The reference, one worker, plain SGD, delay 2: bases W, own, own, W, ..."""
    w0 = {"p": np.array([1.0, -2.0])}
    grads = [np.array([0.5, 0.25]) * (t + 1) for t in range(9)]
    lr, warmup, k = 0.1, 1, 3  # corrections at t = 2, 5, 8; own bases at 2, 3, 5, 6, 8
    knobs = {"warmup_steps": warmup, "correction_period": k, "threshold": 1.0,
             "correction_delay": 2}
    traj = ref.simulate("cpsgd", w0, lambda i, t, w: {"p": grads[t]}, 1, 9, 1, lr,
                        knobs=knobs)
    W, L, q_res = w0["p"].copy(), None, np.zeros(2)
    for t in range(9):
        g = grads[t]
        if t < warmup:
            W = W - lr * g
            L = W.copy()
            continue
        base = L if t in (2, 3, 5, 6, 8) else W
        L = base - lr * g
        if (t + 1) % k == 0:
            push = g
        else:
            q_res = q_res + g
            push = np.where(q_res >= 1.0, 1.0, np.where(q_res <= -1.0, -1.0, 0.0))
            q_res = q_res - push
        W = W - lr * push
        np.testing.assert_allclose(traj.local[t + 1][0]["p"], L, rtol=1e-12)
        np.testing.assert_allclose(traj.server[t + 1]["p"], W, rtol=1e-12)


@pytest.mark.parametrize("devices", [1, 2])
def test_correction_delay_matches_reference(worker_job, devices):
    """A real 2-worker job (the Trainer's momentum on the servers, local momentum
    0.5) follows the reference step by step; the default rule does not."""
    rec = jobutil.run_recording(worker_job, spec("cpsgd", DELAY_KNOBS, optimizer=MOMENTUM,
                                                 iterations=20, devices=devices))
    traj = check_against_reference(rec, "cpsgd", DELAY_KNOBS)
    assert traj.push_kind[:4] == ["dense"] * 4
    assert [t for t in range(4, 20) if traj.push_kind[t] == "dense"] == [5, 8, 11, 14, 17]
    assert_nontrivial_quantization(traj)
    assert_reference_differs(rec, "cpsgd", dict(DELAY_KNOBS, correction_delay=0),
                             "the step after a correction must build on the own weights")


def test_correction_delay_2_matches_reference(worker_job):
    """The same real 2-worker job with delay 2 follows the reference step by step;
    the rule of delay 1 does not."""
    rec = jobutil.run_recording(worker_job, spec("cpsgd", DELAY2_KNOBS, optimizer=MOMENTUM,
                                                 iterations=20))
    traj = check_against_reference(rec, "cpsgd", DELAY2_KNOBS)
    assert [t for t in range(4, 20) if traj.push_kind[t] == "dense"] == [5, 8, 11, 14, 17]
    assert_nontrivial_quantization(traj)
    assert_reference_differs(rec, "cpsgd", DELAY_KNOBS,
                             "the correction step must build on the own weights")


@pytest.mark.parametrize("delay", [1, 2])
def test_next_backward_does_not_wait_for_the_correction_round(worker_job, tmp_path, delay):
    """Worker 1 holds back its correction push until worker 0 has overwritten its
    gradients after the step that follows the correction (what the next backward
    does): that write must not wait for the correction round, which cannot complete
    before (tests/workers/held_round_worker.py)."""
    result = worker_job("held_round_worker.py", str(tmp_path / "signal"), delay,
                        job_timeout=90)
    assert result.returncode == 0, result.text
    assert "worker 0: gradients written with the correction round open" in result.output
    assert result.output.count(": done") == 2, result.text
