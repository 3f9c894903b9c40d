"""kvstore signsgd / topk / powersgd / acpsgd: real 2-process Horovod jobs vs numpy.

One ``horovodrun -np 2 -H localhost:2 --gloo`` job (module fixture) trains the
same small network (Conv2D 4-D weight, Dense 2-D weights, 1-D biases) once per
configuration below, recording every step's weights and the gradients MXNet
computed.  For each store, :mod:`compressor_reference` (float64, written from
the documented rules) replays the recorded gradients and must reach the job's
weights after every one of the 12 steps, on both ranks.

Tolerances: ``rtol=1e-4, atol=1e-5`` against the reference (the stores compute
in float32: norms, matrix products and Gram-Schmidt round differently from
float64); the exact cases (``topk`` ratio 1 and ``powersgd`` rank >= every
matrix's smaller side, vs ``horovod``) and rank 0 vs rank 1 use
``rtol=1e-5, atol=1e-6`` (in practice bitwise).

The job tests skip where ``horovod.mxnet`` is not importable.  Every process
carries a unique HOROVOD_TEST_TAG and is SIGKILLed afterwards, pass or fail.
"""
import json
import os
import shutil
import sys
import tempfile
import uuid

import numpy as np
import pytest

import compressor_reference as ref
from reference import SGD
from test_horovod import (JOB_TIMEOUT, _env, _kill_tagged, _python_c,  # noqa: F401 (tag)
                         run_horovod_job, tag)

try:
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(300)]
except ImportError:
    pytestmark = []

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(TESTS_DIR, "workers", "compressed_worker.py")
ITERATIONS, BATCH = 12, 4
OPTIMIZER = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}   # as the worker
REF_RTOL, REF_ATOL = 1e-4, 1e-5
EXACT_RTOL, EXACT_ATOL = 1e-5, 1e-6

RUNS = [
    {"label": "horovod", "kvstore": "horovod"},
    {"label": "signsgd", "kvstore": "signsgd"},
    {"label": "topk", "kvstore": "topk", "knobs": {"ratio": 0.1, "warmup_steps": 2}},
    {"label": "topk-all", "kvstore": "topk", "knobs": {"ratio": 1}},
    {"label": "powersgd", "kvstore": "powersgd", "knobs": {"rank": 2}},
    {"label": "powersgd-full", "kvstore": "powersgd", "knobs": {"rank": 64}},
    {"label": "acpsgd", "kvstore": "acpsgd", "knobs": {"rank": 2, "warmup_steps": 1}},
    {"label": "signsgd-per-key", "kvstore": "signsgd", "group_per_step": False},
    {"label": "powersgd-per-key", "kvstore": "powersgd", "knobs": {"rank": 2},
     "group_per_step": False},
    {"label": "acpsgd-frozen", "kvstore": "acpsgd", "knobs": {"rank": 2},
     "freeze": ["net_conv_bias", "net_hid_weight"]},
    {"label": "api-topk", "kvstore": "topk", "knobs": {"ratio": 1}, "api": True},
    {"label": "api-powersgd", "kvstore": "powersgd", "knobs": {"rank": 8}, "api": True},
]
TRAININGS = [r for r in RUNS if not r.get("api")]


@pytest.fixture(scope="module")
def job():
    """``job(label)``: per rank, the recorded arrays of one configuration."""
    pytest.importorskip("horovod.mxnet")
    exe = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(exe):
        pytest.skip("horovod.mxnet imports but %s does not exist" % exe)
    tag = uuid.uuid4().hex
    out_dir = tempfile.mkdtemp(prefix="cpsgd-compressors-")
    try:
        cmd = [exe, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER,
               out_dir, json.dumps(RUNS)]
        code, out = run_horovod_job(cmd, _env(tag), JOB_TIMEOUT)
        assert code == 0, "horovodrun %s:\n%s" % (
            "timed out" if code is None else "exited %s" % code, out[-6000:])
        results = {"output": out}
        for run in TRAININGS:
            ranks = []
            for r in range(2):
                path = os.path.join(out_dir, "%s-rank%d.npz" % (run["label"], r))
                assert os.path.exists(path), "%s rank %d wrote nothing:\n%s" % (
                    run["label"], r, out[-6000:])
                with np.load(path) as f:
                    ranks.append({k: f[k] for k in f.files})
            results[run["label"]] = ranks
    finally:
        _kill_tagged(tag)
        shutil.rmtree(out_dir, ignore_errors=True)
    return results.__getitem__


