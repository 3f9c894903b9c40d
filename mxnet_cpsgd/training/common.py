"""Shared command line, training loop, checkpoints and logs of the training scripts.

``scripts/train_mnist.py``, ``scripts/train_cifar.py`` and
``scripts/train_imagenet.py`` are thin wrappers: each builds a parser with
:func:`build_parser` (its own defaults), and calls :func:`main`.

Timing (see docs/training.md):

- ``epoch_time`` (Te): wall time of one epoch's training iterations on this worker
  (validation excluded).
- ``comm_time`` (Tc): per iteration, the time from the moment all gradients are
  computed (every gradient array waited for) to the moment the weights for the next
  forward are ready (every weight array waited for after ``trainer.step``), summed
  over the epoch: the communication/update time the worker is exposed to.
"""
import argparse
import copy
import csv
import json
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

from . import data as data_mod
from . import models as models_mod

# this project's stores (registered by ``import mxnet_cpsgd``)
PROJECT_STORES = ("ssgd", "bitsgd", "asgd", "odsgd", "cpsgd", "ssdsgd", "localsgd", "horovod")
# MXNet's own distributed stores, for comparison
RAW_DIST_STORES = ("dist_sync", "dist_device_sync", "dist_async")
ALGORITHMS = PROJECT_STORES + ("local",) + RAW_DIST_STORES

# knob -> (command-line flag, type)
KNOB_FLAGS = {
    "threshold": ("--threshold", float),
    "correction_period": ("--correction-period", int),
    "warmup_steps": ("--warmup-steps", int),
    "sync_period": ("--sync-period", int),
    "local_lr": ("--local-lr", float),
    "local_momentum": ("--local-momentum", float),
    "glu_weight": ("--glu-weight", float),
}

LOG_FIELDS = ("algorithm", "epoch", "rank", "num_workers", "train_acc", "train_loss",
              "val_acc", "val_loss", "epoch_time", "comm_time", "samples_per_sec",
              "iterations", "total_iterations", "global_samples_per_sec", "lr",
              "dataset", "model", "batch_size")

CHECKPOINT_JSON = "checkpoint.json"
CHECKPOINT_PARAMS = "model.params"

logger = logging.getLogger("mxnet_cpsgd.train")


class UsageError(ValueError):
    """A bad combination of command-line settings."""


# ----------------------------------------------------------------------------
# command line

