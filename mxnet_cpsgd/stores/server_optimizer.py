"""The optimizer object the parameter servers run.

MXNet's servers unpickle whatever optimizer the workers send and call it for every
completed round of a key; they offer no way to read or write the optimizer's state
(momentum etc.).  :class:`ServerOptimizer` wraps the algorithm's optimizer and adds
that, with stock servers and no extra command:

* every parameter key ``k`` has a *mirror key* ``mirror_base + k`` placed on the
  same server.  The server's stored array of the mirror key becomes the storage of
  the optimizer state of ``k`` (the state arrays are views into it), so a plain
  pull of the mirror key reads the current state at any time;
* a push to the mirror key whose last element (summed over the round) is 1 writes
  the pushed state into it and sets the weights of ``k`` to the pushed weights
  just before the next update of ``k``: that is how a saved run is loaded.  A
  push whose flag is 0 only registers the mirror (done once, when the key is
  initialized).

Mirror layout (float32):
``[state elements..., weights (load only)..., update count, weight count, flag]``.

This module must be importable on the servers: servers of a job run the same
Python environment as its workers.  A server unpickles it while ``import mxnet``
is still running (the server loop starts inside MXNet's import), so it imports
MXNet's submodules directly, never attributes of the half-built ``mxnet``.
An exception inside a server's updater would be printed and ignored by MXNet,
leaving the round unapplied while training goes on; this class stops the
server instead, so the job fails with the traceback.
"""
import copy
import os
import sys
import traceback

import numpy as np
from mxnet.ndarray import NDArray

MIRROR_TRAILER = 3  # update count, weight count, flag


def state_arrays(state):
    """The NDArrays of an optimizer state, flattened in a fixed order."""
    if state is None:
        return []
    if isinstance(state, NDArray):
        return [state]
    if isinstance(state, (list, tuple)):
        arrays = []
        for part in state:
            arrays.extend(state_arrays(part))
        return arrays
    raise TypeError("unsupported optimizer state of type %s" % type(state).__name__)


def state_size(state):
    """Elements of a state when it can be mirrored (all float32), else None."""
    arrays = state_arrays(state)
    if any(np.dtype(a.dtype) != np.float32 for a in arrays):
        return None
    return sum(a.size for a in arrays)


def _rebind(state, mirror, offset, keep_values):
    """Return ``state`` with every array replaced by a view of ``mirror``."""
    if state is None:
        return None, offset
    if isinstance(state, NDArray):
        view = mirror[offset:offset + state.size].reshape(state.shape)
        if not keep_values:
            state.copyto(view)
        return view, offset + state.size
    parts = []
    for part in state:
        bound, offset = _rebind(part, mirror, offset, keep_values)
        parts.append(bound)
    return type(state)(parts), offset


