"""The Module API and the classic KVStore calls, in real jobs (LeNet-5, mnist-5k).

tests/workers/module_worker.py trains LeNet-5 (the project's Gluon model as a
symbol) through MXNet's Module API, 2 workers and 1 server:

* ``mod.fit(kvstore=<store>)`` with ``ssgd`` must end with the very weights
  MXNet's own ``dist_sync`` gives (momentum and weight decay with the Module
  API's per-name multipliers), and saving the optimizer states after 3 batches,
  loading them after fit and training batches 3.. again must give those weights
  again;
* ``mod.init_optimizer(kvstore='cpsgd')`` (a string, one device per worker) plus
  ``forward_backward`` / ``update`` (what fit does per batch), under MXNet's
  tools/launch.py through the mxlaunch shim (the worker started by
  ``python -m mxnet_cpsgd.run``), and the same with ``bitsgd``: every
  step's weights must follow the numpy reference (tests/reference.py) fed with
  the gradients the workers computed, past the warm-up;
* ``kv.init`` / ``kv.push`` / ``kv.pull`` with the parameter names as keys
  (cpsgd): the same weights, bit for bit, as the pushpull job above; a pull with no
  push returns the servers' weights; what the store cannot do is refused with a
  message naming the call and what to do instead.

* MXNet's nightly tests/nightly/dist_sync_kvstore.py cases that are real
  behaviour of a dist_sync store (tests/workers/nightly_cases_worker.py, written
  here from them): dense init/push/pull (float32 and float16, a key above the
  big-array bound, lowered to 1000 elements) with ``ssgd``, the 2-bit simulation with ``bitsgd``, and the
  ``gluon_type`` Trainer checks with both; pushes and pulls of the wrong shape
  or dtype name the store, the key and both shapes.

And the mxlaunch shim ends a job whose worker raises, with one line naming it.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
import pytest

from procs import MARK_VAR, kill_launched, kill_marked, marked_processes
from reference import simulate

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(TESTS_DIR, "workers", "module_worker.py")
ITERATIONS, BATCH, M = 6, 16, 2
OPTIMIZER = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.0}
CPSGD_KNOBS = {"warmup_steps": 2, "correction_period": 3}
CPSGD_ENV = {"MXNET_CPSGD_WARMUP_STEPS": "2", "MXNET_CPSGD_CORRECTION_PERIOD": "3"}
JOB_TIMEOUT_S = 240
BOUND_S = 60  # a generous bound on tearing a failed job down (shared 2-core machine)


def _spec(kvstore, mode, **extra):
    spec = {"kvstore": kvstore, "mode": mode, "iterations": ITERATIONS, "batch": BATCH,
            "seed": 3, "optimizer": dict(OPTIMIZER)}
    spec.update(extra)
    return spec


def _load(out):
    ranks, meta = [], []
    for r in range(M):
        with np.load(os.path.join(out, "rank%d.npz" % r)) as f:
            ranks.append({k: f[k] for k in f.files})
        with open(os.path.join(out, "rank%d.json" % r)) as f:
            meta.append(json.load(f))
    return ranks, meta


def _run(worker_job, spec, env=None, num_servers=1):
    out = tempfile.mkdtemp(prefix="cpsgd-module-")
    try:
        spec = dict(spec, out=out)
        job_env = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
        job_env.update(env or {})
        result = worker_job("module_worker.py", json.dumps(spec), num_workers=M,
                            num_servers=num_servers, env=job_env,
                            job_timeout=JOB_TIMEOUT_S)
        assert result.returncode == 0 and not result.failure, result.text
        assert not result.leftover, result.leftover
        return _load(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _run_mxlaunch(spec, env, mark):
    """The same worker under MXNet's tools/launch.py (local launcher, the shim)."""
    out = tempfile.mkdtemp(prefix="cpsgd-module-")
    try:
        prefix = " ".join("%s=%s" % kv for kv in sorted(dict(
            env, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_NODE_HOST="127.0.0.1",
            OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1", PS_VERBOSE="0").items()))
        # through the wrapper documented for MXNet's own example scripts
        command = "%s %s -m mxnet_cpsgd.run %s '%s'" % (prefix, sys.executable, WORKER,
                                                        json.dumps(dict(spec, out=out)))
        proc_env = dict(os.environ, **{MARK_VAR: mark})
        proc = subprocess.run([sys.executable, "-m", "mxnet_cpsgd.cluster.mxlaunch", "-n",
                               str(M), "-s", "1", "--launcher", "local", command],
                              env=proc_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_S)
        text = proc.stdout.decode(errors="replace")
        assert proc.returncode == 0, text[-4000:]
        return _load(out)
    finally:
        kill_marked(**{MARK_VAR: mark})
        shutil.rmtree(out, ignore_errors=True)


def _names(meta):
    return meta[0]["params"]


def _check_reference(ranks, meta, algorithm, knobs):
    """Every step of every worker against the numpy reference (teacher forcing)."""
    names = _names(meta)
    w0 = {n: ranks[0]["w:" + n][0] for n in names}
    for r in range(M):
        for n in names:  # every worker starts from rank 0's weights
            np.testing.assert_array_equal(ranks[r]["w:" + n][0], w0[n])
    # the Module API rescales by 1 / (B * M): the reference's batch is B * M
    traj = simulate(algorithm, w0, lambda i, t, _: {n: ranks[i]["g:" + n][t] for n in names},
                    M, ITERATIONS, BATCH * M, OPTIMIZER["learning_rate"],
                    momentum=OPTIMIZER["momentum"], wd=OPTIMIZER["wd"], knobs=knobs)
    assert "compressed" in traj.push_kind, traj.push_kind
    for t in range(1, ITERATIONS + 1):
        for r in range(M):
            for n in names:
                moved = np.abs(traj.local[t][r][n] - w0[n]).max()
                np.testing.assert_allclose(
                    ranks[r]["w:" + n][t], traj.local[t][r][n], rtol=1e-4,
                    atol=1e-6 + 1e-4 * moved,
                    err_msg="%s, worker %d, %s after step %d" % (algorithm, r, n, t))
    return traj


@pytest.fixture(scope="module")
def cpsgd_steps(mark_module):
    return _run_mxlaunch(_spec("cpsgd", "steps"), CPSGD_ENV, mark_module)


@pytest.fixture(scope="module")
def mark_module():
    value = uuid.uuid4().hex
    yield value
    kill_marked(**{MARK_VAR: value})


def test_fit_ssgd_is_dist_sync_bit_for_bit_and_resumes(worker_job):
    optimizer = dict(OPTIMIZER, wd=1e-4)  # weight decay: biases have wd_mult 0 in Module
    ours, meta = _run(worker_job, _spec("ssgd", "fit", save_at=3, optimizer=optimizer))
    mxnet, _ = _run(worker_job, _spec("dist_sync", "fit", optimizer=optimizer))
    for r in range(M):
        for n in _names(meta):
            final = ours[r]["final:" + n]
            assert not np.array_equal(final, ours[r]["initial:" + n]), n
            np.testing.assert_array_equal(final, mxnet[r]["final:" + n], err_msg=n)
            np.testing.assert_array_equal(ours[r]["resumed:" + n], final, err_msg=n)


def test_module_cpsgd_under_tools_launch_follows_reference(cpsgd_steps):
    ranks, meta = cpsgd_steps
    assert meta[0]["store"] == "CPSGD"
    traj = _check_reference(ranks, meta, "cpsgd", CPSGD_KNOBS)
    assert traj.push_kind[:2] == ["dense", "dense"]  # the warm-up


def test_module_bitsgd_follows_reference(worker_job):
    ranks, meta = _run(worker_job, _spec("bitsgd", "steps"))
    _check_reference(ranks, meta, "bitsgd", {})


def test_classic_calls_are_the_pushpull_steps(worker_job, cpsgd_steps):
    ranks, meta = _run(worker_job, _spec("cpsgd", "classic"), env=CPSGD_ENV)
    steps, _ = cpsgd_steps
    names = _names(meta)
    traj = _check_reference(ranks, meta, "cpsgd", CPSGD_KNOBS)
    for r in range(M):
        for n in names:
            # push + pull run the step pushpull runs: the same arithmetic, bit for bit
            np.testing.assert_array_equal(ranks[r]["w:" + n], steps[r]["w:" + n], err_msg=n)
            # a pull with no push before it: the servers' weights W
            np.testing.assert_allclose(ranks[r]["global:" + n], traj.server[-1][n],
                                       rtol=1e-4, atol=1e-6, err_msg=n)
    refused = meta[0]["refused"]
    expected = {
        "pull_before_init": ["cpsgd", "pull", "before init", "kv.init"],
        "push_twice": ["cpsgd", "push", "twice before a pull", "pull the key"],
        "push_before_set_optimizer": ["cpsgd", "push", "before set_optimizer",
                                      "kv.set_optimizer"],
        "row_sparse_pull": ["cpsgd", "row_sparse_pull", "dist_sync"],
        "sparse_init": ["cpsgd", "init", "row_sparse", "dense"],
        "new_key_after_start": ["cpsgd", "init", "'late'", "before the first push"],
    }
    shape, wrong = (tuple(s) for s in meta[0]["shapes"])
    key = repr(names[1])
    for call in ("push", "pull", "pushpull"):  # the store, the key, both shapes
        expected["%s_wrong_shape" % call] = ["cpsgd", "%s of key %s" % (call, key),
                                             "shape %s" % (wrong,), "shape %s" % (shape,)]
    expected["push_wrong_dtype"] = ["cpsgd", "push of key " + key, "float64", "float32"]
    for case, fragments in expected.items():
        message = refused[case]
        assert message is not None, "%s was not refused" % case
        missing = [f for f in fragments if f not in message]
        assert not missing, "%s: %r lacks %s" % (case, message, missing)


@pytest.mark.parametrize("mode", ["steps", "classic"])
def test_module_with_4_servers_balances_the_keys_and_follows_reference(worker_job, mode):
    """With 4 servers the Module API's keys (and the classic init/push/pull keys)
    get the balanced, parameter-cutting layout of a Trainer's store, and the
    weights still follow the numpy reference."""
    ranks, meta = _run(worker_job, _spec("cpsgd", mode, record_layout=True), env=CPSGD_ENV,
                       num_servers=4)
    traj = _check_reference(ranks, meta, "cpsgd", CPSGD_KNOBS)
    layout = meta[0]
    assert layout["layout"] == "KeyLayout"
    loads = layout["server_loads"]
    sizes = {i: int(np.prod(ranks[0]["w:" + n][0].shape)) for i, n in enumerate(_names(meta))}
    assert len(loads) == 4 and sum(loads) == sum(sizes.values())
    assert max(loads) <= 1.05 * sum(loads) / 4.0, loads
    # LeNet-5's first dense layer holds more than a server's share: it is cut
    largest = max(sizes, key=sizes.get)
    assert sizes[largest] > sum(sizes.values()) / 4.0
    assert len(layout["servers_of"][str(largest)]) > 1, layout["servers_of"]
    for r in range(1, M):
        assert meta[r]["servers_of"] == layout["servers_of"]  # every worker, the same keys
    if mode == "classic":
        for n in _names(meta):  # a pull with no push: the servers' weights, new keys
            np.testing.assert_allclose(ranks[0]["global:" + n], traj.server[-1][n],
                                       rtol=1e-4, atol=1e-6, err_msg=n)


def test_mxlaunch_stops_the_job_when_a_worker_raises(python, mark, tmp_path):
    log = tmp_path / "out.log"
    command = ("DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NODE_HOST=127.0.0.1 OMP_NUM_THREADS=1 "
               "PS_VERBOSE=0 %s %s ssgd 1" % (python, os.path.join(TESTS_DIR, "workers",
                                                                 "raising_worker.py")))
    env = dict(os.environ, **{MARK_VAR: mark})
    with open(log, "wb") as out:
        proc = subprocess.Popen([python, "-m", "mxnet_cpsgd.cluster.mxlaunch", "-n", "2",
                                 "-s", "1", "--launcher", "local", command], env=env,
                                stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 3 * BOUND_S
        raised = None
        while proc.poll() is None and time.monotonic() < deadline:
            if raised is None and "RAISE pid" in log.read_text():
                raised = time.monotonic()
            if raised is not None and time.monotonic() - raised > BOUND_S:
                break
            time.sleep(0.2)
        text = log.read_text()
        assert proc.poll() is not None, "the launcher still runs:\n" + text[-3000:]
        assert proc.returncode == 1, text[-3000:]
        assert "ValueError: boom at iteration 5" in text, text[-3000:]
        lines = re.findall(r"mxlaunch: .*", text)
        assert lines == ["mxlaunch: worker 1 exited with status 1; stopping the job "
                         "(3 other nodes)"], text[-3000:]
        assert "Get nonzero return code" not in text  # no tracker traceback after it
        assert not marked_processes(mark), "nodes outlived the launcher"
    finally:
        kill_launched(proc, mark)


def _nightly(worker_job, store, case):
    # MXNet's big-array bound lowered, so that keys above it stay small (and quick)
    result = worker_job("nightly_cases_worker.py", store, case, job_timeout=JOB_TIMEOUT_S,
                        env={"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"})
    assert result.returncode == 0 and not result.failure, result.text
    assert not result.leftover, result.leftover
    found = dict((int(r), json.loads(j)) for r, j in
                 re.findall(r"NIGHTLY (\d) (.*)", result.output))
    assert sorted(found) == [0, 1], result.text
    return found


@pytest.mark.parametrize("store, case", [("ssgd", "dense"), ("bitsgd", "2bit")])
def test_nightly_dist_sync_cases(worker_job, store, case):
    """MXNet's nightly dist_sync_kvstore.py cases (tests/workers/nightly_cases_worker.py)."""
    for rank, found in _nightly(worker_job, store, case).items():
        failed = {k: v for k, v in found.items()
                  if v is not None and not k.startswith("refused_")}
        assert not failed, (rank, failed)
        refusals = {k: v for k, v in found.items() if k.startswith("refused_")}
        if case == "2bit":
            assert "float32 only" in refusals["refused_float16"], refusals
            assert "row_sparse" in refusals["refused_row_sparse"], refusals
            assert "before the first push" in refusals["refused_new_key_after_push"]
            assert all(store in v for v in refusals.values()), refusals


@pytest.mark.parametrize("store", ["ssgd", "bitsgd"])
def test_nightly_gluon_type_case(worker_job, store):
    for rank, found in _nightly(worker_job, store, "gluon_type").items():
        trainer = found["trainer"]
        # as dist_sync; with False the stores refuse the first step (docs/usage.md)
        assert trainer == {"None": [True, True], "True": [True, True],
                           "False": [True, False]}, trainer
