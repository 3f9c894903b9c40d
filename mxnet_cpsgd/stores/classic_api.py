"""The classic KVStore calls of a parameter-server store, and the Module API.

MXNet's own ``dist_sync`` store is driven in two ways: gluon's Trainer calls
``set_optimizer``, ``broadcast`` and ``pushpull`` with the Trainer's parameter
indices; MXNet's Module API (``mx.mod.Module.fit``, ``python/mxnet/model.py``)
and hand-written loops call ``init``, ``push``, ``pull`` (and, for dense
parameters, ``broadcast`` and ``pushpull``) with int *or* str keys and an
optimizer that has no ``param_dict``.  :class:`ClassicCalls` is the second way,
mapped onto the same step machinery as the first:

* keys: with a Trainer the keys are its indices and the layout comes from the
  optimizer's ``param_dict``.  Otherwise ("classic" keys) every key is
  registered by its ``init`` or ``broadcast`` (every worker, in the same order,
  as MXNet requires); an int key keeps its value as the optimizer index, a str
  key gets its position in that order, which is the index MXNet's own servers
  hand the optimizer (its ``idx2name`` and multipliers apply unchanged).  The
  servers get their optimizer at the first step, once every key is known.
* ``push(k, g)`` keeps a copy of the (device-summed) gradient; the ``pull(k,
  out)`` after it runs the step of ``k`` exactly as ``pushpull(k, g, out)``
  would: the policy's plan (warm-up, 2-bit or correction push, local update,
  background pull).  The worker's own weights L of an ``init``-ed key are an
  array the store keeps; ``out`` receives them.  A ``pull`` with no push
  before it returns the global weights from the servers.
* ``pushpull`` with classic keys treats the keys of the previous step as one
  step (the Module API passes the same keys every batch).
* what a store cannot do fails at once, naming the call, the store and what to
  do instead.
"""
import os

import mxnet as mx
import numpy as np

from .key_layout import GrowingKeyLayout, KeyLayout, bigarray_bound

#: optimizer-state elements per weight assumed for keys ``init``-ed before
#: ``set_optimizer`` (2 covers SGD with momentum, NAG and Adam)
ASSUMED_STATE_PER_ELEMENT = 2


def describe_keys(keys):
    keys = sorted(keys, key=str)
    if keys == list(range(len(keys))):
        return "0..%d" % (len(keys) - 1) if keys else "none"
    return ", ".join(map(repr, keys))


