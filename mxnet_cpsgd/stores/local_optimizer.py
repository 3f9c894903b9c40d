"""Opt_l: the optimizer a worker runs on its own weights.

By default it is the Trainer's optimizer (same type and hyperparameters) with
its own state, applied with the scale of the servers' step: the worker's own
gradient times ``num_workers`` times the Trainer's ``rescale_grad``.  A local
step therefore moves the weights as far as the global step would if every
worker had computed the same gradient.
"""
import pickle

import mxnet as mx

from .config import ConfigError


class LocalOptimizer:
    """A worker-side copy of the Trainer's optimizer with its own state.

    Args:
        optimizer: the Trainer's optimizer (read again at every step for
            ``rescale_grad`` and, unless overridden, the learning rate).
        num_workers: number of workers in the job.
        local_lr: fixed learning rate for local steps (disables the scheduler).
        local_momentum: momentum for local steps (optimizers with ``momentum``).
    """

    def __init__(self, optimizer, num_workers, local_lr=None, local_momentum=None):
        self._source = optimizer
        self._num_workers = num_workers
        # the pickle round trip copies hyperparameters and drops param_dict
        local = pickle.loads(pickle.dumps(optimizer))
        local.param_dict = optimizer.param_dict
        self._follow_lr = local_lr is None and optimizer.lr_scheduler is None
        if local_lr is not None:
            local.lr_scheduler = None
            local.lr = local_lr
        if local_momentum is not None:
            if not hasattr(local, "momentum"):
                raise ConfigError("local_momentum is set but optimizer %s has no momentum"
                                  % type(optimizer).__name__)
            local.momentum = local_momentum
        self.optimizer = local
        self._updater = mx.optimizer.get_updater(local)

    def step(self, index, weight, grad):
        """weight <- Opt_l(weight, grad), in place (asynchronous engine ops).

        Args:
            index: a parameter index, or a list of them.
            weight: the weights (or a list, one per index), updated in place.
            grad: the summed gradient (or a list, one per index).

        With lists, MXNet's updater groups the parameters into multi-tensor
        updates (``optimizer.aggregate_num`` at a time).
        """
        self.optimizer.rescale_grad = self._source.rescale_grad * self._num_workers
        if self._follow_lr:
            self.optimizer.lr = self._source.lr
        self._updater(index, grad, weight)

    def get_states(self):
        """Picklable bytes of the local optimizer's state and update counters."""
        return pickle.dumps({
            "states": self._updater.get_states(dump_optimizer=False),
            "update_counts": {d: dict(c) for d, c in
                              self.optimizer._all_index_update_counts.items()},
            "num_update": self.optimizer.num_update,
        })

    def set_states(self, blob):
        saved = pickle.loads(blob)
        self._updater.set_states(saved["states"])
        counts = {d: dict(c) for d, c in saved["update_counts"].items()}
        self.optimizer._all_index_update_counts = counts
        self.optimizer._index_update_count = counts.setdefault(0, {})
        self.optimizer.num_update = saved["num_update"]
