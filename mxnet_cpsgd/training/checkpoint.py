"""Checkpoints of a training run: model parameters, trainer (store) states and
where in the run they were taken, for ``--resume`` and automatic restarts.

Layout: one directory per checkpoint, ``<checkpoint-dir>/iter-<iteration>/``
(zero-padded, so names sort by iteration), holding ``model.params`` (rank 0),
``states-rank<r>.bin`` (every rank) and ``checkpoint.json`` (rank 0).  Every file
is written to a temporary name, fsynced, renamed into place, and the directory
fsynced: a file that exists under its final name is complete.  A checkpoint is
complete when ``checkpoint.json`` exists, parses, the SHA-256 of ``model.params``
matches the one it records, and every rank's states file exists and matches the
digest in its ``.sha256`` companion; a kill during a save leaves an incomplete
checkpoint that :func:`newest_complete` skips.  The newest :data:`KEEP` complete
checkpoints are kept.
"""
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import mxnet as mx
from mxnet import gluon

from .options import RAW_DIST_STORES, UsageError
from .logs import logger


CHECKPOINT_JSON = "checkpoint.json"
CHECKPOINT_PARAMS = "model.params"
KEEP = 3
_NAME = re.compile(r"^iter-(\d+)$")

# ----------------------------------------------------------------------------
# checkpoints

@dataclass
class TrainState:
    """Where training stands: ``epoch`` in progress, batches done in it, total."""
    epoch: int = 0
    epoch_iteration: int = 0
    iteration: int = 0


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (full disk, unwritable directory)."""


def states_supported(algorithm: str) -> bool:
    """MXNet's raw dist stores keep optimizer state on the servers only; their
    workers cannot save or load it (MXNet asserts)."""
    return algorithm not in RAW_DIST_STORES


def checkpoint_path(directory: str, iteration: int) -> str:
    """The directory of the checkpoint taken after ``iteration`` iterations."""
    return os.path.join(directory, "iter-%09d" % iteration)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: str, write: Callable[[str], None]) -> None:
    """Write ``path`` through ``write(tmp_path)``, fsync it, rename it into place
    and fsync the directory; on an error the temporary file is removed and
    :class:`CheckpointError` names the path and the cause."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path) or ".")
    except (OSError, mx.base.MXNetError) as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CheckpointError("cannot write checkpoint file %s: %s" % (path, err)) from err


def _write_text(text: str) -> Callable[[str], None]:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    return write


def check_writable(directory: str) -> None:
    """Create ``directory`` and write, fsync and remove a probe file there, so that
    an unwritable directory or a full disk is an error before training starts.

    Raises:
        UsageError: naming the directory and the cause.
    """
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, ".write-probe.%d" % os.getpid())
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        os.unlink(probe)
    except OSError as err:
        raise UsageError("--checkpoint-dir %s is not writable: %s" % (directory, err))


def save_checkpoint(directory: str, net: gluon.Block, trainer: gluon.Trainer,
                    state: TrainState, rank: int, num_workers: int,
                    algorithm: str, keep: int = KEEP) -> str:
    """Save a checkpoint; every worker must call it (the stores' save is collective).

    Rank 0 writes ``model.params`` and ``checkpoint.json`` and removes checkpoints
    older than the newest ``keep`` complete ones; every worker writes its
    optimizer/store states.  Returns the checkpoint's directory.

    Raises:
        CheckpointError: a file could not be written (nothing incomplete is left
            under a final name).
    """
    path = checkpoint_path(directory, state.iteration)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise CheckpointError("cannot create checkpoint directory %s: %s" % (path, err))
    if states_supported(algorithm):
        states = os.path.join(path, "states-rank%d.bin" % rank)
        write_atomic(states, trainer.save_states)
        write_atomic(states + ".sha256", _write_text(_sha256(states)))
    if rank == 0:
        params = os.path.join(path, CHECKPOINT_PARAMS)
        write_atomic(params, net.save_parameters)
        meta = {"epoch": state.epoch, "epoch_iteration": state.epoch_iteration,
                "iteration": state.iteration, "algorithm": algorithm,
                "num_workers": num_workers, "states": states_supported(algorithm),
                "params_sha256": _sha256(params)}
        write_atomic(os.path.join(path, CHECKPOINT_JSON), _write_text(json.dumps(meta)))
        _prune(directory, keep)
    return path


def _candidates(directory: str) -> List[str]:
    """Checkpoint directories under ``directory``, newest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(m.group(1)), n) for n, m in ((n, _NAME.match(n)) for n in names) if m]
    return [os.path.join(directory, n) for _, n in sorted(found, reverse=True)]


def check_complete(path: str) -> Optional[Dict[str, object]]:
    """The metadata of the checkpoint in ``path`` if it is complete, else None
    (with the reason logged)."""
    try:
        with open(os.path.join(path, CHECKPOINT_JSON)) as f:
            meta = json.load(f)
        if _sha256(os.path.join(path, CHECKPOINT_PARAMS)) != meta["params_sha256"]:
            raise ValueError("%s does not match its digest" % CHECKPOINT_PARAMS)
        if meta.get("states", True):
            for rank in range(int(meta["num_workers"])):
                states = os.path.join(path, "states-rank%d.bin" % rank)
                with open(states + ".sha256") as f:
                    if _sha256(states) != f.read().strip():
                        raise ValueError("%s does not match its digest" % states)
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.warning("checkpoint %s is incomplete or damaged, skipped: %s", path, err)
        return None
    return meta


def newest_complete(directory: str) -> Optional[str]:
    """The newest complete checkpoint under ``directory`` (None when there is none)."""
    for path in _candidates(directory):
        if check_complete(path) is not None:
            return path
    return None


def _prune(directory: str, keep: int) -> None:
    complete = 0
    for path in _candidates(directory):
        if complete >= keep:
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.isfile(os.path.join(path, CHECKPOINT_JSON)):
            complete += 1


def read_checkpoint(directory: str, num_workers: int, algorithm: str) -> Dict[str, object]:
    """Find the newest complete checkpoint in ``directory`` and check it.

    Returns its metadata with ``path`` (its directory) added; raises UsageError when
    there is none or it is from another number of workers.
    """
    path = newest_complete(directory)
    if path is None:
        raise UsageError("--resume: no complete checkpoint in %s" % directory)
    meta = dict(check_complete(path), path=path)
    if meta.get("num_workers") != num_workers:
        raise UsageError("--resume: the checkpoint in %s is from %s workers, this job has %d"
                         % (path, meta.get("num_workers"), num_workers))
    if meta.get("algorithm") != algorithm:
        logger.warning("resuming a %s checkpoint with --algorithm %s",
                       meta.get("algorithm"), algorithm)
    return meta


def load_checkpoint(meta: Dict[str, object], net: gluon.Block,
                    trainer: gluon.Trainer, ctx: List[mx.Context], rank: int,
                    algorithm: str, step_batch: int) -> TrainState:
    """Load parameters and (collectively, on every worker) the trainer states of
    the checkpoint :func:`read_checkpoint` chose.

    Args:
        step_batch: the batch size later passed to ``trainer.step``.
    """
    path = str(meta["path"])
    net.load_parameters(os.path.join(path, CHECKPOINT_PARAMS), ctx=ctx)
    if states_supported(algorithm) and meta.get("states", True):
        states = os.path.join(path, "states-rank%d.bin" % rank)
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
