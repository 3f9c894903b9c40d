"""SSD-SGD: several steps delay with the GLU local rule.

After warm-up every iteration pushes the full-precision gradient (the servers
update every round).  On iterations with ``t % sync_period == 0`` the worker
pulls the global weights and trains on them (W_sync <- W, L <- W); on the others
it takes a local step without waiting:

    L <- Opt_l(L, g) + glu_weight * (W_sync - L_before)

The SSD-SGD paper's exact GLU formula could not be recovered; this is the rule
read from the authors' code (docs/algorithms/ssdsgd.md).
"""
from .base import SYNC_SGD, Local, Policy, Pull, Push, StepPlan

_LOCAL = StepPlan(Push.DENSE, Pull.NONE, Local.FROM_LOCAL)


class SSDSGD(Policy):
    name = "ssdsgd"
    defaults = {"warmup_steps": 500, "sync_period": 5, "glu_weight": 0.5,
                "local_lr": None, "local_momentum": None}
    uses_local_optimizer = True

    @property
    def glu_weight(self):
        return self.config.glu_weight

    def plan(self, step):
        if self.in_warmup(step) or step % self.config.sync_period == 0:
            return SYNC_SGD
        return _LOCAL
