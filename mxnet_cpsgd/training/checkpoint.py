"""Checkpoints of a training run: model parameters, trainer (store) states and
where in the run they were taken, for ``--resume``.
"""
import json
import os
from dataclasses import dataclass
from typing import Dict, List

import mxnet as mx
from mxnet import gluon

from .options import RAW_DIST_STORES, UsageError
from .logs import logger


CHECKPOINT_JSON = "checkpoint.json"
CHECKPOINT_PARAMS = "model.params"

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
