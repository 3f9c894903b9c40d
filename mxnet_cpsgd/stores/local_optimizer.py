"""Opt_l: the optimizer a worker runs on its own weights.

The authors' workers (CD-SGD, OD-SGD, SSD-SGD; docs/algorithms/cpsgd.md,
"Sources") run a second optimizer object of its own, created from its own
name and settings (local lr, momentum, weight decay), with the same
``rescale_grad`` as the servers' optimizer.  That is what this class does for
``odsgd``, ``cpsgd`` and ``ssdsgd``:

* type: ``local_optimizer`` (any MXNet optimizer name, default ``'sgd'``);
* ``rescale_grad``: the Trainer's (``1/B`` after ``trainer.step(B)``);
* learning rate: ``ratio`` x the Trainer's learning rate at the same global
  iteration, where ``ratio`` is ``local_lr / lr`` when ``local_lr`` is set and
  ``num_workers`` otherwise.  The Trainer's schedule is evaluated at the
  iteration count of the store (``t + 1`` for iteration ``t``, the update count
  the servers use for round ``t``), so the local schedule never lags the
  global one (a scheduler of its own would count local updates only);
* momentum and weight decay: as given (the policies pass the defaults;
  ``cpsgd``'s momentum defaults to the Trainer's).

``localsgd`` (not one of the authors' algorithms) keeps a copy of the Trainer's
optimizer (same type, momentum, weight decay) with the gradient scaled by
``num_workers`` and ratio 1.

An optional GLU term (SSD-SGD's local rule) is added to every step:
``w <- Opt_l(w, g) - lr * glu_weight * (w_s - w)``, ``w`` the weights the step
starts from, ``lr`` the local learning rate of the parameter, ``w_s`` a
snapshot of the parameter's local weights taken after its local steps number
0, ``snapshot_period``, ``2 * snapshot_period``, ... (before the first step,
``w_s`` is the weights that step starts from).
"""
import pickle

import mxnet as mx
import numpy as np

from .config import ConfigError


#: ``momentum`` value meaning "the Trainer's optimizer's momentum (0 if it has none)"
TRAINER_MOMENTUM = "trainer"


