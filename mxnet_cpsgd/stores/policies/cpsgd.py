"""CP-SGD (CD-SGD): OD-SGD's local update with 2-bit pushes and k-step correction.

After warm-up, iteration t pushes the full-precision gradient when
``(t + 1) % correction_period == 0`` and MXNet's 2-bit quantization of it
otherwise (the authors' 1-based counter: Tugraph/CD-SGD,
src/kvstore/kvstore_dist.h line 451); the residual is neither added to nor
reset by a correction push.
"""
from .base import SYNC_SGD, Local, Policy, Pull, Push, StepPlan

_CORRECTION = StepPlan(Push.DENSE, Pull.BACKGROUND, Local.FROM_GLOBAL)
_COMPRESSED = StepPlan(Push.COMPRESSED, Pull.BACKGROUND, Local.FROM_GLOBAL)


class CPSGD(Policy):
    name = "cpsgd"
    # local optimizer: CD-SGD's fit.py passes no local settings, so its local optimizer
    # is a stock 'sgd' (momentum 0, wd 0; python/mxnet/module/base_module.py line 417)
    defaults = {"type": "2bit", "threshold": 0.5, "correction_period": 5,
                "warmup_steps": 1000, "local_lr": None, "local_momentum": 0.0,
                "local_optimizer": "sgd", "local_wd": 0.0}
    uses_compression = True
    uses_local_optimizer = True

    def plan(self, step, key):
        if self.in_warmup(step):
            return SYNC_SGD
        if (step + 1) % self.config.correction_period == 0:
            return _CORRECTION
        return _COMPRESSED
