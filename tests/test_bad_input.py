"""Bad input must fail fast with an error that names the setting and what is allowed.

Most cases need no job: tests/workers/bad_input_probe.py runs them one after the
other in a subprocess whose DMLC_* variables point at a port where no scheduler
listens.  A store that tried to join the job would block there, so every case has
to raise before any connection is attempted; the subprocess runs under a timeout
and a case that does not report an outcome in time counts as blocked.

float16 parameters with cpsgd are only detected when the store sees the
arrays (broadcast), which comes after it joined the job: that case runs in a real
job (tests/workers/bad_input_worker.py) and must end the job quickly with the
message.
"""
import json
import os
import signal
import subprocess
import time

import pytest

from mxnet_cpsgd import launch
from mxnet_cpsgd.cluster.nodes import free_port
from mxnet_cpsgd.stores import config
from mxnet_cpsgd.stores.policies import POLICIES

WORKERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
PROBE_TIMEOUT_S = 90  # all cases together; a blocked case never returns

CONFIG_ERROR = "ConfigError"
CASES = {
    # case name: (exception type name, substrings the message must contain)
    "unknown_key": (CONFIG_ERROR, ["bogus_knob", "cpsgd", "correction_period", "threshold",
                                   "warmup_steps"]),
    "correction_period_0": (CONFIG_ERROR, ["correction_period", "integer >= 1", "got 0"]),
    "correction_period_negative": (CONFIG_ERROR, ["correction_period", "integer >= 1",
                                                  "got -1"]),
    "correction_period_fraction": (CONFIG_ERROR, ["correction_period", "integer >= 1",
                                                  "got 2.5"]),
    "correction_period_text": (CONFIG_ERROR, ["correction_period", "integer >= 1", "'x'"]),
    "threshold_0": (CONFIG_ERROR, ["threshold", "> 0"]),
    "threshold_negative": (CONFIG_ERROR, ["threshold", "> 0", "-0.5"]),
    "warmup_steps_negative": (CONFIG_ERROR, ["warmup_steps", ">= 0", "-1"]),
    "compression_type_not_2bit": (CONFIG_ERROR, ["type", "'2bit'", "1bit"]),
    "knob_not_used_by_algorithm": (CONFIG_ERROR, ["threshold", "not used", "odsgd",
                                                  "warmup_steps"]),
    "create_with_bad_config": (CONFIG_ERROR, ["correction_period", "integer >= 1"]),
    "env_correction_period_0": (CONFIG_ERROR, ["MXNET_CPSGD_CORRECTION_PERIOD",
                                               "integer >= 1"]),
    "env_unknown_variable": (CONFIG_ERROR, ["MXNET_CPSGD_TYPO", "MXNET_CPSGD_THRESHOLD",
                                            "MXNET_CPSGD_CORRECTION_PERIOD"]),
    "update_on_kvstore_false": (None, ["cpsgd", "update_on_kvstore=True"]),
    "update_on_kvstore_env_0": (None, ["cpsgd", "MXNET_UPDATE_ON_KVSTORE"]),
    # raised by gluon.Trainer itself; names the store class and sparse gradients
    "sparse_gradients": (None, ["cpsgd", "sparse gradients"]),
    "no_job": ("RuntimeError", ["cpsgd", "python -m mxnet_cpsgd.launch", "DMLC_ROLE"]),
    "unsupported_build_check": ("UnsupportedBuildError", ["1.9.0", "need 1.9.1"]),
    "unsupported_build_switch": ("UnsupportedBuildError", ["1.9.0", "need 1.9.1"]),
}


