"""Worker of tests/test_failures.py: a node of a training job dies mid-training.

Usage (inside a job): python failing_worker.py kill-worker|kill-server|kill-scheduler [ALGO]

Every worker trains a small net with kvstore=ALGO (default cpsgd, warm-up 2, so
the death comes in compressed one-step-delay rounds), waiting for each
iteration to finish.  After 3 iterations
    kill-worker: the worker with launcher index 1 SIGKILLs itself;
    kill-server: the worker with launcher index 0 SIGKILLs the job's server (the
                 process whose environment has DMLC_ROLE=server and this job's
                 DMLC_PS_ROOT_PORT);
    kill-scheduler: the same for the job's scheduler.
The survivors then block in the next round; only the launcher can end the job.
Each prints "KILL <node> at <unix time>" just before the kill.  A worker still
running after 120 s exits with code 3 (the test then fails on the time bound).
"""
import os
import signal
import sys
import time

import mxnet as mx
from mxnet import autograd, gluon

import mxnet_cpsgd
from mxnet_cpsgd.launch import WORKER_INDEX_ENV

INDEX = int(os.environ.get(WORKER_INDEX_ENV, "-1"))  # the launcher's worker index

KILL_AFTER = 3
GIVE_UP_S = 120


def server_pids(role="server"):
    port = os.environ["DMLC_PS_ROOT_PORT"].encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(i.split(b"=", 1) for i in f.read().split(b"\0") if b"=" in i)
        except OSError:
            continue
        if env.get(b"DMLC_ROLE") == role.encode() and env.get(b"DMLC_PS_ROOT_PORT") == port:
            pids.append(int(pid))
    return pids


def main(mode, algo):
    knobs = {"warmup_steps": 2} if algo in ("cpsgd", "odsgd") else {}
    store = mxnet_cpsgd.create(algo, **knobs)
    net = gluon.nn.Dense(3, in_units=4)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                            kvstore=store)
    started = time.time()
    t = 0
    while time.time() - started < GIVE_UP_S:
        if t == KILL_AFTER:
            if mode == "kill-worker" and INDEX == 1:
                print("KILL worker %d at %.3f" % (INDEX, time.time()), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "kill-server" and INDEX == 0:
                pids = server_pids()
                assert len(pids) == 1, "expected one server of this job, found %s" % pids
                print("KILL server pid %d at %.3f" % (pids[0], time.time()), flush=True)
                os.kill(pids[0], signal.SIGKILL)
            if mode == "kill-scheduler" and INDEX == 0:
                pids = server_pids("scheduler")
                assert len(pids) == 1, "expected one scheduler of this job, found %s" % pids
                print("KILL scheduler pid %d at %.3f" % (pids[0], time.time()), flush=True)
                os.kill(pids[0], signal.SIGKILL)
        with autograd.record():
            loss = net(mx.nd.ones((2, 4)) * (t + 1)).sum()
        loss.backward()
        trainer.step(2)
        mx.nd.waitall()
        t += 1
    print("worker %d still running after %d s (iteration %d)" % (INDEX, GIVE_UP_S, t), flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cpsgd")
