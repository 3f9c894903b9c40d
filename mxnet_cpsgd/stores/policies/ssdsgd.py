"""SSD-SGD: several steps delay with the GLU local rule.

After warm-up every iteration pushes the full-precision gradient (the servers
update every round) and takes a local step that never waits for the network:

    L_{t+1} = GLU(base_t, g_t),  GLU(w, g) = Opt_l(w, g) - lr_l * glu_weight * (w_s - w)

``w_s`` is a snapshot of the local weights (refreshed every ``sync_period``
local steps).  Counting n = t - warmup_steps, the base is the newest pulled
global weights when n % sync_period == 0 and the worker's own weights
otherwise; a background pull of W_{t+1} is issued when
(n + 1) % sync_period == 0.  Training never runs on W directly.  Rules and
defaults from main-520/SSD-SGD (docs/algorithms/ssdsgd.md).
"""
from .base import SYNC_SGD, Local, Policy, Pull, Push, StepPlan

_FROM_GLOBAL = StepPlan(Push.DENSE, Pull.NONE, Local.FROM_GLOBAL)
_FROM_GLOBAL_PULL = StepPlan(Push.DENSE, Pull.BACKGROUND, Local.FROM_GLOBAL)
_FROM_LOCAL = StepPlan(Push.DENSE, Pull.NONE, Local.FROM_LOCAL)
_FROM_LOCAL_PULL = StepPlan(Push.DENSE, Pull.BACKGROUND, Local.FROM_LOCAL)


class SSDSGD(Policy):
    name = "ssdsgd"
    defaults = {"warmup_steps": 499, "sync_period": 5, "glu_weight": 0.5,
                "local_lr": None, "local_momentum": 0.0, "local_optimizer": "sgd",
                "local_wd": None}
    uses_local_optimizer = True

    def local_settings(self, num_workers):
        settings = super().local_settings(num_workers)
        settings.update(glu_weight=self.config.glu_weight,
                        snapshot_period=self.config.sync_period)
        return settings

    def plan(self, step, key):
        if self.in_warmup(step):
            return SYNC_SGD
        n = step - (self.config.warmup_steps or 0)
        k = self.config.sync_period
        pull = (n + 1) % k == 0
        if n % k == 0:
            return _FROM_GLOBAL_PULL if pull else _FROM_GLOBAL
        return _FROM_LOCAL_PULL if pull else _FROM_LOCAL
