"""What the training loop adds for time-to-accuracy measurements: the emulated
accelerator's padding (``--emulate-compute``, :mod:`.emulated_compute`), a training
clock that leaves validation out, and validation every N iterations
(``--val-every-iters``) logged with that clock.

The training clock (``train_clock``, seconds) starts when the first training
iteration of this process starts and runs until the last one ends, *without* the
time spent validating (every N iterations and at the end of every epoch); it
includes everything else (data loading, the exchange, checkpoints).  Before a
validation the worker waits until the iteration's updated weights are there, so a
point's clock covers its iteration completely.  With ``--time-scale D`` it is the
dilated time: divide by D for the emulated cluster's.  A resumed run goes on from
the clock of the last point in its validation log.

The validation log: one JSON line per validation (interval and end of epoch), in
``<log-json stem>-val<ext>`` (rank r > 0: ``.rank<r>`` before the extension), with
``iteration``, ``epoch``, ``kind`` (``interval`` or ``epoch``), ``val_acc``,
``val_loss``, ``val_samples``, ``train_clock``, ``time_scale``,
``emulate_compute_ms`` and ``compute_overrun`` (seconds by which the real compute
overran the padding, summed so far).
"""
import argparse
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mxnet as mx
from mxnet import gluon

from .emulated_compute import padded_compute
from .logs import logger, rank_path

#: what evaluate() returns: (accuracy, mean loss, samples)
Evaluation = Tuple[float, float, int]


def val_log_path(log_json: Optional[str], rank: int) -> Optional[str]:
    """The validation log of ``--log-json PATH`` (None without it)."""
    if not log_json:
        return None
    stem, ext = os.path.splitext(log_json)
    return rank_path("%s-val%s" % (stem, ext or ".json"), rank)


def _last_clock(path: Optional[str]) -> float:
    """The ``train_clock`` of the last readable line of ``path`` (0 if none)."""
    if not path or not os.path.exists(path):
        return 0.0
    clock = 0.0
    with open(path) as f:
        for line in f:
            try:
                clock = float(json.loads(line)["train_clock"])
            except (ValueError, KeyError, TypeError):
                continue
    return clock


class TimedTraining:
    """The loop's hooks for ``--emulate-compute``, ``--time-scale`` and
    ``--val-every-iters``; with none of them set, every hook does nothing but keep
    the clock.

    Args:
        args: parsed command line.
        net: the trained model.
        params: its trainable parameters.
        ctx: this worker's devices.
        model_name: the model's name.
        classes: output classes.
        sample_shape: one sample's shape.
        iters_per_epoch: training iterations per epoch.
        rank: this worker's rank.
        num_workers: workers of the job.
        resume: the run goes on from a checkpoint (append to the log, continue the clock).
    """

    def __init__(self, args: argparse.Namespace, net: gluon.Block,
                 params: Sequence[gluon.Parameter], ctx: List[mx.Context], model_name: str,
                 classes: int, sample_shape: Sequence[int], iters_per_epoch: int,
                 rank: int, num_workers: int, resume: bool = False):
        self.every = getattr(args, "val_every_iters", None) or 0
        self.time_scale = float(getattr(args, "time_scale", 1.0) or 1.0)
        self.emulate_ms = getattr(args, "emulate_compute", None) or None
        self.padding = padded_compute(args, net, model_name, classes, sample_shape, ctx)
        self.params = list(params)
        self.iters_per_epoch = iters_per_epoch
        self.rank, self.num_workers = rank, num_workers
        self.path = val_log_path(getattr(args, "log_json", None), rank)
        if self.path and (self.every or self.padding is not None):
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            if not resume and os.path.exists(self.path):
                os.remove(self.path)
        else:
            self.path = None
        self._offset = _last_clock(self.path) if resume else 0.0
        self._started: Optional[float] = None
        self.validation_seconds = 0.0  # time spent validating, excluded from the clock
        self._last: Optional[Tuple[int, Evaluation]] = None

    # -- the clock --------------------------------------------------------------
    def clock(self) -> float:
        """Seconds of training so far (validation excluded; dilated with D > 1)."""
        if self._started is None:
            return self._offset
        return self._offset + time.time() - self._started - self.validation_seconds

    # -- per iteration ----------------------------------------------------------
    def before_forward(self) -> None:
        """At the start of an iteration (starts the clock at the first one)."""
        if self._started is None:
            self._started = time.time()
        if self.padding is not None:
            self.padding.forward()

    def after_backward(self) -> None:
        """Right after ``autograd.backward``."""
        if self.padding is not None:
            self.padding.backward()

    def after_iteration(self, iteration: int, epoch: int, epoch_iteration: int,
                        evaluate: Callable[[], Evaluation]) -> None:
        """After ``trainer.step``: validate every ``--val-every-iters`` iterations
        (not at the end of an epoch, where the loop validates anyway)."""
        if (self.every and iteration % self.every == 0
                and epoch_iteration != self.iters_per_epoch):
            self._validate(iteration, epoch, "interval", evaluate)

    def epoch_validation(self, iteration: int, epoch: int,
                         evaluate: Callable[[], Evaluation]) -> Evaluation:
        """The end-of-epoch validation, timed out of the clock and logged (at an
        iteration just validated, that result again)."""
        if self._last is not None and self._last[0] == iteration:
            return self._last[1]
        return self._validate(iteration, epoch, "epoch", evaluate)

    def _validate(self, iteration: int, epoch: int, kind: str,
                  evaluate: Callable[[], Evaluation]) -> Evaluation:
        for p in self.params:  # this iteration's update is part of its time
            for w in p.list_data():
                w.wait_to_read()
        clock = self.clock()
        t0 = time.time()
        result = evaluate()
        self.validation_seconds += time.time() - t0
        self._last = (iteration, result)
        record = {"iteration": iteration, "epoch": epoch, "kind": kind,
                  "rank": self.rank, "num_workers": self.num_workers,
                  "val_acc": result[0], "val_loss": result[1], "val_samples": result[2],
                  "train_clock": round(clock, 4), "time_scale": self.time_scale,
                  "emulate_compute_ms": self.emulate_ms,
                  "compute_overrun": round(self.overrun(), 4)}
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if kind == "interval":
            logger.info("[Iteration %d] val=%.4f train_clock=%.2fs%s", iteration, result[0],
                        clock, " (dilated x%g)" % self.time_scale
                        if self.time_scale != 1 else "")
        return result

    def overrun(self) -> float:
        """Seconds the real compute overran the padding (0 without padding)."""
        return self.padding.overrun_seconds if self.padding is not None else 0.0

    def epoch_fields(self) -> Dict[str, object]:
        """Fields for the epoch record when a timing flag is set (else none)."""
        if not (self.every or self.padding is not None):
            return {}
        return {"train_clock": round(self.clock(), 4), "time_scale": self.time_scale,
                "emulate_compute_ms": self.emulate_ms,
                "compute_overrun": round(self.overrun(), 4)}
