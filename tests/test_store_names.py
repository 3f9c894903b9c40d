"""Store names: a misspelt one is refused everywhere; MXNet's scripts get dist names.

* every way of naming a store (``mx.kv.create``, ``mx.kvstore.create``,
  ``gluon.Trainer``, ``Module``, the ``_create_kvstore`` that ``FeedForward``
  holds) refuses a near-miss of a project store's name and an unknown ``dist``
  name with one line naming it and the known names, and still creates MXNet's
  own local and device stores;
* in a job, a misspelt name given to MXNet's scripts (``python -m
  mxnet_cpsgd.run``) ends the job with nothing left, under cpsgd-launch, the
  mxlaunch shim (non-zero) and MXNet's tools/launch.py itself;
* ``dist_cpsgd`` and ``dist_sync_cpsgd`` are the cpsgd store, so that
  example/image-classification's fit.py shards each epoch as for ``dist_sync``
  (tests/workers/fit_logic_worker.py, written here from fit.py's behaviour):
  the same batches per epoch and the same learning-rate schedule as dist_sync.
"""
import json
import os
import re
import subprocess

import mxnet as mx
import pytest
from mxnet import gluon

import mxnet_cpsgd
from mxnet_cpsgd.stores.registry import STORES
from kvstore_ext import trainer_hook
from procs import MARK_VAR, described, kill_launched, marked_left_after

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
WORKERS_DIR = os.path.join(TESTS_DIR, "workers")
MISSPELT = ["cpsgdd", "CPSGD_", "cp_sgd", "bitsdg", "local_cpsgd", "dist_cpsgdd",
            "dist_sync_cpsdg", "dist_asgd", "dist_typo", "topkk"]
BOUND_S = 60  # the job must be over this long after it started (shared 2-core machine)
#: nodes of MXNet's tools/launch.py may still be leaving this long after it returned
UNWATCHED_EXIT_S = 15
JOB_ENV = "DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NODE_HOST=127.0.0.1 OMP_NUM_THREADS=1 PS_VERBOSE=0"


def _tiny_module():
    data = mx.sym.Variable("data")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fc"),
                               name="softmax")
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.bind(data_shapes=[("data", (4, 3))], label_shapes=[("softmax_label", (4,))])
    mod.init_params()
    return mod


def _entry_points():
    """name -> a call that creates a store from a string the way each API does."""
    def trainer(name):
        p = gluon.Parameter("w", shape=(2,))
        p.initialize()
        gluon.Trainer([p], "sgd", kvstore=name)._init_kvstore()

    return {
        "mx.kv.create": mx.kv.create,
        "mx.kvstore.create": mx.kvstore.create,
        "gluon.Trainer": trainer,
        "Module": lambda name: _tiny_module().init_optimizer(kvstore=name),
        "FeedForward": lambda name: mx.model._create_kvstore(name, 1, {}),
    }


@pytest.mark.parametrize("name", MISSPELT)
def test_misspelt_names_are_refused_by_every_entry_point(name):
    for api, create in _entry_points().items():
        with pytest.raises(ValueError) as err:
            create(name)
        message = str(err.value)
        assert "\n" not in message, (api, message)
        assert message.startswith("unknown kvstore %r" % name), (api, message)
        known = message.split("known: ")[1].split(", ")
        for expected in ("cpsgd", "dist_cpsgd", "dist_sync_cpsgd", "ssgd", "dist_sync",
                         "local", "device"):
            assert expected in known, (api, expected, message)


def test_near_misses_name_the_store_meant():
    meant = {"cpsgdd": "cpsgd", "cp_sgd": "cpsgd", "bitsdg": "bitsgd",
             "dist_cpsgdd": "dist_cpsgd", "dist_asgd": "asgd", "local_cpsgd": "cpsgd"}
    for name, store in meant.items():
        assert "(a misspelling of %r?)" % store in trainer_hook.refusal(name), name
    assert "misspelling" not in trainer_hook.refusal("dist_typo")


def test_mxnet_and_project_names_still_create_their_stores():
    for name in ("local", "device", "local_allreduce_cpu", "local_update_cpu", "LOCAL"):
        assert mx.kv.create(name).type == name.lower()
    for name in ("nccl", "dist_sync", "dist_async", "dist_sync_device", "dist_device_sync",
                 "dist", "horovod", "topk", "cpsgd_topk"):
        assert trainer_hook.refusal(name) is None, name  # a job or a GPU build needed
    for name, cls in STORES.items():
        sync = cls.policy_class.inner_kvstore == "dist_sync"
        aliases = ["dist_sync_" + name, "dist_" + name] if sync else ["dist_async_" + name]
        for alias in aliases:
            store = mx.kv.create(alias)
            assert type(store) is cls, alias
            assert store.type == "%s_%s" % (cls.policy_class.inner_kvstore, name)
            # what fit.py tests to shard an epoch as MXNet does for dist_sync/dist_async
            assert ("dist" in alias and "async" not in alias) == sync, alias
        assert type(mxnet_cpsgd.create(aliases[0])) is cls
    assert "dist_cpsgd" not in mxnet_cpsgd.ALGORITHMS


