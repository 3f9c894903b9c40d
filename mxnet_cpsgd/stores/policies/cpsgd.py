"""CP-SGD (CD-SGD): OD-SGD's local update with 2-bit pushes and k-step correction.

After warm-up, iteration t pushes the full-precision gradient when
``(t + 1) % correction_period == 0`` and MXNet's 2-bit quantization of it
otherwise (the authors' 1-based counter: Tugraph/CD-SGD,
src/kvstore/kvstore_dist.h line 451); the residual is neither added to nor
reset by a correction push.

``correction_schedule='staggered'`` keeps every parameter's period but gives
each its own phase p (:func:`staggered_phases`): parameter ``key`` is corrected
when ``(t + 1 - p) % correction_period == 0``, so that each iteration carries
about 1/correction_period of the model's bytes at full precision instead of
all of them every correction_period-th iteration.  ``'aligned'`` (default) is
the authors' rule (every phase 0).

``correction_delay=1`` gives the correction round two compute periods: the
correction step pulls nothing and the step after it starts its local update
from the worker's own weights.  ``correction_delay=2`` also lets the compressed
round before the correction go unwaited for: the step before the correction
pulls nothing and the correction step builds on the own weights too
(docs/algorithms/cpsgd.md).

``momentum_path='worker'`` moves momentum to the workers, ``local_input`` picks
what the local step reads then (see :mod:`mxnet_cpsgd.stores.worker_momentum`).

Unset, ``correction_delay`` is 2 from :data:`DELAY_FROM_WORKERS` workers on (where the
authors' rule waits for its correction round and 2 was measured faster and, at 4 and 8
workers, as accurate as the authors' rule), 0 below (as fast either way), and 0
wherever the other knobs refuse a delay.

The local optimizer's momentum defaults to the Trainer's (``local_momentum``
unset): the setting the fourth reproduction found as accurate as S-SGD, where
the authors' momentum 0 (``local_momentum=0``) ended below it.  With momentum on
the workers the local step already reads u, so its own momentum stays 0.
"""
from ..config import correction_delay_clashes
from ..local_optimizer import TRAINER_MOMENTUM
from .base import SYNC_SGD, Local, Policy, Pull, Push, StepPlan

_CORRECTION = StepPlan(Push.DENSE, Pull.BACKGROUND, Local.FROM_GLOBAL)
_COMPRESSED = StepPlan(Push.COMPRESSED, Pull.BACKGROUND, Local.FROM_GLOBAL)
# correction_delay >= 1: the correction's weights are never a base, so nothing pulls them;
# the step after it builds on the worker's own weights
_CORRECTION_UNPULLED = StepPlan(Push.DENSE, Pull.NONE, Local.FROM_GLOBAL)
_AFTER_CORRECTION = StepPlan(Push.COMPRESSED, Pull.BACKGROUND, Local.FROM_LOCAL)
# correction_delay=2: the weights of the round before the correction are never a base
# either; the correction step builds on the own weights
_BEFORE_CORRECTION_UNPULLED = StepPlan(Push.COMPRESSED, Pull.NONE, Local.FROM_GLOBAL)
_CORRECTION_FROM_LOCAL = StepPlan(Push.DENSE, Pull.NONE, Local.FROM_LOCAL)


#: from this many workers on an unset correction_delay is 2
DELAY_FROM_WORKERS = 8


def default_correction_delay(config, num_workers):
    """The correction_delay a job runs: the knob's value, or unset the worker count's."""
    if config.correction_delay is not None:
        return config.correction_delay
    # where the other knobs would refuse 2 (as a setting), unset means 0
    if num_workers >= DELAY_FROM_WORKERS and not correction_delay_clashes(vars(config), 2):
        return 2
    return 0


def staggered_phases(sizes, period):
    """Each key's correction phase in 0..period-1, balancing bytes per phase.

    Greedy: keys by size, largest first (ties: smaller key first), each to the
    phase with the fewest elements so far (ties: the lowest phase).  Depends
    only on ``sizes``, so every worker derives the same phases.

    Args:
        sizes: key -> number of elements.
        period: the correction period k >= 1.

    Returns:
        key -> phase.
    """
    load = [0] * period
    phases = {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        phase = min(range(period), key=lambda p: (load[p], p))
        phases[key] = phase
        load[phase] += sizes[key]
    return phases


class CPSGD(Policy):
    name = "cpsgd"
    # local optimizer: a stock 'sgd' with wd 0, as in CD-SGD's fit.py (which passes no
    # local settings: python/mxnet/module/base_module.py line 417), except its momentum:
    # unset means the Trainer's (the authors' 0 measured below S-SGD; local_momentum=0
    # restores it)
    defaults = {"type": "2bit", "threshold": 0.5, "correction_period": 5,
                "correction_schedule": "aligned", "correction_delay": None,
                "warmup_steps": 1000, "local_lr": None, "local_momentum": None,
                "local_optimizer": "sgd", "local_wd": 0.0, "momentum_path": "server",
                "local_input": None}
    uses_compression = True
    uses_local_optimizer = True

    def __init__(self, config):
        super().__init__(config)
        self._phases = {}  # key -> phase; empty: every key at phase 0 (aligned)
        self.correction_delay = config.correction_delay or 0  # set_num_workers: unset

    def set_num_workers(self, num_workers):
        self.correction_delay = default_correction_delay(self.config, num_workers)

    def set_keys(self, sizes):
        if self.config.correction_schedule == "staggered":
            self._phases = staggered_phases(sizes, self.config.correction_period)

    def local_settings(self, num_workers):
        settings = super().local_settings(num_workers)
        if settings["momentum"] is None:
            # unset: the Trainer's momentum, unless the workers' momentum u is what the
            # local step reads already
            settings["momentum"] = (0.0 if self.config.momentum_path == "worker"
                                    else TRAINER_MOMENTUM)
        return settings

    def plan(self, step, key):
        if self.in_warmup(step):
            return SYNC_SGD
        phase = self._phases.get(key, 0)
        period, delay = self.config.correction_period, self.correction_delay
        if (step + 1 - phase) % period == 0:
            if not delay:
                return _CORRECTION
            # after a warm-up step the worker's weights are the synchronous pull's
            own = delay >= 2 and not self.in_warmup(step - 1)
            return _CORRECTION_FROM_LOCAL if own else _CORRECTION_UNPULLED
        if delay and (step - phase) % period == 0 and not self.in_warmup(step - 1):
            return _AFTER_CORRECTION
        if delay >= 2 and (step + 2 - phase) % period == 0:
            return _BEFORE_CORRECTION_UNPULLED
        return _COMPRESSED
