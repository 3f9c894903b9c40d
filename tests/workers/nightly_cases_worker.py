"""Worker of tests/test_module_api.py: MXNet's nightly dist_sync KVStore cases, classic API.

Usage (inside a 2-worker job): nightly_cases_worker.py STORE CASE

Written here from what MXNet 1.9.1's tests/nightly/dist_sync_kvstore.py checks
against ``dist_sync``, with the project's store STORE in its place.  The servers
run MXNet's ``test`` optimizer (w += rescale_grad * g, rescale_grad 2), so every
pulled value has a closed form:

* ``dense`` (ssgd): keys initialised with ones (2x3, and 40x30, above
  MXNet's big-array bound; float32 and float16), pulled before any push (their
  init values), then per key NREPEAT x (push ones * (rank + 1), pull), the pull
  after push i being 1 + rate * (1 + 2) * (i + 1);
* ``2bit`` (bitsgd, threshold 0.5): keys of 2x3, 37x41 and 40x30: a key
  initialised with ones pulls ones (no compression at init); pushes of 0 give 0;
  0.4 then 0.1 then 0.2 then 0.3 give 0, 2, 2, 4 (the residual carries what the
  2-bit code leaves); a push of the threshold adds rate * workers * threshold;
  and pushes of random gradients (the same on every worker) move each key by
  rate * workers * a numpy 2-bit quantizer's output (float32, as MXNet);
  refused with a message: float16 keys, row_sparse keys, a key after the first push;
* ``gluon_type``: a Trainer over parameters on two devices takes the store with
  update_on_kvstore None or True (refused with False, as for every
  parameter-server store).

Prints "NIGHTLY <json>": case -> None when it held, else what went wrong.
"""
import json
import os
import sys
import traceback

import mxnet as mx
import numpy as np

import mxnet_cpsgd  # noqa: F401  registers the stores

STORE, CASE = sys.argv[1], sys.argv[2]
RATE, NREPEAT, THRESHOLD = 2, 3, 0.5
# the nightly test's 1211x1211 and 1200x1200, scaled down with the big-array bound
# (MXNET_KVSTORE_BIGARRAY_BOUND, set for every node by the test): still above it
BOUND = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", 1000000))
SMALL, IRREGULAR, BIG = (2, 3), (37, 41), (40, 30)
assert IRREGULAR[0] * IRREGULAR[1] > BOUND and BIG[0] * BIG[1] > BOUND, BOUND
kv = mx.kv.create(STORE)
RANK, WORKERS = kv.rank, kv.num_workers
results = {}


def case(name):
    def run(fn):
        try:
            fn()
            results[name] = None
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = traceback.format_exc(limit=3)
    return run