def _weights(rec, t=None):
    return {k[2:]: (v if t is None else v[t]) for k, v in rec.items() if k.startswith("w:")}


def _assert_close(actual, expected, rtol, atol, what):
    assert sorted(actual) == sorted(expected), what
    for n in expected:
        np.testing.assert_allclose(actual[n], expected[n], rtol=rtol, atol=atol,
                                   err_msg="%s: %s" % (what, n))


@pytest.mark.parametrize("label", ["signsgd", "topk", "powersgd", "acpsgd"])
def test_store_matches_numpy_reference(job, label):
    """Every step's weights of both ranks equal the numpy reference's."""
    run = next(r for r in RUNS if r["label"] == label)
    ranks = job(label)
    names = sorted(_weights(ranks[0]))
    keys = {str(n): k for k, n in enumerate(ranks[0]["keys"])}
    w0 = _weights(ranks[0], 0)
    _assert_close(_weights(ranks[1], 0), w0, 0, 0, "initial weights")
    grads = [[{n: ranks[i]["g:" + n][t] for n in names} for i in range(2)]
             for t in range(ITERATIONS)]
    sgd = SGD(OPTIMIZER["learning_rate"], OPTIMIZER["momentum"], OPTIMIZER["wd"],
              rescale=1.0 / BATCH)
    expected = ref.simulate(run["kvstore"], run.get("knobs"), w0, grads, keys, sgd)
    worst = 0.0
    for t in range(1, ITERATIONS + 1):
        for i in range(2):
            got = _weights(ranks[i], t)
            _assert_close(got, expected[t], REF_RTOL, REF_ATOL,
                          "%s rank %d after %d steps vs numpy" % (label, i, t))
            worst = max(worst, max(float(np.abs(got[n] - expected[t][n]).max())
                                   for n in names))
    print("%s vs numpy: max |difference| over %d steps %.3g" % (label, ITERATIONS, worst))
    # the compression did something: the result is not S-SGD's
    dense = ref.simulate("topk", {"ratio": 1.0}, w0, grads, keys,
                         SGD(OPTIMIZER["learning_rate"], OPTIMIZER["momentum"],
                             OPTIMIZER["wd"], rescale=1.0 / BATCH))
    assert any(not np.allclose(expected[-1][n], dense[-1][n], rtol=1e-3, atol=1e-4)
               for n in names), label


@pytest.mark.parametrize("label", ["signsgd", "powersgd"])
def test_per_key_exchange_is_the_same_rule(job, label):
    """store.group_per_step = False (each key exchanged on its own) changes nothing
    but the timing of the collectives."""
    for r in range(2):
        _assert_close(_weights(job(label + "-per-key")[r]), _weights(job(label)[r]),
                      EXACT_RTOL, EXACT_ATOL, "%s per key vs grouped, rank %d" % (label, r))


def test_frozen_parameters_do_not_hold_the_group_back(job):
    """Keys broadcast but never pushed (grad_req='null'): the Trainer's end of
    _allreduce_grads releases the step's group; the frozen weights stay."""
    ranks = job("acpsgd-frozen")
    w_start, w_end = _weights(ranks[0], 0), _weights(ranks[0], -1)
    for n in ("net_conv_bias", "net_hid_weight"):
        np.testing.assert_array_equal(w_end[n], w_start[n])
    assert not np.allclose(w_end["net_out_weight"], w_start["net_out_weight"])
    _assert_close(_weights(ranks[1]), _weights(ranks[0]), EXACT_RTOL, EXACT_ATOL,
                  "acpsgd-frozen: rank 1 vs rank 0")


@pytest.mark.parametrize("label", ["api-topk", "api-powersgd"])
def test_pushpull_devices_out_and_key_lists(job, label):
    """Several devices per worker, ``out=`` and lists of keys (worker's check_api)."""
    out = job("output")
    for r in range(2):
        assert "api ok %s rank=%d" % (label, r) in out, out[-4000:]


@pytest.mark.parametrize("label", [r["label"] for r in TRAININGS])
def test_both_ranks_end_identical(job, label):
    ranks = job(label)
    _assert_close(_weights(ranks[1]), _weights(ranks[0]), EXACT_RTOL, EXACT_ATOL,
                  "%s: rank 1 vs rank 0" % label)


