"""The servers' optimizer under MXNet's dist_async server (kvstore 'asgd').

MXNet 1.9.1's dist_async server hands the received message itself to the updater
and frees it once the key's stored array is ready.  A load (trainer.load_states)
once left an engine copy of the pushed weights behind that, on a busy machine,
ran after the message was freed: the garbage became the servers' weights and
every worker of an asgd job ended with NaN weights.  The probe
(tests/workers/async_load_probe.py) replays the server's calls with the single
engine worker busy, so that a left-behind copy runs late, overwrites the
message's memory as ps-lite may, and reports the weights after the next update;
they must be the loaded weights moved by one plain SGD step (numpy).
"""
import json
import os
import subprocess
import sys

import numpy as np

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                     "async_load_probe.py")


def test_load_push_is_read_before_the_server_frees_it():
    env = dict(os.environ, MXNET_CPU_WORKER_NTHREADS="1", OMP_NUM_THREADS="1",
               MXNET_ENGINE_TYPE="ThreadedEnginePerDevice")
    proc = subprocess.run([sys.executable, PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    weights = np.array(result["weights"])
    assert not np.isnan(weights).any(), "NaN weights: the copy read the freed message"
    # plain SGD (no momentum, wd 0, rescale 1) from the loaded weights
    expected = np.array(result["loaded"]) - result["lr"] * np.array(result["grad"])
    np.testing.assert_allclose(weights, expected, rtol=1e-6, atol=1e-7)
