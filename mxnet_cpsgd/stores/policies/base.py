"""What one iteration of a training algorithm does, independent of MXNet.

A policy answers, for iteration ``t`` (counted from 0, warm-up included), three
questions: what is pushed to the parameter servers, when the new global weights
are pulled, and how the worker's own weights move.  The store
(:class:`mxnet_cpsgd.stores.parameter_server.PolicyStore`) carries the answer out with MXNet's
KVStore; a new algorithm is a new policy.
"""
import enum
from dataclasses import dataclass


class Push(enum.Enum):
    NONE = "none"              # nothing is sent this iteration
    DENSE = "dense"            # full-precision float32
    COMPRESSED = "compressed"  # MXNet 2-bit, persistent residual


class Pull(enum.Enum):
    NONE = "none"              # keep training on the local weights
    SYNC = "sync"              # the next forward waits for the new global weights
    BACKGROUND = "background"  # fetch global weights; they become the next local base


class Local(enum.Enum):
    NONE = "none"                # the worker's weights are the pulled global weights
    FROM_GLOBAL = "from_global"  # L <- Opt_l(W, g): newest global weights + own gradient
    FROM_LOCAL = "from_local"    # L <- Opt_l(L, g) (SSD-SGD: with its GLU term)


class Payload(enum.Enum):
    GRADIENT = "gradient"        # the worker's summed gradient
    MODEL_DELTA = "model_delta"  # W_sync - L: the local model's move since the last sync


@dataclass(frozen=True)
class StepPlan:
    push: Push
    pull: Pull
    local: Local
    payload: Payload = Payload.GRADIENT


# plain synchronous SGD: push full precision, wait for the new weights
SYNC_SGD = StepPlan(Push.DENSE, Pull.SYNC, Local.NONE)


class Policy:
    """Base class: one subclass per algorithm, one file each.

    Class attributes:
        name: the store name users pass as ``kvstore=``.
        defaults: every knob the algorithm accepts, with its default.
        inner_kvstore: the MXNet store it runs on (``dist_sync``/``dist_async``).
        uses_compression: the inner store gets MXNet's 2-bit compression.
        uses_local_optimizer: workers run a local optimizer (Opt_l).
    """
    name = None
    defaults = {}
    inner_kvstore = "dist_sync"
    uses_compression = False
    uses_local_optimizer = False

    def __init__(self, config):
        self.config = config

    def plan(self, step, key):
        """The :class:`StepPlan` for iteration ``step`` of the parameter ``key``.

        Args:
            step: the key's iteration, counted from 0 (warm-up included).
            key: the store key of the parameter (its Trainer index); a policy whose
                schedule differs between parameters uses it, the others ignore it.
        """
        raise NotImplementedError

    def set_num_workers(self, num_workers):
        """Called once the job's worker count is known, before the first plan."""

    def set_keys(self, sizes):
        """Called by the store once it knows its parameters, before the first step.

        Args:
            sizes: key -> number of elements of that parameter, for every key of
                the optimizer's param_dict (the same on every worker).  A policy
                whose schedule depends on the parameters' sizes uses it.
        """

    def local_settings(self, num_workers):
        """Arguments of :class:`~mxnet_cpsgd.local_optimizer.LocalOptimizer`.

        The authors' rule (OD-SGD, CD-SGD, SSD-SGD): a separate optimizer named by
        ``local_optimizer``, with the Trainer's ``rescale_grad``, local lr
        ``num_workers`` x the Trainer's unless ``local_lr`` is set.
        """
        c = self.config
        return {"name": c.local_optimizer, "local_lr": c.local_lr,
                "momentum": c.local_momentum, "wd": c.local_wd,
                "default_ratio": num_workers, "grad_scale": 1.0}

    def server_optimizer(self, optimizer, num_workers):
        """The optimizer the servers run; by default the Trainer's own."""
        return optimizer

    def in_warmup(self, step):
        return step < (self.config.warmup_steps or 0)
