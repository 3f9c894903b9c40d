"""Momentum on the workers (``momentum_path='worker'``) for the compressing stores.

With MXNet's layout the servers run momentum SGD and only the push is
compressed, so every quantization error enters the servers' momentum buffer and
is applied about 1/(1 - beta) times.  The remedy of the compression literature
(Deep Gradient Compression's momentum correction, blockwise momentum SGD with
error feedback) moves momentum to the workers.  Here, for ``bitsgd`` and
``cpsgd``, every worker i keeps per parameter

    u_t^i = beta * (lr_{t-1} / lr_t) * u_{t-1}^i + g_t^i + wd * W_t / (r * M)

and pushes u_t^i instead of g_t^i (2-bit with MXNet's residual, or dense on
warm-up and correction rounds); the servers run the Trainer's optimizer with
momentum 0 and weight decay 0:  W_{t+1} = W_t - lr_t * r * sum_i u_t^i.

* beta, wd: the Trainer's SGD momentum and weight decay (times the parameter's
  ``wd_mult``); r its ``rescale_grad``; M the number of workers; W_t the
  newest global weights the worker holds (with bitsgd and cpsgd: exactly the
  servers' weights before round t).
* Weight decay enters u on the workers, split evenly over them, so that it
  goes through momentum as in MXNet's SGD (whose momentum state accumulates
  ``lr * (r * g + wd * w)``); with compression it is quantized with the rest.
* lr_t is the servers' learning rate of round t (the Trainer's schedule at
  update count t + 1).  The factor lr_{t-1} / lr_t keeps u equal to MXNet's
  momentum state divided by -lr_t: at a schedule step, earlier momentum is
  applied at the rate it was accumulated with, as MXNet's SGD does.  So with
  every push dense, sum_i u_t^i is exactly the servers' momentum of S-SGD and
  the weights are S-SGD with momentum, with or without a schedule (as long as
  lr_t > 0; a round with lr 0 keeps u unscaled).  In float32, up to rounding.
  After a decay by a factor f, u is 1/f times larger in gradient units for
  about 1/(1 - beta) rounds; through the 2-bit quantizer the excess waits in
  the residual.
* CP-SGD's local step reads u by default (``local_input='momentum'``):
  L = Opt_l(W_t, u^i) with lr ratio M is the worker's own estimate of
  W_{t+1} = W_t - lr * r * sum_j u^j, as the authors' L = Opt_l(W_t, g^i)
  estimates a momentum-free server step.  ``local_input='gradient'`` reads g.

Only MXNet's ``SGD`` (the Trainer's ``'sgd'``) can be split this way; other
optimizers are refused.  ``save_optimizer_states`` keeps u.

``cpsgd_<compressor>`` (all-reduce) does the same with the compressor and its
error memory in place of the 2-bit quantizer, and its Opt_g (run on every
worker) in place of the servers' optimizer.
"""
import copy

import mxnet as mx
import numpy as np

from .config import ConfigError
from .policies.base import Push

PATHS = ("server", "worker")


def for_config(config):
    """The :class:`WorkerMomentum` of a resolved config, or None (servers' momentum)."""
    if getattr(config, "momentum_path", None) != "worker":
        return None
    return WorkerMomentum(config.local_input or "momentum")


