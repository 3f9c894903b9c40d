"""kvstore cpsgd_<compressor> and fp16: real 2-process Horovod jobs vs numpy.

One ``horovodrun -np 2 -H localhost:2 --gloo`` job (module fixture) trains the
network of tests/workers/compressed_worker.py once per configuration below (12
steps, warm-up, compressed and correction steps), recording every step's local
weights L (the Trainer's parameters), the store's global weights W and the
gradients MXNet computed.  :func:`compressor_reference.simulate_cp` (float64,
written from docs/algorithms/cp-compressors.md) replays the recorded gradients
and must reach the job's W and both ranks' L after every step.

Tolerances as tests/test_compressors.py: ``rtol=1e-4, atol=1e-5`` against the
reference; the exact cases (k = 1, topk ratio 1, powersgd full rank vs dense CP;
W rank 0 vs rank 1; a resumed run vs the uninterrupted one) ``rtol=1e-5,
atol=1e-6`` (in practice bitwise).
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
ITERATIONS, BATCH, WORKERS = 12, 4, 2
OPTIMIZER = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}   # as the worker
REF_RTOL, REF_ATOL = 1e-4, 1e-5
EXACT_RTOL, EXACT_ATOL = 1e-5, 1e-6


def _cp(label, compressor, **knobs):
    knobs.setdefault("warmup_steps", 2)
    knobs.setdefault("correction_period", 3)
    return {"label": label, "kvstore": "cpsgd_" + compressor, "knobs": knobs}


RUNS = [
    _cp("cp-signsgd", "signsgd"),
    _cp("cp-topk", "topk", ratio=0.1),
    _cp("cp-topk-fold", "topk", ratio=0.1, correction_residual="fold"),
    # every parameter dense at its own phase: each step mixes dense and compressed keys
    _cp("cp-topk-staggered", "topk", ratio=0.1, correction_schedule="staggered"),
    _cp("cp-powersgd", "powersgd", rank=2, warmup_steps=1, correction_period=4),
    # the authors' local momentum 0 (the others: the Trainer's, the default)
    _cp("cp-powersgd-fold", "powersgd", rank=2, correction_residual="fold",
        local_momentum=0.0),
    _cp("cp-acpsgd", "acpsgd", rank=2, local_momentum=0.5),
    _cp("cp-fp16", "fp16", warmup_steps=1, correction_period=4),
    # the uncompressed limits: every one is dense CP
    _cp("cp-dense", "signsgd", correction_period=1),
    _cp("cp-topk-k1", "topk", ratio=0.1, correction_period=1),
    _cp("cp-topk-all", "topk", ratio=1),
    _cp("cp-powersgd-full", "powersgd", rank=64),
    # each key exchanged as soon as it is pushed: by the attribute, and by the knob
    # exchange='per_key' through each of its routes
    dict(_cp("cp-powersgd", "powersgd", rank=2, warmup_steps=1, correction_period=4),
         label="cp-powersgd-per-key", group_per_step=False),
    dict(_cp("cp-topk", "topk", ratio=0.1, exchange="per_key"), label="cp-topk-per-key"),
    dict(_cp("cp-signsgd", "signsgd", exchange="per_key"), label="cp-signsgd-per-key-env",
         route="env"),
    dict(_cp("cp-acpsgd", "acpsgd", rank=2, local_momentum=0.5, exchange="per_key"),
         label="cp-acpsgd-per-key-config", route="config"),
    dict(_cp("cp-topk", "topk", ratio=0.1), label="cp-topk-resumed", resume_at=7),
    dict(_cp("cp-acpsgd", "acpsgd", rank=2, local_momentum=0.5), label="cp-acpsgd-resumed",
         resume_at=6),
    {"label": "fp16", "kvstore": "fp16", "knobs": {"warmup_steps": 1, "exchange": "per_step"}},
    {"label": "fp16-per-key", "kvstore": "fp16", "knobs": {"warmup_steps": 1}},
    # momentum on the workers: u through the compressor and its error memory
    _cp("cp-topk-wm", "topk", ratio=0.1, momentum_path="worker"),
    _cp("cp-topk-wm-g", "topk", ratio=0.1, momentum_path="worker", local_input="gradient"),
    _cp("cp-topk-all-wm", "topk", ratio=1, momentum_path="worker"),
    dict(_cp("cp-topk-wm", "topk", ratio=0.1, momentum_path="worker"),
         label="cp-topk-wm-resumed", resume_at=7),
]
COMPRESSED = ["cp-signsgd", "cp-topk", "cp-topk-fold", "cp-topk-staggered", "cp-powersgd",
              "cp-powersgd-fold", "cp-acpsgd", "cp-fp16"]


@pytest.fixture(scope="module")
def job():
    """``job(label)``: per rank, the recorded arrays of one configuration."""
    pytest.importorskip("horovod.mxnet")
    exe = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(exe):
        pytest.skip("horovod.mxnet imports but %s does not exist" % exe)
    tag = uuid.uuid4().hex
    out_dir = tempfile.mkdtemp(prefix="cpsgd-cp-compressors-")
    try:
        cmd = [exe, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER,
               out_dir, json.dumps(RUNS)]
        code, out = run_horovod_job(cmd, _env(tag), JOB_TIMEOUT)
        assert code == 0, "horovodrun %s:\n%s" % (
            "timed out" if code is None else "exited %s" % code, out[-6000:])
        results = {}
        for run in RUNS:
            ranks = []
            for r in range(WORKERS):
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


def _arrays(rec, prefix, t=None):
    return {k[2:]: (v if t is None else v[t]) for k, v in rec.items() if k.startswith(prefix)}


def _assert_close(actual, expected, rtol, atol, what):
    assert sorted(actual) == sorted(expected), what
    for n in expected:
        np.testing.assert_allclose(actual[n], expected[n], rtol=rtol, atol=atol,
                                   err_msg="%s: %s" % (what, n))


def _replay(run, ranks, compressor=None, knobs=None):
    names = sorted(_arrays(ranks[0], "w:"))
    keys = {str(n): k for k, n in enumerate(ranks[0]["keys"])}
    grads = [[{n: ranks[i]["g:" + n][t] for n in names} for i in range(WORKERS)]
             for t in range(ITERATIONS)]
    knobs = dict(run["knobs"] if knobs is None else knobs)
    lr = OPTIMIZER["learning_rate"]
    sgd = SGD(lr, OPTIMIZER["momentum"], OPTIMIZER["wd"], rescale=1.0 / BATCH)
    # Opt_l defaults of cpsgd: sgd, lr M x the Trainer's, wd 0, the Trainer's momentum
    # (0 when the workers run momentum)
    default_momentum = 0.0 if knobs.get("momentum_path") == "worker" \
        else OPTIMIZER["momentum"]
    local = [SGD(WORKERS * lr, knobs.get("local_momentum", default_momentum), 0.0,
                 rescale=1.0 / BATCH) for _ in range(WORKERS)]
    compressor = compressor or run["kvstore"][len("cpsgd_"):]
    return ref.simulate_cp(compressor, knobs, _arrays(ranks[0], "w:", 0), grads, keys,
                           sgd, local, WORKERS)


@pytest.mark.parametrize("label", COMPRESSED + ["cp-dense", "cp-topk-wm", "cp-topk-wm-g"])
def test_cp_store_matches_numpy_reference(job, label):
    """W and both ranks' L after every step equal the numpy replay of the rule."""
    run = next(r for r in RUNS if r["label"] == label)
    ranks = job(label)
    want_w, want_l = _replay(run, ranks)
    worst = 0.0
    for t in range(ITERATIONS + 1):
        for i in range(WORKERS):
            got_w, got_l = _arrays(ranks[i], "W:", t), _arrays(ranks[i], "w:", t)
            _assert_close(got_w, want_w[t], REF_RTOL, REF_ATOL,
                          "%s rank %d: W after %d steps vs numpy" % (label, i, t))
            _assert_close(got_l, want_l[t][i], REF_RTOL, REF_ATOL,
                          "%s rank %d: L after %d steps vs numpy" % (label, i, t))
            worst = max(worst, max(float(np.abs(got_l[n] - want_l[t][i][n]).max())
                                   for n in got_l))
    print("%s vs numpy: max |difference| of L over %d steps %.3g" % (label, ITERATIONS, worst))
    # after warm-up the ranks train on different local weights
    last = [_arrays(ranks[i], "w:", ITERATIONS) for i in range(WORKERS)]
    assert any(not np.allclose(last[0][n], last[1][n]) for n in last[0]), label
    if label != "cp-dense":
        # the compression did something: the replay differs from dense CP's
        dense_w, _ = _replay(run, ranks, "topk", dict(run["knobs"], ratio=1.0))
        assert any(not np.allclose(want_w[-1][n], dense_w[-1][n], rtol=1e-3, atol=1e-4)
                   for n in want_w[-1]), label


