"""Real models must not crash or hang (issue 11), in real 2-worker jobs.

* Parameters of 1e6+ elements with an evaluation forward between steps, a
  frozen parameter, a parameter frozen half-way and save/load in between, for
  every parameter-server store with 1 and 2 servers (tests/workers/real_model_worker.py).
* A worker that raises ends the job under cpsgd-launch with a message naming
  the worker and the exception, for the project's stores and for MXNet's own
  dist_sync in a script that never imports mxnet_cpsgd; under MXNet's
  tools/launch.py the raising worker itself exits with its traceback.
* String keys get readable errors; a second Trainer may reuse a store (the
  weights checked against numpy); a misspelt store name raises.
"""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from procs import MARK_VAR, kill_launched, marked_processes, pid_alive

STORES = ["ssgd", "bitsgd", "asgd", "odsgd", "cpsgd", "ssdsgd", "localsgd"]
#: every worker ends with the same weights in these stores
SYNCHRONOUS = ("ssgd", "bitsgd")
BOUND_S = 60
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("num_servers", [1, 2])
@pytest.mark.parametrize("store", STORES)
def test_big_parameters_with_evaluation(worker_job, tmp_path, store, num_servers):
    result = worker_job("real_model_worker.py", store, str(tmp_path),
                        num_servers=num_servers, job_timeout=240)
    assert result.returncode == 0, result.text
    assert result.output.count("] done") == 2, result.text
    assert not result.leftover, result.leftover
    sums = dict(re.findall(r"CHECKSUM (\d) (\S+)", result.output))
    assert sorted(sums) == ["0", "1"], result.text
    assert all(np.isfinite(float(v)) for v in sums.values()), sums
    if store in SYNCHRONOUS:
        assert sums["0"] == sums["1"], sums


@pytest.mark.parametrize("store", ["ssgd", "cpsgd", "dist_sync"])
def test_raising_worker_ends_the_job(worker_job, store):
    result = worker_job("raising_worker.py", store, job_timeout=2 * BOUND_S, timeout=20)
    ended = time.time()
    match = re.search(r"RAISE pid \d+ at (\d+\.\d+)", result.output)
    assert match, result.text
    assert result.returncode != 0, result.text
    assert result.failure and "worker 0" in result.failure, result.text
    assert "ValueError: boom at iteration 5" in result.failure, result.text
    assert "job timeout" not in result.failure, result.text
    assert ended - float(match.group(1)) < BOUND_S, result.text
    assert not result.leftover, result.leftover


SHIM = ("import runpy, sys, threading\n"
        "threading.Thread.isAlive = threading.Thread.is_alive\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')")


def test_tools_launch_raising_worker_exits(python, mark, tmp_path):
    """MXNet's own launcher does not stop the job; the raising worker must exit."""
    import mxnet
    launcher = os.path.join(os.path.dirname(mxnet.__file__), "tools", "launch.py")
    log = tmp_path / "out.log"
    command = ("DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NODE_HOST=127.0.0.1 OMP_NUM_THREADS=1 "
               "PS_VERBOSE=0 %s %s ssgd 0" % (python, os.path.join(TESTS_DIR, "workers",
                                                                 "raising_worker.py")))
    env = dict(os.environ, **{MARK_VAR: mark})
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(TESTS_DIR),
                                                    env.get("PYTHONPATH")] if p)
    with open(log, "wb") as out:
        proc = subprocess.Popen([python, "-c", SHIM, launcher, "-n", "2", "-s", "1",
                                 "--launcher", "local", command], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 2 * BOUND_S
        pid = None
        while pid is None and time.monotonic() < deadline:
            match = re.search(r"RAISE pid (\d+) at (\d+\.\d+)", log.read_text())
            if match:
                pid, raised = int(match.group(1)), float(match.group(2))
            else:
                time.sleep(0.2)
        assert pid is not None, log.read_text()[-3000:]
        while pid_alive(pid) and time.time() - raised < BOUND_S:
            time.sleep(0.2)
        text = log.read_text()
        assert not pid_alive(pid), "the raising worker still runs:\n" + text[-3000:]
        assert "ValueError: boom at iteration 5" in text, text[-3000:]
    finally:
        kill_launched(proc, mark)
    assert not marked_processes(mark)


@pytest.fixture(scope="module")
def api_result(worker_job):
    result = worker_job("api_worker.py", job_timeout=120)
    assert result.returncode == 0, result.text
    found = [json.loads(line) for line in re.findall(r"RESULT (.*)", result.output)]
    assert len(found) == 2, result.text
    assert not result.leftover, result.leftover
    return found


def test_misspelt_store_name_raises(api_result):
    for rank in api_result:
        assert rank["misspelt"].startswith("ValueError: unknown kvstore 'topk_typo'")
        assert "cpsgd" in rank["misspelt"] and "dist_sync" in rank["misspelt"]


def test_string_key_errors(api_result):
    for rank in api_result:
        assert rank["str_broadcast"].startswith("ValueError"), rank["str_broadcast"]
        assert "'w'" in rank["str_broadcast"]
        assert rank["str_pushpull"].startswith("RuntimeError"), rank["str_pushpull"]
        assert "'w'" in rank["str_pushpull"]


def test_store_reused_by_second_trainer(api_result):
    # independent numpy computation of what the servers apply (rescale 1/B, B = 1)
    grad_sum = sum((r + 1) * np.array([1, 2, 3, 4], dtype=np.float64) for r in range(2))
    p = np.full(4, 0.5)
    for _ in range(3):
        p -= 0.1 * grad_sum
    q, mom = p.copy(), np.zeros(4)   # the second Trainer starts from the servers' weights
    for _ in range(3):
        mom = 0.9 * mom - 0.05 * grad_sum
        q += mom
    for rank in api_result:
        np.testing.assert_allclose(rank["p_final"], p, rtol=1e-5)
        np.testing.assert_allclose(rank["q_start"], p, rtol=1e-5)
        np.testing.assert_allclose(rank["q_final"], q, rtol=1e-5)
        assert "same shapes" in rank["reuse_shape"] and "(5,)" in rank["reuse_shape"]
        assert "warmup_steps" in rank["reuse_settings"]
