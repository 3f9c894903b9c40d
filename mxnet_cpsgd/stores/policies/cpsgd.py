"""CP-SGD (CD-SGD): OD-SGD's local update with 2-bit pushes and k-step correction.

After warm-up, iteration t pushes the full-precision gradient when
``t % correction_period == 0`` and MXNet's 2-bit quantization of it otherwise;
the residual is neither added to nor reset by a correction push.
"""
from .base import SYNC_SGD, Local, Policy, Pull, Push, StepPlan

_CORRECTION = StepPlan(Push.DENSE, Pull.BACKGROUND, Local.FROM_GLOBAL)
_COMPRESSED = StepPlan(Push.COMPRESSED, Pull.BACKGROUND, Local.FROM_GLOBAL)


class CPSGD(Policy):
    name = "cpsgd"
    defaults = {"type": "2bit", "threshold": 0.5, "correction_period": 5,
                "warmup_steps": 1000, "local_lr": None, "local_momentum": None}
    uses_compression = True
    uses_local_optimizer = True

    def plan(self, step):
        if self.in_warmup(step):
            return SYNC_SGD
        if step % self.config.correction_period == 0:
            return _CORRECTION
        return _COMPRESSED