def test_staggered_schedule_is_not_the_aligned_one(job):
    """The staggered run's weights are not what the aligned rule gives from the
    same gradients: the test above can tell the two schedules apart."""
    run = next(r for r in RUNS if r["label"] == "cp-topk-staggered")
    ranks = job(run["label"])
    aligned_w, _ = _replay(run, ranks, knobs=dict(run["knobs"], correction_schedule="aligned"))
    got = _arrays(ranks[0], "W:", ITERATIONS)
    assert any(not np.allclose(got[n], aligned_w[-1][n], rtol=1e-3, atol=1e-4) for n in got)


@pytest.mark.parametrize("label", [r["label"] for r in RUNS if r["kvstore"] != "fp16"])
def test_global_weights_identical_on_all_ranks(job, label):
    ranks = job(label)
    _assert_close(_arrays(ranks[1], "W:"), _arrays(ranks[0], "W:"), 0, 0,
                  "%s: W of rank 1 vs rank 0" % label)


@pytest.mark.parametrize("label", ["cp-topk-k1", "cp-topk-all", "cp-powersgd-full"])
def test_uncompressed_limits_equal_dense_cp(job, label):
    """correction_period 1, topk ratio 1 and powersgd at full rank are dense CP."""
    for r in range(WORKERS):
        for prefix in ("w:", "W:"):
            _assert_close(_arrays(job(label)[r], prefix), _arrays(job("cp-dense")[r], prefix),
                          EXACT_RTOL, EXACT_ATOL, "%s vs cp-dense, rank %d, %s" % (label, r,
                                                                                  prefix))


