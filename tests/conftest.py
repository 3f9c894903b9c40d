"""Shared fixtures: real ps-lite jobs on loopback, started by mxnet_cpsgd.launch.

``worker_job(script, *args, num_workers=2, ...)`` runs ``python tests/workers/<script>
args...`` on every worker of a fresh job and returns the launcher's JobResult with
four extra attributes:

    seconds   wall time of run_job
    port      the job's scheduler port (DMLC_PS_ROOT_PORT)
    leftover  processes of the job still alive right after run_job returned
              ("pid cmdline" strings); they are SIGKILLed before returning
    text      the failure line and the output's tail, for assertion messages

Every node of the job carries a unique CPSGD_TEST_JOB tag in its environment, so
the leftover check (and cleanup) finds exactly this job's processes, on success,
failure or exception alike.
"""
import os
import re
import sys
import time
import uuid

import pytest

import tiers
# a test that failed because a Horovod job crashed inside MXNet/Horovod runs once more
from horovod_rerun import pytest_runtest_protocol  # noqa: F401
from mxnet_cpsgd.launch import run_job
from procs import described, kill_all, marked_processes, processes_with_env

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
WORKERS_DIR = os.path.join(TESTS_DIR, "workers")
#: one thread per node keeps jobs small on a shared 2-core machine
JOB_ENV = {"OMP_NUM_THREADS": "1"}
TAG_VAR = "CPSGD_TEST_JOB"
#: every process the suite starts skips MXNet's optional imports (see its docstring)
LEAN_SITE = os.path.join(TESTS_DIR, "lean_site")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (LEAN_SITE, os.environ.get("PYTHONPATH")) if p)


def pytest_collection_modifyitems(config, items):
    """Mark the fast tier and the host lane listed in tests/tiers.py."""
    for item in items:
        module = os.path.basename(str(item.fspath))
        function = getattr(item, "originalname", None) or item.name.partition("[")[0]
        if tiers.is_fast(module, item.name, function):
            item.add_marker(pytest.mark.fast)
        if module in tiers.HOST_LANE or module in tiers.HOST_LANE_GUESTS:
            item.add_marker(pytest.mark.hosts)


def job_processes(tag=None, port=None):
    """pids of live processes whose environment has CPSGD_TEST_JOB=tag or
    DMLC_PS_ROOT_PORT=port (zombies excluded)."""
    return processes_with_env(**{TAG_VAR: tag, "DMLC_PS_ROOT_PORT": port})


def _run(script, *args, num_workers=2, num_servers=1, env=None, timeout=20,
         job_timeout=120):
    tag = uuid.uuid4().hex
    node_env = dict(JOB_ENV)
    node_env.update(env or {})
    node_env[TAG_VAR] = tag
    command = [sys.executable, os.path.join(WORKERS_DIR, script)] + [str(a) for a in args]
    started = time.monotonic()
    result = None
    try:
        result = run_job(command, num_workers, num_servers, env=node_env, timeout=timeout,
                         job_timeout=job_timeout, stream=None)
        result.seconds = time.monotonic() - started
        match = re.search(r"scheduler port (\d+)", result.output)
        result.port = int(match.group(1)) if match else None
        left = job_processes(tag, result.port)
        result.leftover = [described(pid) for pid in left]
        result.text = "job failure: %s\n--- output tail ---\n%s" % (
            result.failure, result.output[-4000:])
        return result
    finally:
        kill_all(job_processes(tag, getattr(result, "port", None)))


@pytest.fixture(scope="session")
def python():
    """The Python that runs the tests (and every node of a job)."""
    return sys.executable


@pytest.fixture(scope="session")
def worker_job():
    """Run a script of tests/workers/ in a fresh job: see the module docstring."""
    return _run


@pytest.fixture
def mark():
    """A unique value for procs.MARK_VAR; afterwards every marked process is SIGKILLed."""
    value = uuid.uuid4().hex
    yield value
    kill_all(marked_processes(value))
