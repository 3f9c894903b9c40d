"""PolicyStore: a KVStore that runs one algorithm policy on MXNet's parameter servers.

``gluon.Trainer`` talks to it through MXNet's ``KVStoreBase`` interface
(``set_gradient_compression``, ``set_optimizer``, ``broadcast``, ``pushpull``,
``save/load_optimizer_states``); the Module API and hand-written loops use the
classic calls (``init``, ``push``, ``pull``, str keys: :mod:`.classic_api`),
which run the same steps.  Underneath sits one ordinary MXNet
``dist_sync``/``dist_async`` store with stock servers; the policy decides, per
iteration, what is pushed, when weights are pulled, and how the worker's own
weights move.  Everything it issues is an asynchronous MXNet engine operation:
``pushpull`` returns at once and the next forward/backward waits only on the
arrays it reads, which is what lets CP-SGD's communication overlap computation.

Per parameter the store keeps
  * ``send``: the summed gradient (or model delta) that is pushed; MXNet also
    uses it as the receive buffer of the pull of that key;
  * ``glob``: the newest global weights the worker holds (W);
and the worker's weights are the Trainer's own parameter arrays (L).
"""
import atexit
import os
import pickle
from typing import NamedTuple

import mxnet as mx
import numpy as np

from kvstore_ext import CompressionSwitch

from . import config as config_mod
from . import worker_momentum
from .classic_api import ClassicCalls
from .key_layout import KeyLayout, ParamBuffers, bigarray_bound
from .local_optimizer import LocalOptimizer
from .policies.base import Local, Payload, Pull, Push
from .server_optimizer import ServerOptimizer, state_size
from .state_files import StateFiles

_REQUIRED_ENV = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                 "DMLC_NUM_WORKER")


class _StepItem(NamedTuple):
    """One parameter's share of an open step, as gluon handed it to pushpull."""
    key: int
    param: ParamBuffers
    grads: list      # the gradient on each device
    outs: list       # the weights on each device (outs[0] is the worker's L)
    priority: int
    plan: object     # the policy's StepPlan for this iteration


