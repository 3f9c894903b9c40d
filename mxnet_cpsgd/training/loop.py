"""The training loop: the learning-rate schedule in updates, epochs of
forward/backward/``trainer.step``, evaluation, the timing of every epoch,
per-epoch logs and checkpoints.

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
import math
import os
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

from . import data as data_mod
from .options import PROJECT_STORES, UsageError, compression_params, parse_lr_decay_epochs
from .logs import EpochLogWriter, logger, rank_path
from .timed_training import TimedTraining
from .checkpoint import (TrainState, check_writable, load_checkpoint, newest_complete,
                         read_checkpoint, save_checkpoint)
from kvstore_ext.progress import ProgressReporter

RESTART_ENV = "MXNET_CPSGD_RESTART"


def restart_count(environ=None) -> int:
    """The launcher's restart number (``MXNET_CPSGD_RESTART``; 0: first start)."""
    value = (os.environ if environ is None else environ).get(RESTART_ENV, "")
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def resume_wanted(args: argparse.Namespace) -> bool:
    """Whether this run resumes: ``--resume``, or a restart by the launcher with
    ``--checkpoint-dir`` and a complete checkpoint there (else a fresh start, logged)."""
    if args.resume:
        return True
    restart = restart_count()
    if not restart or not args.checkpoint_dir:
        return False
    if newest_complete(args.checkpoint_dir) is None:
        logger.info("restart %d: no complete checkpoint in %s, starting from the beginning",
                    restart, args.checkpoint_dir)
        return False
    logger.info("restart %d: resuming from the newest complete checkpoint in %s",
                restart, args.checkpoint_dir)
    return True


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


def step_batch_size(args: argparse.Namespace, num_workers: int) -> int:
    """The batch size passed to ``trainer.step``, by ``--lr-convention``.

    Every store, MXNet's own included, rescales each worker's gradient by
    ``1/step_batch`` and the servers sum the workers' gradients.  ``sum``
    (gluon's convention): the per-worker batch, so the step is ``lr x`` the sum of
    the workers' batch-mean gradients.  ``mean`` (the authors' Module API, which
    rescales by ``1/(B*M)``): ``B * M``, so the step is ``lr x`` the mean gradient
    over all workers' samples.
    """
    if getattr(args, "lr_convention", "sum") == "mean":
        return args.batch_size * num_workers
    return args.batch_size


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
# training loop

def reset_batchnorm_stats(net: gluon.Block) -> None:
    for name, p in net.collect_params().items():
        if name.endswith("running_mean"):
            p.set_data(mx.nd.zeros(p.shape))
        elif name.endswith("running_var"):
            p.set_data(mx.nd.ones(p.shape))


def evaluate(net: gluon.Block, loader: Iterable, ctx: List[mx.Context],
             loss_fn: gluon.loss.Loss,
             progress: Optional[ProgressReporter] = None) -> Tuple[float, float, int]:
    """``(accuracy, mean loss, samples)`` of ``net`` on ``loader``; reports phase
    ``eval`` (batches done) to ``progress``."""
    correct, loss_sum, count = 0.0, 0.0, 0
    for batch, (data, label) in enumerate(loader):
        if progress is not None:
            progress.report("eval", batch)
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

    step_bs = step_batch_size(args, num_workers)
    progress = ProgressReporter()
    progress.report("start", 0)
    if args.checkpoint_dir:
        check_writable(args.checkpoint_dir)
    resume = resume_wanted(args)
    trainer, state = _trainer_and_state(args, net, train_data, ctx, kv, rank, num_workers,
                                        opt_params, cparams, updates, step_bs, resume)

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    writer = EpochLogWriter(rank_path(args.log_json, rank), rank_path(args.log_csv, rank),
                            append=resume)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    # a private copy for the logs: MXNet's schedulers are stateful, and with
    # update_on_kvstore the worker's optimizer copy never advances
    report_schedule = copy.deepcopy(scheduler)
    result = RunResult(state=state)
    stop = False
    timed = TimedTraining(args, net, params, ctx, model_name, info.num_classes, info.shape,
                          iters_per_epoch, rank, num_workers, resume=resume)
    loop = _Loop(args, net, trainer, ctx, loss_fn, params, progress, step_bs, rank,
                 num_workers, iters_per_epoch, timed, val_data)

    while state.epoch < args.num_epochs and not stop:
        epoch = state.epoch
        done = _train_epoch(loop, train_data, state)
        stop = done.stop
        if not stop:  # the epoch is complete
            state.epoch += 1
            state.epoch_iteration = 0
        if done.iterations == 0:
            break
        val_acc, val_loss, _ = timed.epoch_validation(state.iteration, epoch, lambda: evaluate(
            net, val_data, ctx, loss_fn, progress))
        record = _epoch_record(loop, epoch, done, val_acc, val_loss, state.iteration,
                               _current_lr(report_schedule, state.iteration * updates,
                                           args.lr), info.name, model_name)
        writer.write(record)
        result.records.append(record)
        comm_text = "%.2fs" % done.comm if args.comm_timing else "n/a"
        logger.info("[Epoch %d] train=%.4f val=%.4f loss=%.4f time=%.2fs comm=%s "
                    "Speed: %.1f samples/sec%s", epoch, record["train_acc"], val_acc,
                    record["train_loss"], done.time, comm_text,
                    done.samples_per_sec(args.batch_size),
                    "" if done.iterations == iters_per_epoch else
                    " (%d of %d iterations)" % (done.iterations, iters_per_epoch))
        if args.checkpoint_dir:
            progress.report("save", state.iteration)
            save_checkpoint(args.checkpoint_dir, net, trainer, state, rank, num_workers,
                            args.algorithm)
    result.state = state
    return result