class ServerOptimizer:
    """The servers' optimizer: the algorithm's optimizer plus state mirrors.

    Args:
        optimizer: the optimizer that updates the weights (pickled to servers).
        lr_mult: store key -> learning-rate multiplier.
        wd_mult: store key -> weight-decay multiplier.
        mirror_base: keys at or above this are mirror keys.
    """

    def __init__(self, optimizer, lr_mult, wd_mult, mirror_base):
        optimizer.lr_mult = dict(lr_mult)
        optimizer.wd_mult = dict(wd_mult)
        self.optimizer = optimizer
        self.mirror_base = mirror_base
        self._reset()

    def _reset(self):
        # the schedule as sent, before any update moved it (see _schedule_by_key)
        self._schedule = copy.deepcopy(self.optimizer.lr_scheduler)
        self._mirrors = {}
        self._loaded = set()
        self._pending_weights = {}

    # MXNet's Updater reads these two attributes
    @property
    def aggregate_num(self):
        return self.optimizer.aggregate_num

    @property
    def multi_precision(self):
        return self.optimizer.multi_precision

    def __getstate__(self):
        return {"optimizer": self.optimizer, "mirror_base": self.mirror_base}

    def __setstate__(self, state):
        self.optimizer = state["optimizer"]
        self.mirror_base = state["mirror_base"]
        self._reset()

    def _set_current_context(self, device_id):
        self.optimizer._set_current_context(device_id)

    def create_state_multi_precision(self, index, weight):
        try:
            return self._create_state(index, weight)
        except BaseException:  # noqa: B902
            _die("creating the optimizer state of key %r" % (index,))

    def _create_state(self, index, weight):
        if index >= self.mirror_base:
            return None
        state = self.optimizer.create_state_multi_precision(index, weight)
        mirror = self._mirrors.get(index)
        if mirror is not None and state_size(state):
            state, _ = _rebind(state, mirror, 0, keep_values=index in self._loaded)
        return state

    def update_multi_precision(self, index, weight, grad, state):
        try:
            self._update(index, weight, grad, state)
        except BaseException:  # noqa: B902 - MXNet would swallow it; see module doc
            _die("update of key %r" % (index,))

    def _update(self, index, weight, grad, state):
        first = index[0] if isinstance(index, (list, tuple)) else index
        if first < self.mirror_base:
            if self._pending_weights:
                pairs = zip(index, weight) if isinstance(index, (list, tuple)) \
                    else [(index, weight)]
                for i, w in pairs:
                    if i in self._pending_weights:
                        w[:] = self._pending_weights.pop(i)
            self._schedule_by_key(index)
            self.optimizer.update_multi_precision(index, weight, grad, state)
            return
        if isinstance(index, (list, tuple)):
            for i, w, g in zip(index, weight, grad):
                self._mirror_push(i - self.mirror_base, w, g)
        else:
            self._mirror_push(index - self.mirror_base, weight, grad)

    def _schedule_by_key(self, index):
        """Make the coming update use the schedule's learning rate of its own round.

        MXNet's optimizer asks its scheduler for the rate at ``num_update``, the
        largest round count of any key so far, and MXNet's step schedulers only
        ever move forward. Workers that do not wait for their pulls (odsgd,
        cpsgd, ssdsgd) can complete round t+1 of one key on a server before round
        t of another, which then got round t+1's rate (seen as a rare mismatch
        with the numpy reference at a schedule step). Here every update counts
        its own key's rounds and asks a fresh copy of the schedule.
        """
        opt = self.optimizer
        if self._schedule is None:
            return
        keys = index if isinstance(index, (list, tuple)) else [index]
        opt.num_update = min(opt._index_update_count.get(k, opt.begin_num_update)
                             for k in keys)
        opt.lr_scheduler = copy.copy(self._schedule)

    def _mirror_push(self, key, mirror, pushed):
        self._mirrors[key] = mirror
        trailer = pushed[pushed.size - MIRROR_TRAILER:].asnumpy()
        if trailer[2] < 0.5:
            return  # registration only
        num_weights = int(round(float(trailer[1])))
        num_state = mirror.size - MIRROR_TRAILER - num_weights
        if num_state:
            mirror[0:num_state] = pushed[0:num_state]
        # read now, not by an engine copy: under dist_async ``pushed`` is the received
        # message itself, freed once ``mirror`` is ready; a copy still queued then
        # (a busy machine) read freed memory, and the garbage became the key's weights
        self._pending_weights[key] = pushed[num_state:num_state + num_weights].asnumpy()
        count = int(round(float(trailer[0])))
        self.optimizer._index_update_count[key] = count
        self.optimizer.num_update = max(self.optimizer.num_update, count)
        self._loaded.add(key)


def _die(what):
    sys.stderr.write("mxnet-cpsgd server: %s failed; stopping this server so that the "
                     "job fails instead of training on unapplied updates\n%s"
                     % (what, traceback.format_exc()))
    sys.stderr.flush()
    os._exit(17)
