"""BIT-SGD: every push 2-bit quantized with MXNet's residual; pull and wait."""
from .base import Local, Policy, Pull, Push, StepPlan

_COMPRESSED_SYNC = StepPlan(Push.COMPRESSED, Pull.SYNC, Local.NONE)


class BITSGD(Policy):
    name = "bitsgd"
    defaults = {"type": "2bit", "threshold": 0.5}
    uses_compression = True

    def plan(self, step, key):
        return _COMPRESSED_SYNC