def _trainer_and_state(args, net, train_data, ctx, kv, rank, num_workers, opt_params,
                       cparams, updates, step_bs, resume):
    """The Trainer, and the state to start from: a new one, or the checkpoint's
    (then the loader skips the epochs done)."""
    meta = None
    if resume:
        meta = read_checkpoint(args.checkpoint_dir, num_workers, args.algorithm)
        opt_params["begin_num_update"] = int(meta["iteration"]) * updates
    trainer = gluon.Trainer(net.collect_params(), "sgd", opt_params, kvstore=kv,
                            compression_params=cparams or None)
    state = TrainState()
    if meta is not None:
        state = load_checkpoint(meta, net, trainer, ctx, rank, args.algorithm, step_bs)
        skip_epoch = getattr(train_data, "skip_epoch", None)
        for _ in range(state.epoch if skip_epoch is not None else 0):
            skip_epoch()  # the shuffle of epoch e depends on the epochs before it
        logger.info("resumed from %s: epoch %d, iteration %d (batch %d of the epoch)",
                    meta["path"], state.epoch, state.iteration, state.epoch_iteration)
    return trainer, state


@dataclass
class _Loop:
    """What every iteration uses."""
    args: argparse.Namespace
    net: gluon.HybridBlock
    trainer: gluon.Trainer
    ctx: List[mx.Context]
    loss_fn: gluon.loss.Loss
    params: list  # the parameters with gradients
    progress: ProgressReporter
    step_bs: int
    rank: int
    num_workers: int
    iters_per_epoch: int
    timed: TimedTraining  # the emulated accelerator, validation every N iterations
    val_data: object


@dataclass
class _EpochStats:
    """What one pass over the training data measured."""
    metric: mx.metric.EvalMetric
    loss_sum: float = 0.0
    loss_count: int = 0
    iterations: int = 0
    comm: float = 0.0
    time: float = 0.0
    stop: bool = False  # --max-iters reached

    def samples_per_sec(self, batch_size: int) -> float:
        samples = self.iterations * batch_size
        return samples / self.time if self.time > 0 else float("nan")