def _launch_commands(python, script, name):
    run = "%s -m mxnet_cpsgd.run %s %s" % (python, script, name)
    tools_launch = os.path.join(os.path.dirname(mx.__file__), "tools", "launch.py")
    alias = ("import runpy, sys, threading; threading.Thread.isAlive = "
             "threading.Thread.is_alive; sys.argv = sys.argv[1:]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")
    return {
        "cpsgd-launch": [python, "-m", "mxnet_cpsgd.launch", "-n", "2", "-s", "1", "--",
                         python, "-m", "mxnet_cpsgd.run", script, name],
        "mxlaunch": [python, "-m", "mxnet_cpsgd.cluster.mxlaunch", "-n", "2", "-s", "1",
                     "--launcher", "local", "%s %s" % (JOB_ENV, run)],
        # MXNet's own launcher, with only the alias Python 3.9+ needs
        "tools/launch.py": [python, "-c", alias, tools_launch, "-n", "2", "-s", "1",
                            "--launcher", "local", "%s %s" % (JOB_ENV, run)],
    }


@pytest.mark.parametrize("launcher", ["cpsgd-launch", "mxlaunch", "tools/launch.py"])
def test_misspelt_name_ends_the_job_under_every_launcher(python, mark, tmp_path, launcher):
    script = os.path.join(WORKERS_DIR, "named_store_worker.py")
    command = _launch_commands(python, script, "cpsgdd")[launcher]
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=dict(os.environ, **{MARK_VAR: mark}),
                                stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        try:
            proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            pass
        text = log.read_text(errors="replace")
        assert proc.poll() is not None, "the launcher still runs:\n" + text[-3000:]
        # MXNet's tracker returns when its scheduler ends, without waiting for the
        # threads that run the servers: a server may still be leaving ps-lite (seen
        # once, under load); the other launchers wait for their nodes
        left = [described(pid) for pid in marked_left_after(
            mark, UNWATCHED_EXIT_S if launcher == "tools/launch.py" else 0)]
        assert not left, "nodes outlived the job: %s\n%s" % (left, text[-3000:])
        refusal = ("unknown kvstore 'cpsgdd' (a misspelling of 'cpsgd'?); known: ")
        if launcher == "cpsgd-launch":
            # the workers' own lines, relayed whole (the closing line quotes the error too)
            refusals = re.findall(r"^\[worker \d+[^\]]*\] ValueError: " + re.escape(refusal),
                                  text, re.M)
        else:
            # the workers share the launcher's stderr, and their tracebacks are written a
            # piece at a time, so two may interleave ("ValueErrorValueError: : unknown ...");
            # the message itself is one write
            refusals = re.findall(re.escape(refusal), text)
        # every worker refuses; a watching launcher may stop the second one first
        if launcher == "tools/launch.py":
            assert len(refusals) == 2, text[-3000:]
        else:
            assert len(refusals) in (1, 2), text[-3000:]
        assert "STORE" not in text, text[-3000:]  # no worker trained alone
        if launcher != "tools/launch.py":  # which exits 0 whatever its nodes did
            assert proc.returncode != 0, text[-3000:]
    finally:
        kill_launched(proc, mark)


def _fit_logic(worker_job, name):
    result = worker_job("fit_logic_worker.py", name, job_timeout=180)
    assert result.returncode == 0 and not result.failure, result.text
    assert not result.leftover, result.leftover
    found = [json.loads(line) for line in re.findall(r"FIT (.*)", result.output)]
    assert sorted(f["rank"] for f in found) == [0, 1], result.text
    return found


def test_fit_py_logic_with_dist_names_is_dist_syncs(worker_job):
    mxnet = _fit_logic(worker_job, "dist_sync")
    assert mxnet[0]["batches"] == [8, 8]  # 256 examples, 2 workers, batches of 16
    for name in ("dist_cpsgd", "dist_sync_bitsgd"):
        ours = _fit_logic(worker_job, name)
        for rank in (0, 1):
            assert ours[rank]["batches"] == mxnet[rank]["batches"], name
            assert ours[rank]["lr"] == mxnet[rank]["lr"], name
    # the rate drops at the start of epoch 1, as the schedule's step says
    assert [lr for epoch, lr in mxnet[0]["lr"] if epoch == 0] == [0.1] * 8
    assert all(abs(lr - 0.01) < 1e-12 for epoch, lr in mxnet[0]["lr"] if epoch == 1)
    # the short name is not sharded: every batch of the data each epoch, twice the
    # steps, and the rate drops half-way through epoch 0
    short = _fit_logic(worker_job, "cpsgd")
    assert short[0]["batches"] == [16, 16]
    assert [lr for _, lr in short[0]["lr"][:16]] == pytest.approx([0.1] * 8 + [0.01] * 8)
