"""Worker of tests/test_correction_delay.py: does ``correction_start='all'`` hold a
worker's correction pushes until the other worker has come as far?

Usage (inside a 2-worker job): ``gate_worker.py OUT_DIR START``, START 'own' or 'all'.

Both ranks train a small Dense network with ``kvstore='cpsgd'``,
``correction_delay=1``, warm-up 2, correction period 3 (the first correction is
step 2 + 3 = 5, i.e. ``(t + 1) % 3 == 0`` with t = 5).  Rank 1 stops before that
step's ``trainer.step`` until OUT_DIR/go exists.  Rank 0, right after its own
``trainer.step`` of the correction, waits for its first parameter's pushed
array (``send``) in a thread: with 'all' the store has written into it after the
signal round, which cannot end while rank 1 waits, so the wait must still run
after HOLD seconds; with 'own' nothing writes into it and the wait ends at
once.  Rank 0 then writes OUT_DIR/go, both train on, and each rank writes
OUT_DIR/gate-rank{r}.json: ``held`` (rank 0: was the wait still running after
HOLD s), ``released`` (did it end once rank 1 went on), the final weights.
"""
import json
import os
import sys
import threading
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd  # noqa: F401  (registers the stores)

CORRECTION_STEP = 5
ITERATIONS = 9
HOLD = 3.0
RELEASE_TIMEOUT = 60.0


def main(out_dir, start):
    net = gluon.nn.Dense(4, in_units=6, prefix="fc_")
    net.initialize(mx.init.Zero())
    rng = np.random.RandomState(7)
    for _, param in sorted(net.collect_params().items()):
        param.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, param.shape).astype(np.float32)))
    knobs = {"correction_delay": 1, "correction_start": start, "warmup_steps": 2,
             "correction_period": 3, "threshold": 0.05}
    store = mx.kv.create("cpsgd")
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9},
                            kvstore=store, compression_params=knobs)
    rank = store.rank
    data_rng = np.random.RandomState(100 + rank)
    go = os.path.join(out_dir, "go")
    result = {"rank": rank}
    for t in range(ITERATIONS):
        x = mx.nd.array(data_rng.normal(size=(4, 6)).astype(np.float32))
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        if t == CORRECTION_STEP and rank == 1:
            deadline = time.monotonic() + RELEASE_TIMEOUT
            while not os.path.exists(go):
                if time.monotonic() > deadline:
                    sys.exit("rank 1: %s never appeared" % go)
                time.sleep(0.05)
        trainer.step(4)
        if t == CORRECTION_STEP and rank == 0:
            send = store._params[min(store._params)].send
            waiter = threading.Thread(target=send.wait_to_read, daemon=True)
            waiter.start()
            waiter.join(HOLD)
            result["held"] = waiter.is_alive()
            with open(go, "w") as f:
                f.write("go\n")
            waiter.join(RELEASE_TIMEOUT)
            result["released"] = not waiter.is_alive()
    mx.nd.waitall()
    result["weights"] = {name: p.data().asnumpy().ravel().tolist()
                         for name, p in sorted(net.collect_params().items())}
    with open(os.path.join(out_dir, "gate-rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    print("rank %d done: %s" % (rank, {k: v for k, v in result.items() if k != "weights"}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