def refused(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the message is what the test reads
        return "%s: %s" % (type(err).__name__, err)
    return None


def equal(array, value, what):
    got = array.asnumpy().astype(np.float64)
    if not np.array_equal(got, np.broadcast_to(np.asarray(value, np.float64), got.shape)):
        raise AssertionError("%s: expected %s, got values %s" % (what, value,
                                                                 np.unique(got)[:5]))


def test_optimizer():
    return mx.optimizer.create("test", rescale_grad=RATE)


def dense():
    keys = {"3": (SMALL, "float32"), "5": (SMALL, "float32"), "99": (BIG, "float32"),
            "4": (SMALL, "float16"), "6": (SMALL, "float16"), "100": (BIG, "float16")}
    init_keys = {str(200 + i): i for i in range(4)}  # init values 0..3, never pushed
    for k, (shape, dtype) in keys.items():
        kv.init(k, mx.nd.ones(shape, dtype=dtype))
    for k, value in init_keys.items():
        kv.init(k, mx.nd.ones(SMALL) * value)
    kv.set_optimizer(test_optimizer())

    @case("init_then_pull")
    def _():
        for k, value in init_keys.items():
            out = mx.nd.zeros(SMALL)
            kv.pull(k, out=out)
            equal(out, value, "key %s" % k)

    @case("push_pull")
    def _():
        for k, (shape, dtype) in keys.items():
            for i in range(NREPEAT):
                kv.push(k, mx.nd.ones(shape, dtype=dtype) * (RANK + 1))
                out = mx.nd.zeros(shape, dtype=dtype)
                kv.pull(k, out=out)
                equal(out, 1 + RATE * (WORKERS + 1) * WORKERS / 2 * (i + 1),
                      "key %s (%s) after push %d" % (k, dtype, i))


def two_bits():
    kv.set_gradient_compression({"type": "2bit", "threshold": THRESHOLD})
    zeros = {"1000": SMALL, "1200": IRREGULAR, "1300": BIG}
    ones = {"1001": SMALL, "1201": IRREGULAR, "1301": BIG}
    rand = {"1002": SMALL, "1202": IRREGULAR, "1302": BIG}
    for group, value in ((zeros, 0), (ones, 1), (rand, 0)):
        for k, shape in group.items():
            kv.init(k, mx.nd.ones(shape) * value)
    results["refused_float16"] = refused(lambda: kv.init("7", mx.nd.ones(SMALL,
                                                                         dtype="float16")))
    results["refused_row_sparse"] = refused(lambda: kv.init(
        "9", mx.nd.ones(SMALL).tostype("row_sparse")))
    kv.set_optimizer(test_optimizer())

    def push_pull(k, shape, grad):
        kv.push(k, mx.nd.array(np.broadcast_to(grad, shape)))
        out = mx.nd.zeros(shape)
        kv.pull(k, out=out)
        return out

    @case("pull_before_push")
    def _():
        for group, value in ((zeros, 0), (ones, 1)):
            for k, shape in group.items():
                out = mx.nd.ones(shape) * 7
                kv.pull(k, out=out)
                equal(out, value, "key %s" % k)

    @case("residual")
    def _():
        step = RATE * WORKERS * THRESHOLD
        for k, shape in zeros.items():
            equal(push_pull(k, shape, 0.0), 0, "key %s, zeros" % k)
            for grad, expected in ((0.4, 0), (THRESHOLD - 0.4, step), (0.2, step),
                                   (THRESHOLD - 0.2, 2 * step), (THRESHOLD, 3 * step)):
                equal(push_pull(k, shape, grad), expected, "key %s, push %s" % (k, grad))

    results["refused_new_key_after_push"] = refused(lambda: kv.init("late",
                                                                    mx.nd.zeros(SMALL)))

    @case("random")
    def _():
        rng = np.random.RandomState(123)  # every worker pushes the same gradients
        wrong = []
        for k, shape in rand.items():
            residual = np.zeros(shape, np.float32)
            for i in range(NREPEAT):
                before = mx.nd.zeros(shape)
                kv.pull(k, out=before)
                grad = rng.rand(*shape).astype(np.float32)
                after = push_pull(k, shape, grad)
                quantized, residual = two_bit(grad, residual)
                diff = after.asnumpy().astype(np.float64) - before.asnumpy()
                bad = np.abs(diff - quantized * WORKERS * RATE) > 1e-5
                if bad.any():  # noted, not raised: the other worker's pushes go on
                    wrong.append("key %s, push %d: %d of %d elements differ"
                                 % (k, i, bad.sum(), bad.size))
        if wrong:
            raise AssertionError("; ".join(wrong))


def two_bit(grad, residual):
    """MXNet's 2-bit code of ``grad`` with ``residual``, in float32 as MXNet computes
    it: (the decompressed values, the new residual)."""
    residual = residual + grad
    tau = np.float32(THRESHOLD)
    out = np.where(residual >= tau, tau, np.where(residual <= -tau, -tau, np.float32(0)))
    return out.astype(np.float32), (residual - out).astype(np.float32)


def gluon_type():
    found = {}
    for update_on_kv in (None, True, False):
        params = mx.gluon.ParameterDict()
        params.get("x", shape=(10, 1), lr_mult=1.0)
        params.initialize(ctx=[mx.cpu(0), mx.cpu(1)], init="zeros")
        trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1}, kvstore=kv,
                                   update_on_kvstore=update_on_kv)
        try:
            trainer._init_kvstore()
            found[str(update_on_kv)] = [trainer._kv_initialized, trainer._update_on_kvstore]
        except Exception as err:  # noqa: BLE001 - reported to the test
            found[str(update_on_kv)] = "%s: %s" % (type(err).__name__, err)
    results["trainer"] = found


{"dense": dense, "2bit": two_bits, "gluon_type": gluon_type}[CASE]()
print("NIGHTLY %d %s" % (RANK, json.dumps(results)), flush=True)
kv.barrier()
