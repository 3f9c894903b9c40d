"""BIT-SGD: every push 2-bit quantized with MXNet's residual; pull and wait.

Two optional knobs isolate CP-SGD's mechanisms in ablations (both off by default):

- ``warmup_steps``: the first iterations are plain S-SGD (dense push, no residual
  touched), as CP-SGD's warm-up;
- ``correction_period``: after warm-up, iteration t pushes the full-precision
  gradient when ``(t + 1) % correction_period == 0`` (CP-SGD's k-step correction,
  its 1-based count; the residual is neither fed nor reset), still pulling and
  waiting: the correction without CP-SGD's local update.

``momentum_path='worker'`` moves momentum to the workers (see
:mod:`mxnet_cpsgd.stores.worker_momentum`).
"""
from .base import SYNC_SGD, Local, Policy, Pull, Push, StepPlan

_COMPRESSED_SYNC = StepPlan(Push.COMPRESSED, Pull.SYNC, Local.NONE)


class BITSGD(Policy):
    name = "bitsgd"
    # None: off (no warm-up, no correction), so plain BIT-SGD unless asked
    defaults = {"type": "2bit", "threshold": 0.5, "warmup_steps": None,
                "correction_period": None, "momentum_path": "server"}
    uses_compression = True

    def plan(self, step, key):
        if self.in_warmup(step):
            return SYNC_SGD
        k = self.config.correction_period
        if k and (step + 1) % k == 0:
            return SYNC_SGD
        return _COMPRESSED_SYNC
