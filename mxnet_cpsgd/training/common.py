"""The training scripts' shared entry point.

``scripts/train_mnist.py``, ``scripts/train_cifar.py`` and
``scripts/train_imagenet.py`` are thin wrappers: each builds a parser with
:func:`~mxnet_cpsgd.training.options.build_parser` (its own defaults), and calls
:func:`main`, which picks devices and the store, loads data and model, and runs
:func:`~mxnet_cpsgd.training.loop.train`.  The parts: :mod:`.options` (command
line), :mod:`.loop` (epochs, timing), :mod:`.checkpoint`, :mod:`.logs`,
:mod:`.data`, :mod:`.models`.
"""
import argparse
import json
import os
import sys
import traceback
from typing import List, Optional, Sequence, Tuple

import numpy as np

import mxnet as mx

from . import data as data_mod
from . import models as models_mod
from .options import (HOROVOD_STORES, LR_CONVENTIONS, PROJECT_STORES, UsageError, compression_params,
                      parse_args, parse_gpus)
from .logs import logger, setup_logging
from .loop import reset_batchnorm_stats, train
from .checkpoint import CheckpointError


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
    if algorithm not in HOROVOD_STORES and "DMLC_ROLE" not in os.environ:
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
        if isinstance(err, (UsageError, data_mod.DataError, CheckpointError)):
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
            val_shard=args.val_split == "shard", holdout=args.val_split == "holdout",
            synthetic_batches=args.synthetic_batches,
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
    reset_batchnorm_stats(net)
    cparams = compression_params(args)
    logger.info("algorithm=%s workers=%d knobs=%s model=%s (%d parameters) dataset=%s "
                "train/worker=%d val/worker=%d batch/worker=%d batches/epoch=%d ctx=%s "
                "lr=%g lr_convention=%s (%s)",
                args.algorithm, num_workers, json.dumps(cparams, sort_keys=True),
                model_name, num_params, info.name, info.train_per_worker,
                info.val_per_worker, args.batch_size, len(train_data),
                ",".join(str(c) for c in ctx), args.lr, args.lr_convention,
                LR_CONVENTIONS[args.lr_convention])
    try:
        result = train(args, net, train_data, val_data, info, ctx, kv, rank, num_workers,
                       model_name)
    except (UsageError, CheckpointError) as err:
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
