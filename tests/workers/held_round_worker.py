"""Worker of tests/test_correction_delay.py: with ``correction_delay``, the step after a
correction must not make the next backward wait for the correction round.

Usage (inside a 2-worker job): python held_round_worker.py SIGNAL_FILE DELAY

Worker 1 (the launcher's index) holds back its correction step (t = CORRECTION) until
worker 0 has written SIGNAL_FILE, so the correction round cannot complete before.
Worker 0 runs the correction step and the step after it, then overwrites its gradient
arrays (what the next backward does) and waits for that write: it must finish with the
round still open.  Then it writes SIGNAL_FILE and both train on.  Worker 1 gives up
after HOLD_S seconds and exits with code 3 at once.
"""
import os
import sys
import time

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd  # noqa: F401  (registers the stores)

#: warm-up t = 0, 1; corrections at t = 2, 5, 8; t = 5 is the first whose step before
#: it and (delay 2) itself follow the knob's rule
KNOBS = {"warmup_steps": 2, "correction_period": 3}
CORRECTION = 5
STEPS = 9
HOLD_S = 30.0


def main(signal_file, delay):
    mx.random.seed(1)
    net = gluon.nn.Dense(4, in_units=8)
    net.initialize(mx.init.Uniform(0.1))
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9}, kvstore="cpsgd",
                            compression_params=dict(KNOBS, correction_delay=delay))
    rank = int(os.environ["MXNET_CPSGD_WORKER_INDEX"])  # the launcher's 0, 1
    data = mx.nd.array(mx.nd.random.uniform(shape=(16, 8)).asnumpy() + rank)
    for t in range(STEPS):
        if rank == 1 and t == CORRECTION:
            deadline = time.monotonic() + HOLD_S
            while not os.path.exists(signal_file):
                if time.monotonic() > deadline:
                    print("worker 1: no signal from worker 0 within %.0f s: its gradient "
                          "write waited for the correction round" % HOLD_S, flush=True)
                    os._exit(3)  # not sys.exit: the store would wait for the job at exit
                time.sleep(0.05)
        with autograd.record():
            loss = (net(data) ** 2).mean()
        loss.backward()
        trainer.step(16)
        if rank == 0 and t == CORRECTION + 1:
            for param in net.collect_params().values():
                param.grad()[:] = 0.0  # the next backward's write
            for param in net.collect_params().values():
                param.grad().wait_to_read()
            print("worker 0: gradients written with the correction round open", flush=True)
            with open(signal_file + ".tmp", "w") as f:
                f.write("written\n")
            os.replace(signal_file + ".tmp", signal_file)
        loss.wait_to_read()
    mx.nd.waitall()
    print("worker %d: done" % rank, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