@pytest.mark.parametrize("label", ["topk-all", "powersgd-full"])
def test_uncompressed_limit_equals_horovod(job, label):
    """topk with ratio=1 and powersgd with rank >= min(n, m) are S-SGD exactly."""
    for r in range(2):
        got, want = _weights(job(label)[r]), _weights(job("horovod")[r])
        _assert_close(got, want, EXACT_RTOL, EXACT_ATOL, "%s vs horovod, rank %d" % (label, r))
        print("%s vs horovod rank %d: max |difference| %.3g" % (
            label, r, max(float(np.abs(got[n] - want[n]).max()) for n in want)))


BAD_KNOBS = r"""
import sys, mxnet as mx, mxnet_cpsgd
from mxnet import autograd, gluon
cases = [('topk', {'ratio': 0}), ('topk', {'ratio': -0.5}), ('topk', {'ratio': 1.5}),
         ('powersgd', {'rank': 0}), ('acpsgd', {'rank': 0}), ('acpsgd', {'rank': 2.5}),
         ('signsgd', {'ratio': 0.1}), ('topk', {'rank': 2}), ('powersgd', {'threshold': 0.5}),
         ('signsgd', {'exchange': 'per_layer'})]
for name, knobs in cases:
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                            kvstore=name, compression_params=knobs)
    with autograd.record():
        loss = net(mx.nd.ones((1, 3))).sum()
    loss.backward()
    before = net.weight.data().asnumpy().copy()
    try:
        trainer.step(1)
    except mxnet_cpsgd.ConfigError as err:
        assert (net.weight.data().asnumpy() == before).all()
        print('CONFIG ERROR %s: %s' % (name, err))
        continue
    print('NO ERROR', name, knobs); sys.exit(1)
for var, value, name in [('MXNET_CPSGD_RATIO', '0', 'topk'), ('MXNET_CPSGD_RANK', '0', 'acpsgd'),
                         ('MXNET_CPSGD_EXCHANGE', 'sometimes', 'topk')]:
    import os
    os.environ[var] = value
    try:
        mx.kv.create(name)
    except mxnet_cpsgd.ConfigError as err:
        print('CONFIG ERROR %s: %s' % (name, err))
    else:
        print('NO ERROR', var); sys.exit(1)
    del os.environ[var]
"""


def test_bad_knobs_fail_before_the_first_step(tag):
    pytest.importorskip("horovod.mxnet")
    code, out = _python_c(BAD_KNOBS, tag)
    assert code == 0, out[-4000:]
    for line in [
            "compression_params['ratio'] must be in (0, 1] (the fraction of each tensor's "
            "elements sent), got 0.0",
            "got -0.5", "got 1.5",
            "CONFIG ERROR powersgd: compression_params['rank'] must be an integer >= 1, got 0",
            "CONFIG ERROR acpsgd: compression_params['rank'] must be an integer >= 1, got 0",
            "got 2.5",
            "compression_params['ratio'] is not used by kvstore 'signsgd'; it accepts: "
            "exchange, warmup_steps",
            "compression_params['rank'] is not used by kvstore 'topk'; it accepts: "
            "exchange, ratio, warmup_steps",
            "compression_params['threshold'] is not used by kvstore 'powersgd'; it accepts: "
            "exchange, rank, warmup_steps",
            "CONFIG ERROR signsgd: compression_params['exchange'] must be one of "
            "'per_step', 'per_key', got 'per_layer'",
            "environment variable MXNET_CPSGD_RATIO must be in (0, 1]",
            "environment variable MXNET_CPSGD_RANK must be an integer >= 1, got '0'",
            "CONFIG ERROR topk: environment variable MXNET_CPSGD_EXCHANGE must be one of "
            "'per_step', 'per_key', got 'sometimes'"]:
        assert line in out, (line, out[-4000:])


def test_stores_are_registered(tag):
    code, out = _python_c(
        "import sys; sys.modules['horovod'] = None\n"
        "import mxnet as mx, mxnet_cpsgd\n"
        "for n in ('signsgd', 'topk', 'powersgd', 'acpsgd'):\n"
        "    assert n in mxnet_cpsgd.ALGORITHMS, n\n"
        "    assert mx.kv.KVStoreBase.kv_registry[n].compressor_class.name == n\n"
        "    try:\n"
        "        mx.kv.create(n)\n"
        "    except ImportError as err:\n"
        "        assert \"kvstore '%s' needs Horovod\" % n in str(err), err\n"
        "    else:\n"
        "        sys.exit(1)\n"
        "print('OK')\n", tag)
    assert code == 0 and "OK" in out, out[-4000:]