def _train_epoch(loop: _Loop, train_data, state: TrainState) -> _EpochStats:
    """The training iterations of epoch ``state.epoch`` (from a resumed batch on),
    with checkpoints every --checkpoint-every iterations within it."""
    args, net, trainer, ctx = loop.args, loop.net, loop.trainer, loop.ctx
    epoch = state.epoch
    skip = state.epoch_iteration
    done = _EpochStats(metric=mx.metric.Accuracy())
    tic = time.time()
    btic = tic
    validating0 = loop.timed.validation_seconds
    net_tx0 = _iface_tx_bytes(args)
    for i, (data, label) in enumerate(train_data):
        if i < skip:
            continue  # resumed mid-epoch: these batches were done before
        if i == skip and skip:
            tic = btic = time.time()  # time only the batches run now
        if args.max_iters is not None and state.iteration >= args.max_iters:
            done.stop = True
            break
        datas = gluon.utils.split_and_load(data, ctx, even_split=False)
        labels = gluon.utils.split_and_load(label, ctx, even_split=False)
        loop.timed.before_forward()
        with autograd.record():
            outputs = [net(x) for x in datas]
            losses = [loop.loss_fn(o, y) for o, y in zip(outputs, labels)]
        autograd.backward(losses)
        loop.timed.after_backward()
        if args.comm_timing:
            for p in loop.params:
                for g in p.list_grad():
                    g.wait_to_read()
            t_grad = time.time()
        trainer.step(loop.step_bs)
        if args.comm_timing:
            for p in loop.params:
                for w in p.list_data():
                    w.wait_to_read()
            done.comm += time.time() - t_grad
        done.metric.update(labels, outputs)
        for l in losses:
            done.loss_sum += float(l.sum().asscalar())
            done.loss_count += l.shape[0]
        done.iterations += 1
        state.iteration += 1
        state.epoch_iteration = i + 1
        loop.progress.report("train", state.iteration)
        loop.timed.after_iteration(state.iteration, epoch, i + 1, lambda: evaluate(
            net, loop.val_data, ctx, loop.loss_fn, loop.progress))
        if (args.checkpoint_every and state.iteration % args.checkpoint_every == 0
                and i + 1 < loop.iters_per_epoch
                and (args.max_iters is None or state.iteration < args.max_iters)):
            # the epoch's end and --max-iters save below, after the evaluation
            loop.progress.report("save", state.iteration)
            save_checkpoint(args.checkpoint_dir, net, trainer, state, loop.rank,
                            loop.num_workers, args.algorithm)
        if args.log_interval and done.iterations % args.log_interval == 0:
            speed = args.log_interval * args.batch_size / max(time.time() - btic, 1e-9)
            logger.info("[Epoch %d Batch %d] Speed: %.1f samples/sec train=%.4f loss=%.4f",
                        epoch, i + 1, speed, done.metric.get()[1],
                        done.loss_sum / max(done.loss_count, 1))
            btic = time.time()
    done.time = time.time() - tic - (loop.timed.validation_seconds - validating0)
    net_tx = _iface_tx_bytes(args)
    if net_tx is not None and net_tx0 is not None and done.iterations:
        logger.info("[Epoch %d] %s sent %d bytes during %d training iterations: "
                    "%.0f bytes per iteration per worker (all %d workers on %s)",
                    epoch, args.net_iface, net_tx - net_tx0, done.iterations,
                    (net_tx - net_tx0) / float(done.iterations * loop.num_workers),
                    loop.num_workers, args.net_iface)
    return done


def _epoch_record(loop: _Loop, epoch: int, done: _EpochStats, val_acc: float,
                  val_loss: float, total_iterations: int, lr: float, dataset: str,
                  model_name: str) -> Dict[str, object]:
    """The epoch's log record (JSON numbers: NaN and infinities as None)."""
    args, num_workers = loop.args, loop.num_workers
    sps = done.samples_per_sec(args.batch_size)
    record = {
        "algorithm": args.algorithm, "epoch": epoch, "rank": loop.rank,
        "num_workers": num_workers, "train_acc": done.metric.get()[1],
        "train_loss": done.loss_sum / max(done.loss_count, 1), "val_acc": val_acc,
        "val_loss": val_loss, "epoch_time": done.time,
        "comm_time": done.comm if args.comm_timing else None,
        "samples_per_sec": sps, "iterations": done.iterations,
        "total_iterations": total_iterations,
        "global_samples_per_sec": sps * num_workers,
        "lr": lr,
        "dataset": dataset, "model": model_name, "batch_size": args.batch_size,
    }
    record.update(loop.timed.epoch_fields())
    return {k: _json_number(v) for k, v in record.items()}


def _iface_tx_bytes(args) -> Optional[int]:
    """Bytes sent so far by ``--net-iface`` (None without the flag).

    Read from ``/proc/net/dev``, which shows the process's own network namespace
    (``/sys/class/net`` shows the namespace that mounted /sys).
    """
    iface = getattr(args, "net_iface", None)
    if not iface:
        return None
    with open("/proc/net/dev") as f:
        for line in f:
            name, sep, fields = line.partition(":")
            if sep and name.strip() == iface:
                return int(fields.split()[8])  # transmit bytes
    raise UsageError("--net-iface %s: no such interface in /proc/net/dev" % iface)


def _current_lr(schedule, iteration: int, base_lr: float) -> float:
    return float(schedule(iteration)) if schedule is not None else base_lr


def _json_number(value):
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value