def _as_pairs(key, value, call, what):
    """[(key, value)] from a single key or a list of keys."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise ValueError("%s got %d keys but %s %s; pass one %s per key"
                             % (call, len(key), "a single" if not isinstance(
                                 value, (list, tuple)) else len(value), what, what))
        return list(zip(key, value))
    return [(key, value)]


def _arrays(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


class ClassicCalls:
    """``init``, ``push``, ``pull``, ``barrier`` and friends (a PolicyStore mixin)."""

    def _classic_setup(self):
        self._classic = False          # keys registered by init/broadcast (no param_dict)
        self._key_index = {}           # classic key -> index
        self._server_opt_deferred = False
        self._pushed = {}              # index -> priority of a push awaiting its pull
        self._step_keys = set()        # keys recorded in the open step
        self._last_step_keys = set()   # keys of the step before

    # -------------------------------------------------------------- identity
    @property
    def type(self):
        # 'dist' and '_sync'/'_async' make gluon and the Module API treat it as
        # a distributed store (Module multiplies the batch by num_workers for _sync)
        return "%s_%s" % (self.policy_class.inner_kvstore, self.policy_class.name)

    @property
    def rank(self):
        self._start()
        return self._kv.rank

    @property
    def num_workers(self):
        self._start()
        return self._kv.num_workers

    @staticmethod
    def is_capable(capability):
        return capability.lower() == mx.kv.KVStoreBase.OPTIMIZER

    def _refuse(self, call, what, instead):
        return RuntimeError("kvstore '%s': %s %s; %s"
                            % (self.policy_class.name, call, what, instead))

    # ---------------------------------------------------------------- checks
    def _check_array(self, key, array, call="pushpull"):
        if array.stype != "default":
            raise ValueError(
                "kvstore '%s': %s of key %r got a %s array, but the store supports dense "
                "(default storage) parameters and gradients only; make the parameter "
                "dense, or use MXNet's dist_sync / dist_async for sparse ones"
                % (self.policy_class.name, call, key, array.stype))
        if self._policy is not None and self._policy.uses_compression \
                and np.dtype(array.dtype) != np.float32:
            raise ValueError("kvstore '%s' compresses gradients, which MXNet supports for "
                             "float32 only; parameter %r is %s (use float32 parameters or "
                             "kvstore='odsgd'/'ssgd')"
                             % (self.policy_class.name, key, np.dtype(array.dtype).name))

    def _check_like(self, key, array, param, call, what):
        """A push's gradient or a pull's output must be the key's shape and dtype
        (MXNet's own check names neither the key nor which shape is whose)."""
        shape, dtype = tuple(array.shape), np.dtype(array.dtype)
        if shape != tuple(param.shape) or dtype != np.dtype(param.send.dtype):
            raise ValueError("kvstore '%s': %s of key %r got %s of shape %s and dtype %s, "
                             "but the key was initialised with shape %s and dtype %s"
                             % (self.policy_class.name, call, key, what, shape, dtype.name,
                                tuple(param.shape), np.dtype(param.send.dtype).name))

    def _check_step_arrays(self, index, key, param, grads, outs):
        """A pushpull's arrays: the key's shape and dtype at every call (cheap; a
        hand-written loop may pass other arrays each step), the storage and dtype
        rules once per key (a Trainer's gradient arrays are fixed)."""
        for g in grads:
            self._check_like(key, g, param, "pushpull", "a gradient")
        for o in outs:
            self._check_like(key, o, param, "pushpull", "an output")
        if index not in self._checked:
            for g in grads:
                self._check_array(index, g, "pushpull")
            self._checked.add(index)

    def _index_of(self, key, call):
        """The store's index of a key that was initialised."""
        if not self._classic:
            return key  # the Trainer's index; _record / broadcast check it
        index = self._key_index.get(self._plain_key(key, call))
        if index is None:
            raise self._refuse(call, "of key %r before init" % (key,),
                               "call kv.init(key, value) first, on every worker in "
                               "the same order (initialised: %s)"
                               % describe_keys(self._key_index))
        return index

    def _plain_key(self, key, call):
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            key, kind = int(key), int
        elif isinstance(key, str):
            kind = str
        else:
            raise TypeError("kvstore '%s': %s keys are int or str, got %r"
                            % (self.policy_class.name, call, key))
        if self._key_index and type(next(iter(self._key_index))) is not kind:
            raise self._refuse(call, "mixes int and str keys",
                               "use one kind of key for every parameter, as MXNet does")
        return key

    def _register(self, key, value, outs, call):
        """Check an init/broadcast and return the key's index (a new one if classic)."""
        self._check_array(key, value, call)
        for o in outs:
            self._check_array(key, o, call)
        if not self._classic and self._layout is not None:
            # a Trainer's store: the keys are its optimizer's param_dict indices
            if key not in self._layout.chunks:
                raise ValueError(
                    "kvstore '%s' has no parameter %r: its keys are the indices of the "
                    "optimizer's param_dict, %s (gluon.Trainer numbers its parameters "
                    "0..N-1)" % (self.policy_class.name, key,
                                 describe_keys(self._layout.chunks)))
            if tuple(value.shape) != self._layout.shapes[key]:
                raise ValueError("parameter %r has shape %s, but the optimizer's param_dict "
                                 "says %s" % (key, value.shape, self._layout.shapes[key]))
            return key
        self._classic = True
        plain = self._plain_key(key, call)
        if self._layout is None:
            self._layout = GrowingKeyLayout(int(os.environ["DMLC_NUM_SERVER"]),
                                            ASSUMED_STATE_PER_ELEMENT, bigarray_bound())
        index = self._key_index.get(plain)
        if index is not None:
            if call == "init":
                raise self._refuse(call, "of key %r, which is already initialised" % (key,),
                                   "initialise each key once (pull reads its weights)")
            if tuple(value.shape) != self._layout.shapes[index]:
                raise ValueError("kvstore '%s': %s of key %r with shape %s, but it was "
                                 "initialised with %s" % (self.policy_class.name, call, key,
                                                          value.shape,
                                                          self._layout.shapes[index]))
            return index
        if self._optimizer is not None and not self._server_opt_deferred:
            raise self._refuse(call, "of a new key %r after the first push" % (key,),
                               "initialise every key before the first push or pushpull")
        index = plain if isinstance(plain, int) else len(self._key_index)
        self._key_index[plain] = index
        self._layout.add(index, tuple(value.shape))
        return index

    # ---------------------------------------------------------- optimizer
    def _set_classic_optimizer(self, optimizer, mirrored, probe_size):
        """set_optimizer for classic keys: the servers get it at the first step."""
        state_per_element = (mirrored or 0) // probe_size
        if self._optimizer is not None and not self._server_opt_deferred:
            self._reuse(optimizer, {}, mirrored is not None, state_per_element)
            return
        self._classic = True
        if self._layout is None:
            self._layout = GrowingKeyLayout(int(os.environ["DMLC_NUM_SERVER"]),
                                            state_per_element, bigarray_bound())
        self._mirrors = mirrored is not None
        self._no_mirrors_reason = "its state is not float32 arrays"
        self._state_per_element = state_per_element
        self._server_opt_deferred = True
        self._adopt_optimizer(optimizer)

    def _ready_to_step(self, call="save_optimizer_states"):
        """Send a deferred server optimizer once every classic key is known."""
        if self._optimizer is None:
            raise self._refuse(call, "before set_optimizer",
                               "the servers run the optimizer: call kv.set_optimizer(...) "
                               "first (MXNet's dist_sync is a store that only sums pushes)")
        if not self._server_opt_deferred:
            return
        if not self._params:
            raise self._refuse(call, "before any key was initialised",
                               "call kv.init(key, value) for every parameter first")
        self._policy.set_keys({i: int(np.prod(s)) for i, s in self._layout.shapes.items()})
        mx.nd.waitall()
        self._balance_classic_keys()
        self._server_opt_deferred = False
        self._send_server_optimizer()
        if self._mirrors:
            bound = bigarray_bound()
            too_big = [i for i, cs in self._layout.chunks.items()
                       if any(self._mirror_size(c) >= bound for c in cs)]
            if too_big:
                self._mirrors = False
                self._no_mirrors_reason = (
                    "parameters %s were initialised before set_optimizer with chunks "
                    "sized for %d state elements per weight; call set_optimizer before "
                    "init" % (describe_keys(too_big), self._layout.state_per_element))
            else:
                for index in sorted(self._params):
                    self._register_mirrors(self._params[index])
        self._kv._barrier()  # every worker's servers run the new optimizer

    def _balance_classic_keys(self):
        """Move every classic key to the balanced layout a Trainer's store uses.

        The keys were handed out in arrival order as ``init`` named them; now
        that every parameter is known (and the optimizer's state size), rank 0
        initialises the balanced layout's keys with the global weights this
        worker holds (``glob``, pulled at init; nothing was pushed yet) and the
        store uses only those from here on.  The servers keep the first keys'
        weights, unused: one more copy of the model, without optimizer state.
        """
        num_servers = int(os.environ["DMLC_NUM_SERVER"])
        if num_servers < 2 or isinstance(self._layout, KeyLayout):
            return
        layout = self._layout.balanced(num_servers, self._state_per_element,
                                       bigarray_bound())
        keys, values = [], []
        for index in sorted(self._params):
            param = self._params[index]
            param.chunks = layout.chunks[index]
            for key, part in param.parts(param.glob):
                keys.append(key)
                values.append(part)
        self._kv.init(keys, values)  # collective: every worker, the same keys
        self._layout = layout

    def _multipliers(self, optimizer, index):
        """(lr_mult, wd_mult) of a parameter, by MXNet's Optimizer rules."""
        param = optimizer.param_dict.get(index)
        if param is not None:
            return param.lr_mult, param.wd_mult
        name = optimizer.idx2name.get(index)
        mults = []
        for table in (optimizer.lr_mult, optimizer.wd_mult):
            if index in table:
                mults.append(table[index])
            else:
                mults.append(table.get(name, 1.0) if name is not None else 1.0)
        return tuple(mults)

    def _keys_of_step(self, key):
        """The keys that complete the step ``key`` opens."""
        if not self._classic:
            # read at every step: a user may freeze (grad_req='null') parameters later
            return {i for i, p in self._optimizer.param_dict.items()
                    if p.grad_req != "null" and i in self._params}
        # the Module API passes the same keys every batch: a key that comes round
        # again begins a new step, which the keys of the last one complete
        if key in self._step_keys:
            self._last_step_keys, self._step_keys = self._step_keys, set()
        return self._last_step_keys - self._step_keys

    # ---------------------------------------------------------- classic calls
    def init(self, key, value):
        """Initialise keys on the servers (rank 0's value); every worker calls it."""
        for k, v in _as_pairs(key, value, "init", "value"):
            values = _arrays(v)
            self._configure()
            self._init_key(k, values[0], [], 0, "init")

    def push(self, key, value, priority=0):
        """Push a gradient (summed over a list of devices); the pull after it steps."""
        self._ready_to_step("push")
        self._flush_step()
        for k, v in _as_pairs(key, value, "push", "value"):
            index = self._index_of(k, "push")
            param = self._params.get(index)
            if param is None:
                raise self._refuse("push", "of key %r before init" % (k,),
                                   "initialise it with kv.init or broadcast first")
            if index in self._pushed:
                raise self._refuse("push", "of key %r twice before a pull" % (k,),
                                   "pull the key after each push: the push and the pull "
                                   "after it are one step of the algorithm")
            grads = _arrays(v)
            for g in grads:
                self._check_like(k, g, param, "push", "a gradient")
                self._check_array(k, g, "push")
            if getattr(param, "pushed", None) is None:
                param.pushed = mx.nd.zeros(param.shape, ctx=param.send.context,
                                           dtype=param.send.dtype)
            if len(grads) > 1:
                mx.nd.add_n(*[g.as_in_context(param.pushed.context) for g in grads],
                            out=param.pushed)
            else:
                grads[0].copyto(param.pushed)
            self._pushed[index] = priority

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """The weights after the step a push began, or the global weights."""
        if out is None:
            raise self._refuse("pull", "without out=", "pass the arrays to pull into")
        self._flush_step()
        for k, o in _as_pairs(key, out, "pull", "output"):
            index = self._index_of(k, "pull")
            param = self._params.get(index)
            if param is None:
                raise self._refuse("pull", "of key %r before init" % (k,),
                                   "initialise it with kv.init first")
            outs = _arrays(o)
            for a in outs:
                self._check_like(k, a, param, "pull", "an output")
                self._check_array(k, a, "pull")
            if index in self._pushed:
                self._record(index, [param.pushed],
                             [param.weights] + [a for a in outs if a is not param.weights],
                             self._pushed.pop(index))
            else:
                self._pull(param, [param.glob] + outs, priority)
                # a push of the key after this pull must not reach the servers first:
                # MXNet orders a key's pull and push (they share its buffer), the
                # store's pull (into glob) and push (from send) share no array
                for a in [param.glob] + outs:
                    a.wait_to_read()
        self._flush_step()

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        raise self._refuse("row_sparse_pull", "is not supported",
                           "the store holds dense parameters only; use pull, or MXNet's "
                           "dist_sync / dist_async for row_sparse parameters")

    def barrier(self):
        """Wait until every worker reached this point (issues the open step first)."""
        self._flush_step()
        self._start()
        self._kv._barrier()

    _barrier = barrier

    def _release_at_exit(self):
        """Finish this worker's rounds and free MXNet's store, before MXNet shuts down.

        Registered when the store joins the job, so it runs before MXNet's own
        exit handler.  MXNet frees a dist store (a last barrier with the other
        workers, then the servers are stopped) when Python drops it.  A store
        still alive at exit was otherwise freed after MXNet's shutdown had
        begun, and such jobs hung at exit: seen with MXNet's
        example/image-classification fit.py and ResNet-20 (4 of 4 runs; one
        worker in the last barrier, the other in MXNet's WaitForAll), none
        since.
        """
        if self._kv is None:
            return
        try:
            self._flush_step()
            mx.nd.waitall()
        finally:
            self._switch = None
            kv, self._kv = self._kv, None
            del kv

    def _send_command_to_servers(self, head, body):
        # MXNet's server profiler commands (example/image-classification's fit.py)
        self._start()
        self._kv._send_command_to_servers(head, body)
