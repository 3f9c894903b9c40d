"""A node that dies mid-training ends the whole job, quickly and without leftovers.

ps-lite itself never notices a dead peer: the survivors wait forever for the
round the dead node will not complete.  mxnet_cpsgd.launch watches every node
and stops the job when one exits abnormally.  These tests kill a worker, a
server and the scheduler of a real 2-worker cpsgd job
(tests/workers/failing_worker.py) after 3 iterations and check that the job fails with a message naming the dead node,
within 60 s in all (start included), and that no process of the job (found by
the job's tag and its DMLC_PS_ROOT_PORT in /proc/*/environ) is left.
"""
import re

import pytest

BOUND_S = 60


def _killed_at(result):
    match = re.search(r"KILL (.+?) at (\d+\.\d+)", result.output)
    assert match, "the worker did not get to the kill:\n" + result.text
    return match.group(1), float(match.group(2))


@pytest.mark.parametrize("mode,node", [
    ("kill-worker", "worker 1"),
    ("kill-server", "server 0"),
    ("kill-scheduler", "scheduler"),
])
def test_dead_node_fails_the_job(worker_job, mode, node):
    result = worker_job("failing_worker.py", mode, job_timeout=2 * BOUND_S, timeout=20)
    _killed_at(result)
    assert result.returncode != 0, result.text
    assert result.failure and node in result.failure and "SIGKILL" in result.failure, \
        result.text
    assert "job timeout" not in result.failure, result.text
    assert result.seconds < BOUND_S, "job took %.1f s\n%s" % (result.seconds, result.text)
    assert not result.leftover, "processes left behind: %s" % result.leftover