#: (run exchanging each key on its own, the grouped run of the same settings)
PER_KEY = [("cp-powersgd-per-key", "cp-powersgd"),            # group_per_step = False
           ("cp-topk-per-key", "cp-topk"),                    # compression_params
           ("cp-signsgd-per-key-env", "cp-signsgd"),          # MXNET_CPSGD_EXCHANGE
           ("cp-acpsgd-per-key-config", "cp-acpsgd"),         # create(AlgorithmConfig)
           ("fp16-per-key", "fp16")]                          # fp16's default


@pytest.mark.parametrize("per_key,grouped", PER_KEY)
def test_per_key_exchange_is_the_same_rule(job, per_key, grouped):
    """Each key exchanged as soon as it is pushed gives the grouped run's local
    weights and W (the grouped runs match the numpy reference above)."""
    for r in range(WORKERS):
        for prefix in ("w:", "W:"):
            _assert_close(_arrays(job(per_key)[r], prefix), _arrays(job(grouped)[r], prefix),
                          EXACT_RTOL, EXACT_ATOL,
                          "%s vs %s, rank %d, %s" % (per_key, grouped, r, prefix))


@pytest.mark.parametrize("per_key,grouped", PER_KEY)
def test_exchange_setting_selects_the_exchange(job, per_key, grouped):
    """The store really exchanged key by key (its exchanges are keyed by the
    Trainer's keys) in the per-key run and a step at a time in the grouped one."""
    keys = {str(k) for k in range(len(job(grouped)[0]["keys"]))}
    for r in range(WORKERS):
        assert set(job(per_key)[r]["exchanges"]) == keys, (per_key, r)
        assert set(job(grouped)[r]["exchanges"]) == {"step"}, (grouped, r)