class _UpdaterView:
    """What gluon.Trainer.load_states reads back (``kv._updater.optimizer``)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


class PolicyStore(ClassicCalls, StateFiles, mx.kv.KVStoreBase):
    """Base class of the registered stores; a subclass names its policy.

    Args:
        config: optional :class:`~mxnet_cpsgd.stores.config.AlgorithmConfig` (or dict of
            knobs); the Trainer's ``compression_params`` override it, and it
            overrides ``MXNET_CPSGD_*`` environment variables.
    """
    policy_class = None

    def __init__(self, config=None):
        if self.policy_class is None:
            raise TypeError("PolicyStore is abstract; create a registered store by name")
        self._base_knobs = config_mod.store_knobs(self.policy_class.name, config)
        self._config = self._resolve({})  # fail early on bad environment/config
        self._policy = None
        self._kv = None
        self._switch = None
        self._worker_momentum = None
        self._optimizer = None
        self._local = None
        self._layout = None
        self._mirrors = False
        self._no_mirrors_reason = None
        self._params = {}
        self._steps = {}
        self._rounds = {}
        self._updater = None
        self._state_per_element = 0
        self._loaded_server_weights = {}  # index -> weights the servers apply next round
        self._pulls_in_flight = {}        # key -> arrays its latest pull writes
        self._pending = {}                # key -> recorded pushpull of the open step
        self._step_left = set()           # trainable keys the open step still waits for
        self._checked = set()             # keys whose gradient arrays were checked
        self._own_sums = {}               # key -> summed gradient of FROM_LOCAL steps
        self._classic_setup()

    # ------------------------------------------------------------------ setup
    def _resolve(self, params):
        # precedence: defaults < environment < config object < compression_params
        knobs = dict(self._base_knobs)
        knobs.update(params)
        return config_mod.resolve(self.policy_class.name, self.policy_class.defaults,
                                  knobs, os.environ)

    @property
    def config(self):
        """The resolved :class:`~mxnet_cpsgd.stores.config.AlgorithmConfig`."""
        return self._config

    def set_gradient_compression(self, compression_params):
        """Called by gluon.Trainer with its ``compression_params``: the algorithm's knobs."""
        resolved = self._resolve(config_mod.check_compression_params(compression_params))
        if self._policy is not None and resolved != self._config:
            # a second Trainer on a store in use: its algorithm already runs
            raise RuntimeError(
                "kvstore '%s' is already in use with %s; a Trainer that reuses it must "
                "pass the same compression_params (or none), got %s"
                % (self.policy_class.name, self._config, resolved))
        self._config = resolved

    def _start(self):
        if self._kv is not None:
            return
        missing = [v for v in _REQUIRED_ENV if v not in os.environ]
        if missing or os.environ.get("DMLC_ROLE") != "worker":
            raise RuntimeError(
                "kvstore '%s' runs inside a distributed job (scheduler, servers, workers); "
                "start this script with `python -m mxnet_cpsgd.launch -n WORKERS -s SERVERS "
                "-- python ...` or MXNet's tools/launch.py (%s)"
                % (self.policy_class.name,
                   "missing " + ", ".join(missing) if missing else
                   "DMLC_ROLE=%s" % os.environ.get("DMLC_ROLE")))
        self._kv = mx.kv.create(self.policy_class.inner_kvstore)
        atexit.register(self._release_at_exit)

    def _configure(self):
        """Fix the settings; compression must be on before the first key exists."""
        if self._policy is not None:
            return  # a second Trainer reuses the store as it is
        self._start()
        self._policy = self.policy_class(self._config)
        self._policy.set_num_workers(self._kv.num_workers)
        self._worker_momentum = worker_momentum.for_config(self._config)
        if self._policy.uses_compression:
            switch = CompressionSwitch(self._kv)
            switch.enable(self._config.threshold)
            self._switch = switch

    # ------------------------------------------------------------- optimizer
    def set_optimizer(self, optimizer):
        """Send the algorithm's server optimizer to the servers and set up Opt_l.

        A second call (a new Trainer given the same store, as MXNet allows for
        dist_sync) sends the new optimizer to the servers, which start its
        state afresh, and keeps the servers' weights: every parameter must have
        the shape it had, and the new Trainer's parameters receive the current
        global weights at its broadcast.
        """
        if self.policy_class.uses_compression:  # (classic keys: checked at init)
            # fail before joining the job: MXNet quantizes float32 only
            for index, param in optimizer.param_dict.items():
                if np.dtype(param.dtype) != np.float32:
                    raise ValueError(
                        "kvstore '%s' compresses gradients, which MXNet supports for "
                        "float32 only; parameter %s is %s (use float32 parameters or "
                        "kvstore='odsgd'/'ssgd')" % (self.policy_class.name, param.name,
                                                     np.dtype(param.dtype).name))
        self._configure()
        server_opt = self._server_optimizer(optimizer)
        probe_size = 8
        probe = server_opt.create_state_multi_precision(
            0, mx.nd.zeros((probe_size,), dtype=np.float32))
        mirrored = state_size(probe)
        if self._classic or not optimizer.param_dict:
            self._set_classic_optimizer(optimizer, mirrored, probe_size)
            return
        shapes = {}
        for index, param in optimizer.param_dict.items():
            shape = param.shape
            if shape is None or any(int(d) <= 0 for d in shape):
                raise ValueError("parameter %s has no known shape; run a forward pass "
                                 "before the first trainer.step()" % param.name)
            shapes[index] = tuple(shape)
        if self._params:
            self._reuse(optimizer, shapes, mirrored is not None,
                        (mirrored or 0) // probe_size)
            return
        self._mirrors = mirrored is not None
        self._no_mirrors_reason = "its state is not float32 arrays"
        self._state_per_element = (mirrored or 0) // probe_size
        num_servers = int(os.environ["DMLC_NUM_SERVER"])
        # gluon pushes only parameters with gradients: the others weigh nothing in the balance
        moving = [index for index, param in optimizer.param_dict.items()
                  if param.grad_req != "null"]
        self._layout = KeyLayout(shapes, num_servers, self._state_per_element,
                                 bigarray_bound(), moving=moving)
        self._policy.set_keys({index: int(np.prod(shape)) for index, shape in shapes.items()})
        self._adopt_optimizer(optimizer)

    def _reuse(self, optimizer, shapes, mirrors, state_per_element):
        """set_optimizer on a store whose keys exist: same parameters, new optimizer."""
        changed = ["parameter %r: shape %s, but this store holds %s"
                   % (i, shape, self._layout.shapes.get(i, "no such parameter"))
                   for i, shape in sorted(shapes.items())
                   if self._layout.shapes.get(i) != shape]
        if changed:
            raise ValueError(
                "kvstore '%s' already holds the parameters of an earlier Trainer; a "
                "Trainer may reuse it only for parameters of the same shapes (%s). "
                "MXNet allows one dist store per process: train another model in a new "
                "job" % (self.policy_class.name, "; ".join(changed)))
        self._flush_step()
        mx.nd.waitall()
        self._adopt_optimizer(optimizer)
        if (mirrors, state_per_element) != (self._mirrors, self._state_per_element):
            # the mirror keys are sized for the first optimizer's state: the servers
            # keep the new state on their own, and it cannot be saved
            self._mirrors = False
            self._no_mirrors_reason = (
                "a Trainer whose optimizer keeps another kind of state (%s) reused the "
                "store" % type(optimizer).__name__)
        elif self._mirrors:
            for param in self._params.values():
                self._register_mirrors(param, init=False)
        self._checked = set()

    def _server_optimizer(self, optimizer):
        chosen = self._policy.server_optimizer(optimizer, self._kv.num_workers)
        # a copy: the multipliers set later must not touch the Trainer's optimizer
        server_opt = pickle.loads(pickle.dumps(chosen))
        server_opt.lr_mult_source = chosen is optimizer
        if self._worker_momentum is not None:
            self._worker_momentum.adopt(optimizer, self._kv.num_workers, server_opt)
        return server_opt

    def _adopt_optimizer(self, optimizer):
        """Make ``optimizer`` the Trainer-side optimizer; send the servers theirs
        (classic keys: at the first step, see ClassicCalls._ready_to_step)."""
        self._optimizer = optimizer
        self._updater = _UpdaterView(optimizer)
        if self._policy.uses_local_optimizer:
            self._local = LocalOptimizer(
                optimizer, self._kv.num_workers,
                **self._policy.local_settings(self._kv.num_workers))
        if not self._server_opt_deferred:
            self._send_server_optimizer()

    def _send_server_optimizer(self):
        server_opt = self._server_optimizer(self._optimizer)
        # an optimizer of the policy's own (model averaging) ignores the multipliers
        use_mults = server_opt.__dict__.pop("lr_mult_source")
        lr_mult, wd_mult = {}, {}
        for index, chunks in self._layout.chunks.items():
            lr, wd = self._multipliers(self._optimizer, index) if use_mults else (1.0, 1.0)
            for chunk in chunks:
                lr_mult[chunk.key], wd_mult[chunk.key] = lr, wd
        self._kv.set_optimizer(ServerOptimizer(server_opt, lr_mult, wd_mult,
                                               self._layout.mirror_base))

    # ------------------------------------------------------------- broadcast
    def broadcast(self, key, value, out, priority=0):
        """Initialise ``key`` on the servers from rank 0's value and pull it into ``out``."""
        if self._optimizer is None:
            raise RuntimeError(
                "kvstore '%s' needs update_on_kvstore=True: the servers run the optimizer "
                "(do not pass update_on_kvstore=False or set MXNET_UPDATE_ON_KVSTORE=0)"
                % self.policy_class.name)
        outs = out if isinstance(out, (list, tuple)) else [out]
        keys = key if isinstance(key, (list, tuple)) else [key]
        values = value if isinstance(value, (list, tuple)) else [value]
        if len(keys) != 1:
            for k, v, o in zip(keys, values, outs):
                self.broadcast(k, v, o, priority)
            return
        self._init_key(keys[0], values[0], outs, priority, "broadcast")

    def _init_key(self, key, value, outs, priority, call):
        """Initialise a key on the servers (rank 0's value) and pull it into ``outs``
        and the worker's weights (``outs[0]``; an array of the store's after init)."""
        index = self._register(key, value, outs, call)
        param = self._params.get(index)
        if param is None:
            param = ParamBuffers(index, value, self._layout.chunks[index])
            parts = param.parts(value)
            self._kv.init([k for k, _ in parts], [v for _, v in parts])
            if self._mirrors and not self._classic:  # classic: at the first step
                self._register_mirrors(param)
        else:
            # initialised by an earlier Trainer: the servers' weights stay, the new
            # Trainer's arrays receive them (its values are not sent anywhere)
            self._flush_step()
            param.glob.wait_to_read()
        if not outs:
            outs = [mx.nd.zeros(value.shape, ctx=value.context, dtype=value.dtype)]
        param.weights = outs[0]  # the worker's weights L (restored by load_states)
        self._pull(param, [param.glob] + outs, priority)
        # a later push must not overtake this pull (MXNet orders them per array only)
        for o in outs:
            o.wait_to_read()
        param.glob.wait_to_read()
        if index not in self._params:
            self._params[index] = param
            self._steps[index] = 0
            self._rounds[index] = 0

    def _dense_push(self, keys, values, priority=0):
        if self._switch is not None:
            with self._switch.dense():
                self._kv.push(keys, values, priority=priority)
        else:
            self._kv.push(keys, values, priority=priority)

    def _wait_for_pulls(self):
        """Block until no pull of this store runs (the compression switch needs that).

        The switch flips the compression type that MXNet's pull operations also
        read, on engine threads, while they run (``EncodeCompressedKey`` aborts
        with "Unsupported compression type: 0" if the type changes under it).
        Pushes are safe: MXNet picks dense or compressed in the calling thread.
        """
        for targets in self._pulls_in_flight.values():
            for array in targets:
                array.wait_to_read()
        self._pulls_in_flight = {}

    # -------------------------------------------------------------- pushpull
    def pushpull(self, key, value, out=None, priority=0):
        """One iteration of the algorithm for parameter ``key``.

        gluon.Trainer calls this once per trainable parameter per step.  The
        store records each call and carries out the whole step when the last
        trainable parameter arrives (or when a key comes round again), so that
        the local updates run as a few multi-tensor operations and a dense
        round flips the compression switch once.  A list of keys is one step
        of its own and is carried out before the call returns.  Every
        operation is asynchronous: the call returns without waiting for the
        network.

        Args:
            key: the Trainer's parameter index (or a list of them).
            value: the gradient on each device (list of NDArrays).
            out: the parameter's data on each device; receives the weights the
                next forward/backward uses.
            priority: MXNet engine priority (gluon passes -index).
        """
        if out is None:
            raise RuntimeError(
                "kvstore '%s' needs update_on_kvstore=True: pushpull without out= "
                "(gradient all-reduce) is not supported (do not pass update_on_kvstore="
                "False or set MXNET_UPDATE_ON_KVSTORE=0)" % self.policy_class.name)
        self._ready_to_step("pushpull")
        if isinstance(key, (list, tuple)):
            if not (len(key) == len(value) == len(out)):
                raise ValueError("pushpull got %d keys, %d values and %d outputs"
                                 % (len(key), len(value), len(out)))
            self._flush_step()
            for k, v, o in zip(key, value, out):
                self._record(self._index_of(k, "pushpull"), v, o, priority, k)
            self._flush_step()
            return
        self._record(self._index_of(key, "pushpull"), value, out, priority, key)
        if not self._step_left:
            self._flush_step()

    def _record(self, key, value, out, priority, shown_key=None):
        """Record a step of key (an index); ``shown_key`` is the caller's key, for errors."""
        param = self._params.get(key)
        if param is None:
            raise RuntimeError("key %r was not initialised (broadcast) before pushpull" % (key,))
        grads = list(value) if isinstance(value, (list, tuple)) else [value]
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        self._check_step_arrays(key, key if shown_key is None else shown_key, param, grads,
                                outs)
        if key in self._pushed:
            raise self._refuse("pushpull", "of key %r, which was pushed but not pulled"
                               % (key,), "pull it first")
        if key in self._pending:
            self._flush_step()  # a new step began before the last one was complete
        if not self._pending:
            self._step_left = self._keys_of_step(key)
        self._pending[key] = _StepItem(key, param, grads, outs, priority,
                                       self._policy.plan(self._steps[key], key))
        self._step_keys.add(key)
        self._step_left.discard(key)

    def _flush_step(self):
        """Issue everything the recorded keys' plans ask for, in dependency order."""
        items, self._pending, self._step_left = list(self._pending.values()), {}, set()
        if not items:
            return
        # 1. the summed gradient; a step that pushes nothing can use it in place.  A
        # local step from the own weights waits for nothing the network holds, but
        # send is held by the key's last pull (MXNet receives into it) or dense push
        # (until every worker's push of that round is in): a copy into send would make
        # the next backward, which overwrites the gradient, wait too; so it is staged
        sources = {}
        for key, param, grads, outs, priority, plan in items:
            if plan.push is Push.NONE and len(grads) == 1:
                sources[key] = grads[0]
                continue
            own = plan.local is Local.FROM_LOCAL and self._worker_momentum is None
            total = self._own_sum(key, param) if own else param.send
            if len(grads) > 1:
                mx.nd.add_n(*[g.as_in_context(total.context) for g in grads], out=total)
            else:
                grads[0].copyto(total)
            if total is not param.send and plan.push is not Push.NONE:
                total.copyto(param.send)
            sources[key] = total
        if self._worker_momentum is not None:  # push u, not g
            self._worker_momentum.accumulate(items, sources, self._rounds)
        # 2. local updates, one aggregated optimizer call per kind
        for kind in (Local.FROM_GLOBAL, Local.FROM_LOCAL):
            group = [it for it in items if it.plan.local is kind]
            if group:
                self._local_update(kind, group, sources)
        # 3. pushes (and the pulls of uncompressed dense rounds, in one pushpull)
        pulls, switched = [], []
        for key, param, grads, outs, priority, plan in items:
            if plan.pull is Pull.SYNC:
                targets = [param.glob] + outs
            elif plan.pull is Pull.BACKGROUND:
                targets = [param.glob]
            else:
                targets = []
            if plan.push is Push.NONE:
                pulls.append((param, targets, priority))
            elif plan.push is Push.DENSE and self._switch is not None:
                switched.append((param, targets, priority))
            elif plan.push is Push.DENSE and targets:
                # the server answers the push with the new weights: one round trip
                self._pull(param, targets, priority, push=True)
            else:
                self._push_send(param, priority)
                pulls.append((param, targets, priority))
        if switched:
            self._wait_for_pulls()  # the next local update needs them anyway
            with self._switch.dense():
                for param, _, priority in switched:
                    self._push_send(param, priority)
            pulls.extend(switched)
        # 4. pulls, after the switch is back
        for param, targets, priority in pulls:
            if targets:
                self._pull(param, targets, priority)
        for key, param, grads, outs, priority, plan in items:
            if plan.push is not Push.NONE:
                self._rounds[key] += 1
                self._loaded_server_weights.pop(key, None)
            self._steps[key] += 1

    def _own_sum(self, key, param):
        """A buffer for the gradient that no pull or push holds (see _flush_step)."""
        total = self._own_sums.get(key)
        if total is None:
            total = self._own_sums[key] = mx.nd.zeros(param.shape, ctx=param.send.context,
                                                      dtype=param.send.dtype)
        return total

    def _push_send(self, param, priority):
        """Push ``param.send`` (each chunk to its own key)."""
        parts = param.parts(param.send)
        self._kv.push([k for k, _ in parts], [v for _, v in parts], priority=priority)

    def _pull(self, param, targets, priority, push=False):
        """Pull ``param``'s global weights into ``targets`` (with ``push``: push
        ``send`` and receive the weights in the same round trip, ``pushpull``).

        ``targets`` starts with ``param.glob`` whenever it holds more than one
        array; see :meth:`ParamBuffers.pull_targets` for chunked parameters.
        """
        direct, copies = param.pull_targets(targets)
        per_chunk = [[view for _, view in parts] for parts in
                     zip(*[param.parts(a) for a in direct])]
        for (key, send_part), target_parts in zip(param.parts(param.send), per_chunk):
            if push:
                self._kv.pushpull(key, send_part, out=target_parts, priority=priority)
            else:
                self._kv.pull(key, out=target_parts, priority=priority)
                if self._switch is not None:
                    self._pulls_in_flight[key] = target_parts
        for array in copies:
            param.glob.copyto(array)

    def _local_update(self, kind, group, sources):
        """The workers' own step for ``group`` (items of one ``Local`` kind)."""
        keys = [it.key for it in group]
        weights = [it.outs[0] for it in group]
        grads = [sources[k] for k in keys]
        if kind is Local.FROM_GLOBAL:
            for it, w in zip(group, weights):
                it.param.glob.copyto(w)
        # the global iteration picks the learning rate from the Trainer's schedule
        self._local.step(keys, weights, grads, max(self._steps[k] for k in keys))
        for key, param, _, outs, _, plan in group:
            for other in outs[1:]:
                outs[0].copyto(other)
            if plan.payload is Payload.MODEL_DELTA:
                mx.nd.elemwise_sub(param.glob, outs[0], out=param.send)
