"""Local SGD: local steps, model averaging every ``sync_period`` iterations.

Every iteration the worker steps its own model, L <- Opt_l(L, g).  On
iterations with ``(t + 1) % sync_period == 0`` (after the local step) it
pushes W_sync - L; the servers, running plain SGD with learning rate 1 and
rescale 1/num_workers, compute W_sync - mean_i(W_sync - L_i) = mean_i(L_i),
which every worker pulls and continues from.  There is no warm-up: the servers
only ever average models.
"""
import mxnet as mx

from .base import Local, Payload, Policy, Pull, Push, StepPlan

_LOCAL_ONLY = StepPlan(Push.NONE, Pull.NONE, Local.FROM_LOCAL)
_AVERAGE = StepPlan(Push.DENSE, Pull.SYNC, Local.FROM_LOCAL, Payload.MODEL_DELTA)


class LocalSGD(Policy):
    name = "localsgd"
    defaults = {"sync_period": 5, "local_lr": None, "local_momentum": None}
    uses_local_optimizer = True

    def plan(self, step, key):
        if (step + 1) % self.config.sync_period == 0:
            return _AVERAGE
        return _LOCAL_ONLY

    def local_settings(self, num_workers):
        # the Trainer's optimizer (type, momentum, wd) with the gradient scaled by M:
        # a local step moves as far as a global step would
        return {"name": None, "local_lr": self.config.local_lr,
                "momentum": self.config.local_momentum, "wd": None,
                "default_ratio": 1.0, "grad_scale": num_workers}

    def server_optimizer(self, optimizer, num_workers):
        return mx.optimizer.SGD(learning_rate=1.0, momentum=0.0, wd=0.0,
                                rescale_grad=1.0 / num_workers)
