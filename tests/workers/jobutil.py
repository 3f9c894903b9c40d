"""Run ``record_weights.py`` in a real job and load what every worker recorded.

Jobs go through the ``worker_job`` fixture of tests/conftest.py, i.e.
:func:`mxnet_cpsgd.launch.run_job` (scheduler, servers and workers as separate
processes on loopback; every node is torn down, also on failure).  Results are
cached per spec for the pytest session, so a configuration that several tests
compare (e.g. the S-SGD baseline) runs once.
"""
import copy
import json
import os
import shutil
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_TIMEOUT = 180

_CACHE = {}


class Recording:
    """What the workers of one job recorded, by rank.

    Attributes:
        spec: the spec the job ran.
        ranks: list (index = rank) of dicts: array name -> np.ndarray.
        meta: list (index = rank) of the workers' metadata dicts.
        params: parameter names, in Trainer order.
        output: the job's output (for messages).
    """

    def __init__(self, spec, ranks, meta, output):
        self.spec = spec
        self.ranks = ranks
        self.meta = meta
        self.params = meta[0]["params"]
        self.output = output

    @property
    def num_workers(self):
        return len(self.ranks)

    def weights(self, rank, t):
        """{param: weights of worker ``rank`` before iteration ``t``} (t = 0..iterations)."""
        return {n: self.ranks[rank]["w:" + n][t] for n in self.params}

    def grads(self, rank, t):
        return {n: self.ranks[rank]["g:" + n][t] for n in self.params}

    def final(self, rank):
        return {n: self.ranks[rank]["final:" + n] for n in self.params}

    def data(self, rank, head):
        return self.ranks[rank]["x%d" % head], self.ranks[rank]["y%d" % head]


def run_recording(worker_job, spec, num_workers=2, num_servers=1, env=None):
    """Run one job with ``spec`` (see record_weights.py) and return a Recording.

    Args:
        worker_job: the ``worker_job`` fixture of tests/conftest.py.
        spec: the worker's spec (its ``out`` is filled in here).
        num_workers, num_servers: size of the job.
        env: extra environment of every node.

    Raises AssertionError with the job's output if the job fails.
    """
    key = json.dumps([spec, num_workers, num_servers, env], sort_keys=True)
    if key in _CACHE:
        return _CACHE[key]
    out = tempfile.mkdtemp(prefix="cpsgd-rec-")
    try:
        rec = _run_and_load(worker_job, spec, out, num_workers, num_servers, env)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    _CACHE[key] = rec
    return rec


def _run_and_load(worker_job, spec, out, num_workers, num_servers, env):
    spec = copy.deepcopy(spec)
    spec["out"] = out
    job_env = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
    job_env.update(env or {})
    result = worker_job("record_weights.py", json.dumps(spec), num_workers=num_workers,
                        num_servers=num_servers, env=job_env, job_timeout=JOB_TIMEOUT)
    leftover = getattr(result, "leftover", None)
    if leftover:
        raise AssertionError("processes of the job outlived run_job: %s" % leftover)
    if result.returncode != 0 or result.failure:
        raise AssertionError("job failed (returncode %r, failure %r) for spec\n%s\n"
                             "--- output (last 6000 chars) ---\n%s"
                             % (result.returncode, result.failure,
                                json.dumps(spec, indent=1), result.output[-6000:]))
    ranks, meta = [], []
    for r in range(num_workers):
        path = os.path.join(out, "rank%d.npz" % r)
        if not os.path.exists(path):
            raise AssertionError("worker rank %d wrote no recording; job output:\n%s"
                                 % (r, result.output[-6000:]))
        with np.load(path) as f:
            ranks.append({k: f[k] for k in f.files})
        with open(os.path.join(out, "rank%d.json" % r)) as f:
            meta.append(json.load(f))
    return Recording(spec, ranks, meta, result.output)


# ------------------------------------------------------------------ specs
#: the Trainer's SGD settings used by the tests
MOMENTUM = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}
PLAIN = {"learning_rate": 0.1, "momentum": 0.0, "wd": 0.0}
#: a small tanh MLP (every parameter < 1000 elements)
SMALL_MLP = [{"kind": "mlp", "in": 6, "hidden": 5, "out": 3}]


def spec(kvstore, knobs=None, optimizer=MOMENTUM, heads=SMALL_MLP, iterations=20, batch=4,
         seed=7, record_grads=True, **extra):
    """A record_weights.py spec; equal arguments give equal specs (one cached job)."""
    s = {"kvstore": kvstore, "knobs": knobs, "optimizer": dict(optimizer),
         "heads": copy.deepcopy(heads), "iterations": iterations, "batch": batch,
         "seed": seed, "record_grads": record_grads}
    s.update(extra)
    return s