@pytest.mark.parametrize("label", ["cp-topk", "cp-acpsgd", "cp-topk-wm"])
def test_resume_restores_every_state(job, label):
    """save_states after some steps, a fresh network and Trainer, load_states: the
    run goes on exactly as the uninterrupted one (W, L, Opt_g, Opt_l momentum, error
    memory, ACP-SGD's factors and alternation, the step counters)."""
    for r in range(WORKERS):
        for prefix in ("w:", "W:"):
            _assert_close(_arrays(job(label + "-resumed")[r], prefix),
                          _arrays(job(label)[r], prefix), EXACT_RTOL, EXACT_ATOL,
                          "%s resumed vs uninterrupted, rank %d, %s" % (label, r, prefix))


def test_worker_momentum_topk_ratio_1_is_ssgd_with_momentum(job):
    """cpsgd_topk with ratio 1 (nothing compressed away) and momentum_path='worker':
    W is S-SGD with momentum (the Trainer's SGD, momentum 0.9, wd) on the sum of the
    workers' gradients, computed here in float64 from the recorded gradients; after
    warm-up each L is W_t - M * lr / B * u_i.  The momentum is really on the workers:
    the servers' rule (momentum in Opt_g, L from g) gives other local weights."""
    ranks = job("cp-topk-all-wm")
    names = sorted(_arrays(ranks[0], "w:"))
    lr, mu, wd = OPTIMIZER["learning_rate"], OPTIMIZER["momentum"], OPTIMIZER["wd"]
    ssgd = SGD(lr, mu, wd, rescale=1.0 / BATCH)
    w = {n: ranks[0]["W:" + n][0].astype(np.float64) for n in names}
    u = [{n: 0.0 for n in names} for _ in range(WORKERS)]
    warmup = 2
    for t in range(ITERATIONS):
        g = [{n: ranks[i]["g:" + n][t].astype(np.float64) for n in names}
             for i in range(WORKERS)]
        for i in range(WORKERS):
            u[i] = {n: mu * u[i][n] + g[i][n] + wd * w[n] * BATCH / WORKERS for n in names}
        local = [{n: w[n] - WORKERS * lr / BATCH * u[i][n] for n in names}
                 for i in range(WORKERS)]
        w = {n: ssgd.step(n, w[n], sum(gi[n] for gi in g)) for n in names}
        for i in range(WORKERS):
            _assert_close(_arrays(ranks[i], "W:", t + 1), w, EXACT_RTOL, EXACT_ATOL,
                          "rank %d: W after %d steps vs S-SGD with momentum" % (i, t + 1))
            _assert_close(_arrays(ranks[i], "w:", t + 1), w if t < warmup else local[i],
                          EXACT_RTOL, EXACT_ATOL, "rank %d: L after %d steps" % (i, t + 1))
    server_w, server_l = _replay(next(r for r in RUNS if r["label"] == "cp-topk-all-wm"),
                                 ranks, knobs={"ratio": 1, "warmup_steps": 2,
                                               "correction_period": 3})
    last = _arrays(ranks[0], "w:", ITERATIONS)
    assert any(not np.allclose(last[n], server_l[-1][0][n], rtol=1e-3, atol=1e-4)
               for n in names)


def test_fp16_store_matches_numpy_reference(job):
    """kvstore='fp16' alone: the Trainer's SGD on the float16 sum of the gradients."""
    ranks = job("fp16")
    names = sorted(_arrays(ranks[0], "w:"))
    keys = {str(n): k for k, n in enumerate(ranks[0]["keys"])}
    grads = [[{n: ranks[i]["g:" + n][t] for n in names} for i in range(WORKERS)]
             for t in range(ITERATIONS)]
    sgd = SGD(OPTIMIZER["learning_rate"], OPTIMIZER["momentum"], OPTIMIZER["wd"],
              rescale=1.0 / BATCH)
    want = ref.simulate("fp16", {"warmup_steps": 1}, _arrays(ranks[0], "w:", 0), grads,
                        keys, sgd)
    for t in range(ITERATIONS + 1):
        for i in range(WORKERS):
            _assert_close(_arrays(ranks[i], "w:", t), want[t], REF_RTOL, REF_ATOL,
                          "fp16 rank %d after %d steps" % (i, t))
    _assert_close(_arrays(ranks[1], "w:"), _arrays(ranks[0], "w:"), 0, 0, "fp16 ranks")