def build_parser(description: str, defaults: Optional[Dict[str, object]] = None,
                 datasets: Optional[Sequence[str]] = None,
                 models: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The common GluonCV-style parser.

    Args:
        description: the script's description.
        defaults: per-script defaults by ``dest`` (e.g. ``{'batch_size': 64}``);
            the special key ``knob_defaults`` (a dict) holds knob values the script
            applies when the chosen algorithm accepts them and the user did not
            set them (see :func:`compression_params`).
        datasets: choices of ``--dataset`` (omitted: no such flag).
        models: choices of ``--model`` (omitted: no such flag).
    """
    defaults = dict(defaults or {})
    knob_defaults = defaults.pop("knob_defaults", {})
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("algorithm")
    g.add_argument("--algorithm", default="local", choices=ALGORITHMS,
                   help="training algorithm: one of this project's stores, 'local' "
                        "(one process, no kvstore) or MXNet's own dist_* stores")
    for knob, (flag, typ) in KNOB_FLAGS.items():
        script_default = knob_defaults.get(knob)
        extra = ("; this script uses %r when the algorithm accepts it" % script_default
                 if script_default is not None else "")
        g.add_argument(flag, dest=knob, type=typ, default=None,
                       help="algorithm knob %s (default: not passed, the algorithm's "
                            "own default%s)" % (knob, extra))
    p.set_defaults(knob_defaults=knob_defaults)

    g = p.add_argument_group("data and model")
    if datasets:
        g.add_argument("--dataset", default=datasets[0], choices=datasets, help="data set")
    if models:
        g.add_argument("--model", default=models[0], choices=models, help="network")
    g.add_argument("--data-dir", default=None, help="directory of the data set's files")
    g.add_argument("--synthetic", action="store_true",
                   help="random tensors of the data set's shape instead of files")
    g.add_argument("--synthetic-batches", type=int, default=20,
                   help="training batches per epoch with --synthetic")
    g.add_argument("--val-split", default="shard", choices=("shard", "full"),
                   help="validate each worker on its own part of the validation set "
                        "or on all of it")
    g.add_argument("-j", "--num-data-workers", type=int, default=4,
                   help="decoding threads (ImageNet RecordIO)")

    g = p.add_argument_group("optimization")
    g.add_argument("--num-epochs", type=int, default=10, help="training epochs")
    g.add_argument("--batch-size", type=int, default=64,
                   help="samples per iteration on each worker (split across its GPUs)")
    g.add_argument("--lr", type=float, default=0.1, help="learning rate")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--wd", type=float, default=1e-4, help="weight decay")
    g.add_argument("--lr-mode", default="step", choices=("step", "cosine"),
                   help="learning-rate schedule")
    g.add_argument("--lr-decay", type=float, default=0.1,
                   help="step mode: factor applied at each --lr-decay-epoch")
    g.add_argument("--lr-decay-epoch", default="",
                   help="step mode: comma-separated epochs at which the lr decays "
                        "(empty: constant lr)")
    g.add_argument("--seed", type=int, default=42, help="random seed (same on all workers)")
    g.add_argument("--gpus", default="", help="GPU ids, e.g. '0,1'; empty = CPU")
    g.add_argument("--max-iters", type=int, default=None,
                   help="stop after this many iterations in total (counting those "
                        "before a --resume)")
    g.add_argument("--no-hybridize", dest="hybridize", action="store_false",
                   help="run the network imperatively")
    g.add_argument("--no-comm-timing", dest="comm_timing", action="store_false",
                   help="do not wait for gradients and weights each iteration (lets "
                        "backward overlap with pushes; comm_time is then not measured)")

    g = p.add_argument_group("checkpoints and logs")
    g.add_argument("--checkpoint-dir", default=None,
                   help="save a checkpoint here after every epoch and at --max-iters")
    g.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir")
    g.add_argument("--log-json", default=None,
                   help="append one JSON line per epoch (rank r > 0 writes PATH with "
                        ".rank<r> before the extension)")
    g.add_argument("--log-csv", default=None, help="one CSV row per epoch (same naming)")
    g.add_argument("--log-interval", type=int, default=0,
                   help="log every N batches (0: only per epoch)")
    g.add_argument("--quiet", action="store_true", help="only warnings and errors")
    p.set_defaults(**{k: v for k, v in defaults.items()})
    return p


def accepted_knobs(algorithm: str) -> Tuple[str, ...]:
    """Knobs the algorithm's store accepts (none for local/raw MXNet stores)."""
    if algorithm not in PROJECT_STORES:
        return ()
    from ..stores.policies import POLICIES
    policy = POLICIES.get(algorithm)
    return tuple(sorted(policy.defaults)) if policy is not None else ()


def compression_params(args: argparse.Namespace) -> Dict[str, object]:
    """The ``compression_params`` for the Trainer: the knobs the user set, plus the
    script's knob defaults that the algorithm accepts.

    Raises:
        UsageError: a knob set on the command line that the algorithm does not use.
    """
    accepted = accepted_knobs(args.algorithm)
    user = {k: getattr(args, k) for k in KNOB_FLAGS if getattr(args, k, None) is not None}
    rejected = sorted(k for k in user if k not in accepted)
    if rejected:
        flags = ", ".join(KNOB_FLAGS[k][0] for k in rejected)
        ok = ", ".join(KNOB_FLAGS[k][0] for k in accepted if k in KNOB_FLAGS)
        raise UsageError("%s not used by --algorithm %s (it accepts: %s)"
                         % (flags, args.algorithm, ok or "no knobs"))
    params = {k: v for k, v in (getattr(args, "knob_defaults", None) or {}).items()
              if k in accepted and v is not None}
    params.update(user)
    return params


def parse_lr_decay_epochs(text: str) -> List[int]:
    """``'10,20'`` -> ``[10, 20]``; raises UsageError unless strictly increasing > 0."""
    if not text or not text.strip():
        return []
    try:
        epochs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError("--lr-decay-epoch must be comma-separated integers, got %r"
                         % text) from None
    if any(e <= 0 for e in epochs) or epochs != sorted(set(epochs)):
        raise UsageError("--lr-decay-epoch must be strictly increasing epochs > 0, got %r"
                         % text)
    return epochs


def parse_gpus(text: str) -> List[int]:
    """``'0,1'`` -> ``[0, 1]``; empty -> ``[]`` (CPU)."""
    if not text or not text.strip():
        return []
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError("--gpus must be comma-separated GPU ids, got %r" % text) from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise UsageError("--gpus must list distinct ids >= 0, got %r" % text)
    return ids


def validate_args(args: argparse.Namespace) -> None:
    """Check the settings; raises UsageError with a message naming the flag."""
    positive_ints = ("num_epochs", "batch_size", "synthetic_batches")
    for name in positive_ints:
        if getattr(args, name) < 1:
            raise UsageError("--%s must be >= 1, got %r" % (name.replace("_", "-"),
                                                            getattr(args, name)))
    if args.max_iters is not None and args.max_iters < 1:
        raise UsageError("--max-iters must be >= 1, got %r" % args.max_iters)
    if args.num_data_workers < 0 or args.log_interval < 0:
        raise UsageError("--num-data-workers and --log-interval must be >= 0")
    if not args.lr > 0 or math.isinf(args.lr):
        raise UsageError("--lr must be > 0, got %r" % args.lr)
    if not 0 <= args.momentum < 1:
        raise UsageError("--momentum must be in [0, 1), got %r" % args.momentum)
    if args.wd < 0:
        raise UsageError("--wd must be >= 0, got %r" % args.wd)
    if not args.lr_decay > 0:
        raise UsageError("--lr-decay must be > 0, got %r" % args.lr_decay)
    parse_lr_decay_epochs(args.lr_decay_epoch)
    parse_gpus(args.gpus)
    if args.resume and not args.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint-dir")
    compression_params(args)


def parse_args(parser: argparse.ArgumentParser,
               argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and validate; bad settings exit with status 2 and a message."""
    args = parser.parse_args(argv)
    try:
        validate_args(args)
    except UsageError as err:
        parser.error(str(err))
    return args


# ----------------------------------------------------------------------------
# devices, stores

def get_context(gpus: str) -> List[mx.Context]:
    """Devices of this worker; raises UsageError if a GPU id does not exist."""
    ids = parse_gpus(gpus)
    if not ids:
        return [mx.cpu()]
    available = mx.context.num_gpus()
    missing = [i for i in ids if i >= available]
    if missing:
        raise UsageError("--gpus %s: this machine has %d GPU(s) visible to MXNet "
                         "(a CPU-only mxnet build sees none)" % (gpus, available))
    return [mx.gpu(i) for i in ids]


def create_kvstore(algorithm: str, num_devices: int = 1):
    """The store for ``--algorithm``, created up front (rank known before training).

    Returns:
        a KVStore instance, ``'device'`` for ``local`` on several GPUs, or ``None``
        for ``local`` on one device.

    Raises:
        UsageError: a distributed store requested outside a distributed job, or a
            project store that is not registered.
    """
    if algorithm == "local":
        return "device" if num_devices > 1 else None
    if algorithm != "horovod" and "DMLC_ROLE" not in os.environ:
        raise UsageError(
            "--algorithm %s needs a distributed job (no DMLC_ROLE in the environment); "
            "start it with: python -m mxnet_cpsgd.launch -n WORKERS -s SERVERS -- "
            "python %s ..." % (algorithm, os.path.basename(sys.argv[0] or "script.py")))
    if algorithm in PROJECT_STORES:
        import mxnet_cpsgd  # noqa: F401  (registers the stores)
    try:
        return mx.kv.create(algorithm)
    except (mx.base.MXNetError, KeyError, ValueError, ImportError, RuntimeError) as err:
        raise UsageError("cannot create kvstore %r: %s" % (algorithm, err)) from None


def rank_and_workers(kv) -> Tuple[int, int]:
    """``(rank, num_workers)`` of a store (``(0, 1)`` without a distributed one)."""
    if kv is None or isinstance(kv, str):
        return 0, 1
    return int(kv.rank), int(kv.num_workers)


def updates_per_iteration(algorithm: str, num_workers: int) -> int:
    """Optimizer updates the servers run per training iteration of the job.

    Synchronous stores update once per round; asynchronous ones (``asgd``,
    ``dist_async``) once per push, i.e. ``num_workers`` times per iteration, so
    their learning-rate schedule must count that many updates per iteration.
    """
    if algorithm == "dist_async":
        return num_workers
    if algorithm in PROJECT_STORES:
        from ..stores.policies import POLICIES
        policy = POLICIES.get(algorithm)
        if policy is not None and policy.inner_kvstore == "dist_async":
            return num_workers
    return 1


def make_lr_scheduler(args: argparse.Namespace, iters_per_epoch: int,
                      updates_per_iter: int = 1):
    """The schedule of ``--lr-mode`` in optimizer updates (``None``: constant lr).

    Args:
        args: parsed command line.
        iters_per_epoch: training iterations per epoch.
        updates_per_iter: optimizer updates per iteration (see
            :func:`updates_per_iteration`).
    """
    per_epoch = iters_per_epoch * updates_per_iter
    if args.lr_mode == "cosine":
        total = max(1, args.num_epochs * per_epoch)
        return mx.lr_scheduler.CosineScheduler(max_update=total, base_lr=args.lr,
                                               final_lr=0)
    epochs = [e for e in parse_lr_decay_epochs(args.lr_decay_epoch) if e < args.num_epochs]
    if not epochs:
        return None
    steps = [e * per_epoch for e in epochs]
    return mx.lr_scheduler.MultiFactorScheduler(step=steps, factor=args.lr_decay,
                                                base_lr=args.lr)


# ----------------------------------------------------------------------------
# logs

def rank_path(path: Optional[str], rank: int) -> Optional[str]:
    """``PATH`` for rank 0, ``stem.rank<r>.ext`` for other ranks."""
    if not path or rank == 0:
        return path
    stem, ext = os.path.splitext(path)
    return "%s.rank%d%s" % (stem, rank, ext)


class EpochLogWriter:
    """Appends one JSON line and/or CSV row per epoch.

    Args:
        json_path: JSON-lines file (``None``: none).
        csv_path: CSV file (``None``: none).
        append: keep existing content (``--resume``); otherwise start afresh.
    """

    def __init__(self, json_path: Optional[str], csv_path: Optional[str], append: bool):
        self.json_path = json_path
        self.csv_path = csv_path
        for path in (json_path, csv_path):
            if path:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                if not append and os.path.exists(path):
                    os.remove(path)

    def write(self, record: Dict[str, object]) -> None:
        if self.json_path:
            with open(self.json_path, "a") as f:
                f.write(json.dumps(record, sort_keys=False) + "\n")
        if self.csv_path:
            new = not os.path.exists(self.csv_path) or os.path.getsize(self.csv_path) == 0
            with open(self.csv_path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(LOG_FIELDS), extrasaction="ignore")
                if new:
                    writer.writeheader()
                writer.writerow(record)


def setup_logging(rank: int, quiet: bool = False) -> None:
    """Rank 0 logs progress to stdout; other ranks only warnings and errors."""
    level = logging.WARNING if (quiet or rank != 0) else logging.INFO
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(
        "%(message)s" if rank == 0 else "[rank %d] %%(message)s" % rank))
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


# ----------------------------------------------------------------------------
# checkpoints

@dataclass
class TrainState:
    """Where training stands: ``epoch`` in progress, batches done in it, total."""
    epoch: int = 0
    epoch_iteration: int = 0
    iteration: int = 0


def states_supported(algorithm: str) -> bool:
    """MXNet's raw dist stores keep optimizer state on the servers only; their
    workers cannot save or load it (MXNet asserts)."""
    return algorithm not in RAW_DIST_STORES


def save_checkpoint(directory: str, net: gluon.Block, trainer: gluon.Trainer,
                    state: TrainState, rank: int, num_workers: int,
                    algorithm: str) -> None:
    """Save a checkpoint; every worker must call it (the stores' save is collective).

    Rank 0 writes ``model.params`` and ``checkpoint.json``; every worker writes
    its optimizer/store states to ``states-rank<r>.bin``.
    """
    os.makedirs(directory, exist_ok=True)
    if rank == 0:
        tmp = os.path.join(directory, CHECKPOINT_PARAMS + ".tmp")
        net.save_parameters(tmp)
        os.replace(tmp, os.path.join(directory, CHECKPOINT_PARAMS))
    if states_supported(algorithm):
        trainer.save_states(os.path.join(directory, "states-rank%d.bin" % rank))
    if rank == 0:
        meta = {"epoch": state.epoch, "epoch_iteration": state.epoch_iteration,
                "iteration": state.iteration, "algorithm": algorithm,
                "num_workers": num_workers, "states": states_supported(algorithm)}
        tmp = os.path.join(directory, CHECKPOINT_JSON + ".tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, os.path.join(directory, CHECKPOINT_JSON))


def read_checkpoint(directory: str, num_workers: int, algorithm: str) -> Dict[str, object]:
    """Read and check ``checkpoint.json``; raises UsageError on a mismatch."""
    path = os.path.join(directory, CHECKPOINT_JSON)
    if not os.path.isfile(path):
        raise UsageError("--resume: no checkpoint in %s (missing %s)"
                         % (directory, CHECKPOINT_JSON))
    with open(path) as f:
        meta = json.load(f)
    if meta.get("num_workers") != num_workers:
        raise UsageError("--resume: the checkpoint in %s is from %s workers, this job has %d"
                         % (directory, meta.get("num_workers"), num_workers))
    if meta.get("algorithm") != algorithm:
        logger.warning("resuming a %s checkpoint with --algorithm %s",
                       meta.get("algorithm"), algorithm)
    return meta


def load_checkpoint(directory: str, meta: Dict[str, object], net: gluon.Block,
                    trainer: gluon.Trainer, ctx: List[mx.Context], rank: int,
                    algorithm: str, step_batch: int) -> TrainState:
    """Load parameters and (collectively, on every worker) the trainer states.

    Args:
        step_batch: the batch size later passed to ``trainer.step``.
    """
    net.load_parameters(os.path.join(directory, CHECKPOINT_PARAMS), ctx=ctx)
    if states_supported(algorithm) and meta.get("states", True):
        states = os.path.join(directory, "states-rank%d.bin" % rank)
        if not os.path.isfile(states):
            raise UsageError("--resume: missing %s" % states)
        # trainer.load_states initialises the store before any trainer.step has set
        # the optimizer's 1/batch_size rescale; a later step would then find it
        # changed ("Possible change in the batch_size") and the servers would run
        # with rescale 1.  Set it as trainer.step(step_batch) would (MXNet 1.9.1).
        trainer._optimizer.rescale_grad = trainer._scale / step_batch
        trainer.load_states(states)
    return TrainState(int(meta["epoch"]), int(meta["epoch_iteration"]),
                      int(meta["iteration"]))


# ----------------------------------------------------------------------------
# training loop

def _reset_batchnorm_stats(net: gluon.Block) -> None:
    for name, p in net.collect_params().items():
        if name.endswith("running_mean"):
            p.set_data(mx.nd.zeros(p.shape))
        elif name.endswith("running_var"):
            p.set_data(mx.nd.ones(p.shape))


def evaluate(net: gluon.Block, loader: Iterable, ctx: List[mx.Context],
             loss_fn: gluon.loss.Loss) -> Tuple[float, float, int]:
    """``(accuracy, mean loss, samples)`` of ``net`` on ``loader``."""
    correct, loss_sum, count = 0.0, 0.0, 0
    for data, label in loader:
        datas = gluon.utils.split_and_load(data, ctx, even_split=False)
        labels = gluon.utils.split_and_load(label, ctx, even_split=False)
        for x, y in zip(datas, labels):
            out = net(x)
            loss_sum += float(loss_fn(out, y).sum().asscalar())
            correct += float((out.argmax(axis=1) == y).sum().asscalar())
            count += x.shape[0]
    if count == 0:
        return float("nan"), float("nan"), 0
    return correct / count, loss_sum / count, count


@dataclass
class RunResult:
    """What :func:`train` returns: the per-epoch records and the final state."""
    records: List[Dict[str, object]] = field(default_factory=list)
    state: TrainState = field(default_factory=TrainState)


def train(args: argparse.Namespace, net: gluon.HybridBlock, train_data, val_data,
          info: data_mod.DatasetInfo, ctx: List[mx.Context], kv, rank: int,
          num_workers: int, model_name: str) -> RunResult:
    """Train ``net`` for ``args.num_epochs`` epochs (or ``args.max_iters`` iterations).

    Args:
        args: parsed command line.
        net: initialized network (see :func:`models.initialize`).
        train_data: training loader (same ``len`` on every worker).
        val_data: validation loader.
        info: data set description.
        ctx: this worker's devices.
        kv: store instance, ``'device'`` or ``None``.
        rank: this worker's rank.
        num_workers: number of workers.
        model_name: for the logs.

    Returns:
        RunResult with one record per (possibly partial) epoch.
    """
    iters_per_epoch = len(train_data)
    cparams = compression_params(args)
    opt_params = {"learning_rate": args.lr, "momentum": args.momentum, "wd": args.wd}
    updates = updates_per_iteration(args.algorithm, num_workers)
    scheduler = make_lr_scheduler(args, iters_per_epoch, updates)
    if scheduler is not None:
        opt_params["lr_scheduler"] = scheduler

    meta = None
    if args.resume:
        meta = read_checkpoint(args.checkpoint_dir, num_workers, args.algorithm)
        opt_params["begin_num_update"] = int(meta["iteration"]) * updates
    trainer = gluon.Trainer(net.collect_params(), "sgd", opt_params, kvstore=kv,
                            compression_params=cparams or None)
    state = TrainState()
    if meta is not None:
        state = load_checkpoint(args.checkpoint_dir, meta, net, trainer, ctx, rank,
                                args.algorithm, args.batch_size)
        logger.info("resumed from %s: epoch %d, iteration %d (batch %d of the epoch)",
                    args.checkpoint_dir, state.epoch, state.iteration, state.epoch_iteration)

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    # every store, MXNet's own included, gets the per-worker batch: each worker's
    # gradient is rescaled by 1/batch_size and the servers sum the workers'
    # (MXNet's convention), so the step is lr * sum of the workers' mean gradients
    step_bs = args.batch_size
    writer = EpochLogWriter(rank_path(args.log_json, rank), rank_path(args.log_csv, rank),
                            append=args.resume)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    # a private copy for the logs: MXNet's schedulers are stateful, and with
    # update_on_kvstore the worker's optimizer copy never advances
    report_schedule = copy.deepcopy(scheduler)
    result = RunResult(state=state)
    stop = False

    while state.epoch < args.num_epochs and not stop:
        epoch = state.epoch
        skip = state.epoch_iteration
        metric = mx.metric.Accuracy()
        loss_sum, loss_count, iterations, comm = 0.0, 0, 0, 0.0
        tic = time.time()
        btic = tic
        for i, (data, label) in enumerate(train_data):
            if i < skip:
                continue  # resumed mid-epoch: these batches were done before
            if i == skip and skip:
                tic = btic = time.time()  # time only the batches run now
            if args.max_iters is not None and state.iteration >= args.max_iters:
                stop = True
                break
            datas = gluon.utils.split_and_load(data, ctx, even_split=False)
            labels = gluon.utils.split_and_load(label, ctx, even_split=False)
            with autograd.record():
                outputs = [net(x) for x in datas]
                losses = [loss_fn(o, y) for o, y in zip(outputs, labels)]
            autograd.backward(losses)
            if args.comm_timing:
                for p in params:
                    for g in p.list_grad():
                        g.wait_to_read()
                t_grad = time.time()
            trainer.step(step_bs)
            if args.comm_timing:
                for p in params:
                    for w in p.list_data():
                        w.wait_to_read()
                comm += time.time() - t_grad
            metric.update(labels, outputs)
            for l in losses:
                loss_sum += float(l.sum().asscalar())
                loss_count += l.shape[0]
            iterations += 1
            state.iteration += 1
            state.epoch_iteration = i + 1
            if args.log_interval and iterations % args.log_interval == 0:
                speed = args.log_interval * args.batch_size / max(time.time() - btic, 1e-9)
                logger.info("[Epoch %d Batch %d] Speed: %.1f samples/sec train=%.4f loss=%.4f",
                            epoch, i + 1, speed, metric.get()[1], loss_sum / max(loss_count, 1))
                btic = time.time()
        epoch_time = time.time() - tic
        if not stop:  # the epoch is complete
            state.epoch += 1
            state.epoch_iteration = 0
        if iterations == 0:
            break
        val_acc, val_loss, _ = evaluate(net, val_data, ctx, loss_fn)
        samples = iterations * args.batch_size
        sps = samples / epoch_time if epoch_time > 0 else float("nan")
        record = {
            "algorithm": args.algorithm, "epoch": epoch, "rank": rank,
            "num_workers": num_workers, "train_acc": metric.get()[1],
            "train_loss": loss_sum / max(loss_count, 1), "val_acc": val_acc,
            "val_loss": val_loss, "epoch_time": epoch_time,
            "comm_time": comm if args.comm_timing else None,
            "samples_per_sec": sps, "iterations": iterations,
            "total_iterations": state.iteration,
            "global_samples_per_sec": sps * num_workers,
            "lr": _current_lr(report_schedule, state.iteration * updates, args.lr),
            "dataset": info.name, "model": model_name, "batch_size": args.batch_size,
        }
        record = {k: _json_number(v) for k, v in record.items()}
        writer.write(record)
        result.records.append(record)
        comm_text = "%.2fs" % comm if args.comm_timing else "n/a"
        logger.info("[Epoch %d] train=%.4f val=%.4f loss=%.4f time=%.2fs comm=%s "
                    "Speed: %.1f samples/sec%s", epoch, record["train_acc"], val_acc,
                    record["train_loss"], epoch_time, comm_text, sps,
                    "" if iterations == iters_per_epoch else
                    " (%d of %d iterations)" % (iterations, iters_per_epoch))
        if args.checkpoint_dir:
            save_checkpoint(args.checkpoint_dir, net, trainer, state, rank, num_workers,
                            args.algorithm)
    result.state = state
    return result


def _current_lr(schedule, iteration: int, base_lr: float) -> float:
    return float(schedule(iteration)) if schedule is not None else base_lr


def _json_number(value):
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


# ----------------------------------------------------------------------------
# the whole script

def main(parser: argparse.ArgumentParser, dataset: Optional[str] = None,
         model: Optional[str] = None, argv: Optional[Sequence[str]] = None) -> int:
    """Parse arguments, set up data, model and store, train, and return 0.

    Args:
        parser: from :func:`build_parser`.
        dataset: fixed data set (else ``args.dataset``).
        model: fixed model (else ``args.model``).
        argv: command line (default ``sys.argv[1:]``).

    Returns:
        the exit status: 0 on success, 1 on a data or setup error (message on stderr),
        2 on bad arguments (argparse).
    """
    args = parse_args(parser, argv)
    dataset = dataset or args.dataset
    model_name = model or args.model
    try:
        ctx = get_context(args.gpus)
        # fail before any distributed store starts: a store that started and then
        # lost a worker leaves the others waiting
        data_mod.check_dataset(dataset, args.data_dir, args.synthetic)
        kv = create_kvstore(args.algorithm, len(ctx))
    except (UsageError, data_mod.DataError) as err:
        print("error: %s" % err, file=sys.stderr)
        return 1
    rank, num_workers = rank_and_workers(kv)
    setup_logging(rank, args.quiet)
    try:
        return _run(args, dataset, model_name, ctx, kv, rank, num_workers)
    except BaseException as err:
        if not _is_distributed(kv):
            raise
        # A worker that leaves a distributed job with an error must not run the
        # store's destructor: MXNet's waits in a barrier for all workers and the
        # others wait for this one's pushes, so nobody would ever exit (and a
        # launcher that watches the workers would never see the failure).
        if isinstance(err, (UsageError, data_mod.DataError)):
            print("error: %s" % err, file=sys.stderr)
        else:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130 if isinstance(err, KeyboardInterrupt) else 1)


def _is_distributed(kv) -> bool:
    return kv is not None and not isinstance(kv, str)


def _run(args: argparse.Namespace, dataset: str, model_name: str, ctx: List[mx.Context],
         kv, rank: int, num_workers: int) -> int:
    """The part of :func:`main` after the store exists; returns the exit status."""
    np.random.seed(args.seed)
    mx.random.seed(args.seed)
    try:
        train_data, val_data, info = data_mod.get_data(
            dataset, args.batch_size, rank=rank, num_workers=num_workers,
            data_dir=args.data_dir, synthetic=args.synthetic, seed=args.seed,
            val_shard=args.val_split == "shard", synthetic_batches=args.synthetic_batches,
            num_data_workers=args.num_data_workers,
            input_size=getattr(args, "input_size", 224))
    except data_mod.DataError as err:
        if _is_distributed(kv):
            raise
        print("error: %s" % err, file=sys.stderr)
        return 1
    net = models_mod.get_model(model_name, classes=info.num_classes)
    num_params = models_mod.initialize(net, info.shape, ctx, hybridize=args.hybridize,
                                       seed=args.seed)
    _reset_batchnorm_stats(net)
    cparams = compression_params(args)
    logger.info("algorithm=%s workers=%d knobs=%s model=%s (%d parameters) dataset=%s "
                "train/worker=%d val/worker=%d batch/worker=%d batches/epoch=%d ctx=%s",
                args.algorithm, num_workers, json.dumps(cparams, sort_keys=True),
                model_name, num_params, info.name, info.train_per_worker,
                info.val_per_worker, args.batch_size, len(train_data),
                ",".join(str(c) for c in ctx))
    try:
        result = train(args, net, train_data, val_data, info, ctx, kv, rank, num_workers,
                       model_name)
    except UsageError as err:
        if _is_distributed(kv):
            raise
        print("error: %s" % err, file=sys.stderr)
        return 1
    if result.records:
        last = result.records[-1]
        logger.info("done: %d iterations, final val=%.4f", result.state.iteration,
                    last["val_acc"] if last["val_acc"] is not None else float("nan"))
    return 0

__all__ = ["ALGORITHMS", "PROJECT_STORES", "RAW_DIST_STORES", "KNOB_FLAGS", "LOG_FIELDS",
           "UsageError", "build_parser", "parse_args", "validate_args",
           "compression_params", "accepted_knobs", "get_context", "create_kvstore",
           "rank_and_workers", "make_lr_scheduler", "updates_per_iteration", "rank_path",
           "EpochLogWriter", "TrainState", "save_checkpoint", "read_checkpoint",
           "load_checkpoint", "evaluate", "train", "main", "RunResult"]