@pytest.fixture(scope="module")
def probe(python):
    """Run every case in one subprocess; returns (outcomes, stderr, seconds, timed_out)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", config.ENV_PREFIX))}
    env.update(DMLC_ROLE="worker", DMLC_PS_ROOT_URI="127.0.0.1",
               DMLC_PS_ROOT_PORT=str(free_port()), DMLC_NUM_SERVER="1",
               DMLC_NUM_WORKER="2", DMLC_NODE_HOST="127.0.0.1", OMP_NUM_THREADS="1",
               PS_VERBOSE="0")
    started = time.monotonic()
    proc = subprocess.Popen([python, os.path.join(WORKERS_DIR, "bad_input_probe.py")]
                            + list(CASES), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    outcomes = {}
    for line in out.decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "raised" in record:
            outcomes[record["case"]] = record
    return outcomes, err.decode(errors="replace")[-3000:], time.monotonic() - started, timed_out


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_fast_and_clearly(probe, case):
    outcomes, stderr, seconds, timed_out = probe
    if case not in outcomes:
        blocked = [c for c in CASES if c not in outcomes][0]
        pytest.fail("case %s got no outcome: %s (probe %s after %.0f s)\n%s"
                    % (case, "it blocked instead of raising" if case == blocked else
                       "case %s blocked before it" % blocked,
                       "timed out" if timed_out else "ended", seconds, stderr))
    outcome = outcomes[case]
    expected_type, fragments = CASES[case]
    assert outcome["raised"] is not None, "case %s raised nothing" % case
    if expected_type is not None:
        assert outcome["raised"] == expected_type, outcome
    if outcome["raised"] == CONFIG_ERROR:
        assert issubclass(config.ConfigError, ValueError)
    missing = [f for f in fragments if f.lower() not in outcome["message"].lower()]
    assert not missing, "message of %s lacks %s: %r" % (case, missing, outcome["message"])


def test_float16_parameters_with_cpsgd_fail_the_job_clearly(worker_job):
    """Compression needs float32 (MXNet's 2-bit quantizer); the dtype is only seen
    at broadcast, after the store joined the job, so the job must end with the
    message (not hang) and leave nothing behind."""
    result = worker_job("bad_input_worker.py", "float16", job_timeout=60)
    assert result.returncode != 0, result.text
    assert result.seconds < 60, result.text
    assert "compresses gradients" in result.output and "float32 only" in result.output \
        and "float16" in result.output, result.text
    assert "job timeout" not in (result.failure or ""), result.text
    assert not result.leftover, result.leftover


def test_launcher_worker_index_is_not_taken_for_a_knob():
    """Regression: mxnet_cpsgd.launch sets MXNET_CPSGD_WORKER_INDEX on every worker;
    the strict check of MXNET_CPSGD_* variables once rejected it, failing every
    store created in a job started by the project's own launcher."""
    environ = {launch.WORKER_INDEX_ENV: "0"}
    for name, policy in POLICIES.items():
        config.resolve(name, policy.defaults, {}, environ)


@pytest.mark.parametrize("knobs,words", [
    ({"local_optimizer": "nosuch"}, ["local_optimizer", "not an MXNet optimizer", "dcasgd"]),
    ({"local_optimizer": 3}, ["local_optimizer", "name of an MXNet optimizer"]),
    ({"local_wd": -1e-4}, ["local_wd", ">= 0"]),
    ({"local_momentum": 1.0}, ["local_momentum", "[0, 1)"]),
])
def test_local_optimizer_knobs_are_checked(knobs, words):
    with pytest.raises(config.ConfigError) as err:
        config.resolve("odsgd", POLICIES["odsgd"].defaults, knobs, {})
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_local_optimizer_knob_defaults_follow_the_authors():
    """cpsgd: stock 'sgd', wd 0 (CD-SGD), momentum unset (the Trainer's, not the
    authors' 0); odsgd/ssdsgd: momentum 0 and the Trainer's wd (None); warm-ups
    1000 / 200 / 499; localsgd keeps the Trainer's."""
    resolved = {name: config.resolve(name, POLICIES[name].defaults, {}, {})
                for name in ("cpsgd", "odsgd", "ssdsgd", "localsgd")}
    assert (resolved["cpsgd"].local_optimizer, resolved["cpsgd"].local_momentum,
            resolved["cpsgd"].local_wd, resolved["cpsgd"].warmup_steps) == ("sgd", None, 0.0, 1000)
    assert (resolved["odsgd"].local_momentum, resolved["odsgd"].local_wd,
            resolved["odsgd"].warmup_steps) == (0.0, None, 200)
    assert (resolved["ssdsgd"].local_momentum, resolved["ssdsgd"].warmup_steps) == (0.0, 499)
    assert resolved["localsgd"].local_momentum is None
    with pytest.raises(config.ConfigError):
        config.resolve("localsgd", POLICIES["localsgd"].defaults, {"local_optimizer": "sgd"}, {})


def test_local_momentum_for_an_optimizer_without_one_is_rejected():
    import mxnet as mx
    from mxnet_cpsgd.stores.local_optimizer import LocalOptimizer
    opt = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)
    assert LocalOptimizer(opt, 2, name="adam", momentum=0.0).optimizer.__class__.__name__ \
        == "Adam"
    with pytest.raises(config.ConfigError, match="no momentum"):
        LocalOptimizer(opt, 2, name="adam", momentum=0.5)