class LocalOptimizer:
    """A worker-side optimizer with its own state.

    Args:
        optimizer: the Trainer's optimizer (read again at every step for
            ``rescale_grad``, its learning rate and schedule).
        num_workers: number of workers in the job.
        name: MXNet optimizer name of Opt_l; ``None`` copies the Trainer's
            optimizer (type and hyperparameters).
        local_lr: Opt_l's learning rate at the start (sets the ratio to the
            Trainer's learning rate).
        momentum: Opt_l's momentum (``None``: the optimizer's own default, or
            the Trainer's for a copy; :data:`TRAINER_MOMENTUM`: the Trainer's
            optimizer's momentum, 0 if it has none).
        wd: Opt_l's weight decay (``None``: the Trainer's).
        default_ratio: local lr / global lr when ``local_lr`` is not set.
        grad_scale: extra factor on the Trainer's ``rescale_grad``.
        glu_weight: coefficient of SSD-SGD's GLU snapshot term (0: none).
        snapshot_period: local steps between refreshes of the GLU snapshot.
    """

    def __init__(self, optimizer, num_workers, name=None, local_lr=None, momentum=None,
                 wd=None, default_ratio=1.0, grad_scale=1.0, glu_weight=0.0,
                 snapshot_period=1):
        self._source = optimizer
        self._num_workers = num_workers
        self._grad_scale = float(grad_scale)
        base_lr = float(optimizer.lr)
        self._ratio = float(default_ratio) if local_lr is None else float(local_lr) / base_lr
        # a private copy of the Trainer's schedule, evaluated at the global iteration
        self._schedule = (pickle.loads(pickle.dumps(optimizer.lr_scheduler))
                          if optimizer.lr_scheduler is not None else None)
        if name is None:
            # the pickle round trip copies hyperparameters and drops param_dict
            local = pickle.loads(pickle.dumps(optimizer))
        else:
            local = mx.optimizer.create(name, learning_rate=base_lr,
                                        multi_precision=optimizer.multi_precision)
        local.param_dict = optimizer.param_dict
        if name is not None:
            # the Module API's optimizers give multipliers by index or name, not param_dict
            local.idx2name = dict(optimizer.idx2name)
            local.lr_mult = dict(optimizer.lr_mult)
            local.wd_mult = dict(optimizer.wd_mult)
        local.lr_scheduler = None
        if wd is not None:
            local.wd = float(wd)
        elif name is not None:
            local.wd = optimizer.wd
        if momentum == TRAINER_MOMENTUM:
            momentum = float(getattr(optimizer, "momentum", 0.0) or 0.0)
            if not hasattr(local, "momentum"):
                momentum = None  # a local optimizer without momentum inherits none
        if momentum is not None:
            if not hasattr(local, "momentum"):
                if momentum != 0:
                    raise ConfigError("local_momentum is %r but the local optimizer %s has "
                                      "no momentum" % (momentum, type(local).__name__))
            else:
                local.momentum = momentum
        self.optimizer = local
        self._updater = mx.optimizer.get_updater(local)
        self._glu_weight = float(glu_weight or 0.0)
        self._snapshot_period = int(snapshot_period)
        self._snapshots = {}   # index -> w_s
        self._glu_steps = {}   # index -> local steps taken with the GLU term

    @property
    def ratio(self):
        """Local learning rate / the Trainer's learning rate."""
        return self._ratio

    def global_lr(self, iteration):
        """The Trainer's learning rate at (0-based) iteration ``iteration``."""
        if self._schedule is not None:
            return float(self._schedule(iteration + 1))
        return float(self._source.lr)

    def step(self, index, weight, grad, iteration=0):
        """weight <- Opt_l(weight, grad) (+ GLU term), in place (asynchronous engine ops).

        Args:
            index: a parameter index, or a list of them.
            weight: the weights (or a list, one per index), updated in place.
            grad: the summed gradient (or a list, one per index).
            iteration: the global iteration (0-based) the step belongs to; it
                picks the learning rate from the Trainer's schedule.

        With lists, MXNet's updater groups the parameters into multi-tensor
        updates (``optimizer.aggregate_num`` at a time).
        """
        opt = self.optimizer
        opt.rescale_grad = self._source.rescale_grad * self._grad_scale
        opt.lr = self._ratio * self.global_lr(iteration)
        if not self._glu_weight:
            self._updater(index, grad, weight)
            return
        indices = index if isinstance(index, (list, tuple)) else [index]
        weights = weight if isinstance(weight, (list, tuple)) else [weight]
        lrs = opt._get_lrs(indices)
        terms = []
        for i, w, lr in zip(indices, weights, lrs):
            snap = self._snapshots.get(i)
            if snap is None:
                snap = self._snapshots[i] = w.copy()
                self._glu_steps[i] = 0
            elif snap.context != w.context:  # restored by set_states
                snap = self._snapshots[i] = snap.as_in_context(w.context)
            terms.append((snap - w) * (lr * self._glu_weight))
        self._updater(index, grad, weight)
        for i, w, term in zip(indices, weights, terms):
            w -= term
            if self._glu_steps[i] % self._snapshot_period == 0:
                w.copyto(self._snapshots[i])
            self._glu_steps[i] += 1

    def get_states(self):
        """Picklable bytes of the local optimizer's state and update counters."""
        return pickle.dumps({
            "states": self._updater.get_states(dump_optimizer=False),
            "update_counts": {d: dict(c) for d, c in
                              self.optimizer._all_index_update_counts.items()},
            "num_update": self.optimizer.num_update,
            "glu": {i: (s.asnumpy(), self._glu_steps[i]) for i, s in self._snapshots.items()},
        })

    def set_states(self, blob):
        saved = pickle.loads(blob)
        self._updater.set_states(saved["states"])
        counts = {d: dict(c) for d, c in saved["update_counts"].items()}
        self.optimizer._all_index_update_counts = counts
        self.optimizer._index_update_count = counts.setdefault(0, {})
        self.optimizer.num_update = saved["num_update"]
        self._snapshots = {i: mx.nd.array(s, dtype=np.asarray(s).dtype)
                           for i, (s, _) in saved.get("glu", {}).items()}
        self._glu_steps = {i: n for i, (_, n) in saved.get("glu", {}).items()}