BAD = r"""
import os, sys, mxnet as mx, mxnet_cpsgd
from mxnet import autograd, gluon
cases = [('cpsgd_topk', {'threshold': 0.5}), ('cpsgd_topk', {'type': '2bit'}),
         ('cpsgd_signsgd', {'ratio': 0.1}), ('cpsgd_powersgd', {'correction_period': 0}),
         ('cpsgd_acpsgd', {'correction_residual': 'reset'}), ('fp16', {'correction_period': 2}),
         ('topk', {'correction_residual': 'fold'}), ('cpsgd', {'correction_residual': 'fold'}),
         ('topk', {'momentum_path': 'worker'}), ('cpsgd_topk', {'momentum_path': 'both'}),
         ('cpsgd_topk', {'local_input': 'gradient'}), ('cpsgd_fp16', {'exchange': 'grouped'}),
         ('horovod', {'exchange': 'per_key'}), ('cpsgd', {'exchange': 'per_key'}),
         ('bitsgd', {'exchange': 'per_step'})]
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
try:
    gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                  kvstore='cpsgd_fp16', update_on_kvstore=False).step(1)
except RuntimeError as err:
    print('RUNTIME ERROR', err)
os.environ['MXNET_CPSGD_CORRECTION_RESIDUAL'] = 'both'
try:
    mx.kv.create('cpsgd_topk')
except mxnet_cpsgd.ConfigError as err:
    print('CONFIG ERROR env: %s' % err)
"""


def test_bad_combinations_fail_before_the_first_step(tag):
    pytest.importorskip("horovod.mxnet")
    code, out = _python_c(BAD, tag)
    assert code == 0, out[-4000:]
    for line in [
            "CONFIG ERROR cpsgd_topk: compression_params['threshold'] is not used by "
            "kvstore 'cpsgd_topk'; it accepts: correction_period, correction_residual",
            "compression_params['type'] is not used by kvstore 'cpsgd_topk'",
            "compression_params['ratio'] is not used by kvstore 'cpsgd_signsgd'",
            "CONFIG ERROR cpsgd_powersgd: compression_params['correction_period'] must be "
            "an integer >= 1, got 0",
            "CONFIG ERROR cpsgd_acpsgd: compression_params['correction_residual'] must be "
            "'carry'",
            "compression_params['correction_period'] is not used by kvstore 'fp16'",
            "compression_params['correction_residual'] is not used by kvstore 'topk'",
            "compression_params['correction_residual'] is not used by kvstore 'cpsgd'",
            "compression_params['momentum_path'] is not used by kvstore 'topk'",
            "CONFIG ERROR cpsgd_topk: compression_params['momentum_path'] must be one of "
            "'server', 'worker', got 'both'",
            "CONFIG ERROR cpsgd_topk: local_input='gradient' needs momentum_path='worker'",
            "CONFIG ERROR cpsgd_fp16: compression_params['exchange'] must be one of "
            "'per_step', 'per_key', got 'grouped'",
            # the stores that exchange nothing compressed refuse the knob
            "CONFIG ERROR horovod: compression_params['exchange'] is not used by kvstore "
            "'horovod'; it accepts: no settings",
            "CONFIG ERROR cpsgd: compression_params['exchange'] is not used by kvstore 'cpsgd'",
            "CONFIG ERROR bitsgd: compression_params['exchange'] is not used by kvstore "
            "'bitsgd'",
            "RUNTIME ERROR kvstore 'cpsgd_fp16' needs update_on_kvstore=True",
            "CONFIG ERROR env: environment variable MXNET_CPSGD_CORRECTION_RESIDUAL must be "
            "'carry'"]:
        assert line in out, (line, out[-4000:])


@pytest.mark.parametrize("compressor", ["topk", "powersgd"])
def test_fold_and_carry_differ(job, compressor):
    """correction_residual='fold' changes the result (its replay passed above)."""
    fold = _arrays(job("cp-%s-fold" % compressor)[0], "W:")
    carry_run = next(r for r in RUNS if r["label"] == "cp-%s-fold" % compressor)
    carry, _ = _replay(carry_run, job("cp-%s-fold" % compressor),
                       knobs=dict(carry_run["knobs"], correction_residual="carry"))
    assert any(not np.allclose(fold[n][-1], carry[-1][n], rtol=1e-4, atol=1e-5)
               for n in fold), compressor
