"""OD-SGD: one-step delay.

After warm-up every push is full precision; the worker's next weights are
Opt_l(newest global weights, own gradient) and the pull runs in the background.
Defaults from CynthiaProtector/OD-SGD (docs/algorithms/odsgd.md): 200 warm-up
iterations, local optimizer with momentum 0 and the Trainer's weight decay.
"""
from .base import SYNC_SGD, Local, Policy, Pull, Push, StepPlan

_ONE_STEP_DELAY = StepPlan(Push.DENSE, Pull.BACKGROUND, Local.FROM_GLOBAL)


class ODSGD(Policy):
    name = "odsgd"
    defaults = {"warmup_steps": 200, "local_lr": None, "local_momentum": 0.0,
                "local_optimizer": "sgd", "local_wd": None}
    uses_local_optimizer = True

    def plan(self, step, key):
        return SYNC_SGD if self.in_warmup(step) else _ONE_STEP_DELAY