class WorkerMomentum:
    """u per parameter on one worker, and what the servers run instead of momentum.

    Args:
        local_input: what the local step reads, ``'momentum'`` (u) or ``'gradient'`` (g).
    """

    def __init__(self, local_input="momentum"):
        self.local_input = local_input
        self._beta = 0.0
        self._wd = 0.0
        self._optimizer = None
        self._num_workers = 1
        self._schedule = None
        self._lr_memo = {}
        self._u = {}        # key -> NDArray u
        self._grads = {}    # key -> copy of g for the local step (local_input='gradient')
        self._loaded = {}   # key -> numpy u from a states file, not yet on its device

    def adopt(self, optimizer, num_workers, server_opt):
        """Read beta and wd from the Trainer's ``optimizer``; take them off ``server_opt``."""
        if type(optimizer) is not mx.optimizer.SGD:
            raise ConfigError(
                "momentum_path='worker' needs the Trainer's optimizer to be 'sgd' (MXNet's "
                "SGD, whose momentum and weight decay the workers take over); got %s"
                % type(optimizer).__name__)
        if optimizer.clip_gradient is not None:
            raise ConfigError("momentum_path='worker' does not support clip_gradient: the "
                              "servers would clip the sum of the workers' momenta")
        self._optimizer = optimizer
        self._num_workers = int(num_workers)
        self._beta = float(optimizer.momentum or 0.0)
        self._wd = float(optimizer.wd or 0.0)
        self._schedule = copy.deepcopy(optimizer.lr_scheduler)
        self._lr_memo = {}
        server_opt.momentum = 0.0
        server_opt.wd = 0.0

    # ------------------------------------------------------------------ step
    def _lr(self, rounds):
        """The servers' learning rate of round ``rounds`` (0-based)."""
        if self._schedule is None:
            return float(self._optimizer.lr)
        lr = self._lr_memo.get(rounds)
        if lr is None:
            # a fresh copy per value: MXNet's schedulers only ever move forward
            lr = float(copy.deepcopy(self._schedule)(rounds + 1))
            if len(self._lr_memo) > 64:
                self._lr_memo = {}
            self._lr_memo[rounds] = lr
        return lr

    def accumulate(self, items, sources, rounds):
        """The parameter-server store's step: :meth:`update` every pushing item.

        Called with the summed gradients in ``sources`` (each item's ``send``),
        before the local updates and pushes are issued.  Afterwards ``send`` holds
        u (what is pushed) and ``sources`` what the local step reads.
        """
        for it in items:
            if it.plan.push is not Push.NONE:
                sources[it.key] = self.update(it.key, sources[it.key], it.param.glob,
                                              rounds[it.key], it.param.send)

    def update(self, key, grad, glob, n, send):
        """u <- beta * ratio * u + grad + wd-term for round ``n`` of ``key``; ``send`` <- u.

        Args:
            grad: the worker's summed gradient (may be ``send`` itself).
            glob: the global weights W_n the worker holds.
            n: the round (0-based) whose learning rate applies.
            send: receives u (what is pushed or compressed).

        Returns:
            What the local step reads: ``send`` (u), or a copy of ``grad``.
        """
        u = self._u.get(key)
        if u is None:
            u = self._u[key] = mx.nd.zeros(grad.shape, ctx=grad.context, dtype=grad.dtype)
            if key in self._loaded:
                mx.nd.array(self._loaded.pop(key), ctx=grad.context,
                            dtype=grad.dtype).copyto(u)
        factor = self._beta
        if n > 0 and factor:
            now = self._lr(n)
            if now > 0:
                factor *= self._lr(n - 1) / now
        if factor:
            u *= factor
        else:
            u[:] = 0
        u += grad
        wd = self._wd * self._wd_mult(key)
        if wd:
            u += glob * (wd / (self._optimizer.rescale_grad * self._num_workers))
        local = send
        if self.local_input == "gradient":
            local = self._grads.get(key)
            if local is None:
                local = self._grads[key] = mx.nd.zeros_like(grad)
            grad.copyto(local)
        u.copyto(send)
        return local

    def follow(self, server_opt):
        """Give ``server_opt`` (a copy run on the workers) the Trainer's current
        ``rescale_grad`` (and learning rate, without a schedule)."""
        server_opt.rescale_grad = self._optimizer.rescale_grad
        if self._optimizer.lr_scheduler is None:
            server_opt.lr = self._optimizer.lr

    def _wd_mult(self, key):
        param = self._optimizer.param_dict.get(key)
        return float(param.wd_mult) if param is not None else 1.0

    # ----------------------------------------------------------- save / load
    def get_states(self):
        """key -> u as numpy (call after the issued steps completed)."""
        states = {k: u.asnumpy() for k, u in self._u.items()}
        states.update({k: np.array(v) for k, v in self._loaded.items() if k not in states})
        return states

    def set_states(self, states):
        """Restore what :meth:`get_states` returned (u lands on its device at the next step)."""
        self._u = {}
        self._loaded = {k: np.asarray(v) for k, v in states.items()}


def save(worker_momentum):
    """The states-file entry: u per parameter, or None on the servers' path."""
    return None if worker_momentum is None else worker_momentum.get_states()


def load(worker_momentum, blob, fname):
    """Restore u from a states file; refuse a file of the other momentum path."""
    saved = blob.get("worker_momentum")
    if (saved is None) != (worker_momentum is None):
        raise ValueError(
            "%s was saved with momentum_path=%r but this store runs momentum_path=%r"
            % (fname, "server" if saved is None else "worker",
               "server" if worker_momentum is None else "worker"))
    if worker_momentum is not None:
        worker_momentum.set_states(saved)
