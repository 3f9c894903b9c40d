"""Saving and loading a parameter-server store's state (``save/load_optimizer_states``).

gluon's ``Trainer.save_states`` / ``load_states`` and the Module API's
``save_optimizer_states`` / ``load_optimizer_states`` call these methods of the
store.  The servers' optimizer state is read through *mirror keys*
(:mod:`.server_optimizer`): every parameter chunk ``k`` has a key
``mirror_base + k`` on the same server whose stored array is that state.

:class:`StateFiles` is a mixin of
:class:`~mxnet_cpsgd.stores.parameter_server.PolicyStore`; it uses the store's
parameters (``_params``), layout, counters and inner MXNet store.
"""
import pickle

import mxnet as mx
import numpy as np

from . import worker_momentum
from .server_optimizer import MIRROR_TRAILER

STATES_FORMAT = "mxnet-cpsgd-states-2"
#: the first format kept the servers' state per chunk of the layout that saved it
STATES_FORMAT_CHUNKED = "mxnet-cpsgd-states-1"


def to_numpy(array, tries=3):
    """``array.asnumpy()``, tried again when MKL-DNN's layout makes it fail.

    Seen in 2-worker jobs with MXNet 1.9.1: the first read of a weight that
    forward passes left in MKL-DNN's layout sometimes fails with "We can't
    generate TBlob for MKLDNN data"; the failed read leaves the array in the
    default layout and the next read returns the right values.
    """
    for attempt in range(tries):
        try:
            return array.asnumpy()
        except mx.base.MXNetError as err:
            if "MKLDNN" not in str(err) or attempt == tries - 1:
                raise
            mx.nd.waitall()


def join_chunk_states(states, elements):
    """One parameter's server state from its chunks' mirrors, as an array of
    (state values per element, elements).

    A chunk's mirror holds each state array of the chunk in turn (momentum: one;
    Adam: mean, then variance), so its state is (values per element, chunk size)."""
    total = sum(np.asarray(s).size for s in states)
    per_element = total // elements if elements else 0
    if not per_element:
        return np.zeros((0, elements), dtype=np.float32)
    return np.concatenate([np.asarray(s, dtype=np.float32).reshape(per_element, -1)
                           for s in states], axis=1)


class StateFiles:
    """save/load_optimizer_states and the mirror keys they read and write."""

    def _mirror_size(self, chunk):
        # [state, weights, trailer]: see server_optimizer
        return chunk.size * (self._state_per_element + 1) + MIRROR_TRAILER

    def _register_mirrors(self, param, init=True):
        base = self._layout.mirror_base
        keys = [base + c.key for c in param.chunks]
        zeros = [mx.nd.zeros((self._mirror_size(c),)) for c in param.chunks]
        if init:
            self._kv.init(keys, zeros)
        self._dense_push(keys, zeros)
        mx.nd.waitall()

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Write this worker's resumable state to ``fname`` (any worker, any time).

        Saved: per-parameter iteration and round counters, this worker's
        weights (local-update algorithms keep different weights per worker),
        the newest global weights it holds, the local optimizer's state, and
        the servers' weights and optimizer state (read back from the servers).
        Not saved: MXNet's 2-bit residual, which MXNet keeps out of reach; a
        resumed run starts it from zero.
        """
        if self._optimizer is None:
            raise RuntimeError(
                "kvstore '%s': save_optimizer_states before set_optimizer has nothing to "
                "save; save after the first trainer.step() (or after mod.init_optimizer)"
                % self.policy_class.name)
        self._ready_to_step()
        self._flush_step()
        if not self._mirrors:
            raise RuntimeError(
                "kvstore '%s' cannot save the servers' optimizer state of %s: %s"
                % (self.policy_class.name, type(self._optimizer).__name__,
                   self._no_mirrors_reason))
        mx.nd.waitall()  # every issued round is complete on the servers
        base = self._layout.mirror_base
        params = {}
        for index, param in self._params.items():
            server_w = mx.nd.zeros(param.shape, ctx=param.glob.context, dtype=param.glob.dtype)
            mirrors = []
            if index in self._loaded_server_weights:
                # loaded but not applied yet: the servers apply it at their next update
                server_w[:] = self._loaded_server_weights[index]
            else:
                for (k, part) in param.parts(server_w):
                    self._kv.pull(k, out=part)
            for chunk in param.chunks:
                buf = mx.nd.zeros((self._mirror_size(chunk),))
                self._kv.pull(base + chunk.key, out=buf)
                mirrors.append(buf)
            params[index] = {
                "weights": to_numpy(param.weights),
                "global": param.glob.asnumpy(),
                "server_weights": server_w.asnumpy(),
                # (state arrays, elements): independent of how the layout cut it
                "server_state": join_chunk_states(
                    [m.asnumpy()[:c.size * self._state_per_element]
                     for m, c in zip(mirrors, param.chunks)], server_w.size),
            }
        blob = {
            "format": STATES_FORMAT,
            "algorithm": self.policy_class.name,
            "steps": dict(self._steps),
            "rounds": dict(self._rounds),
            "params": params,
            "local": self._local.get_states() if self._local is not None else None,
            "optimizer": self._optimizer if dump_optimizer else None,
            "worker_momentum": worker_momentum.save(self._worker_momentum),
        }
        with open(fname, "wb") as f:
            pickle.dump(blob, f)

    def load_optimizer_states(self, fname):
        """Restore a file written by :meth:`save_optimizer_states`.

        Collective: every worker must call it (gluon's ``trainer.load_states``)
        with its own file.  Restores this worker's weights and counters and
        local optimizer state; rank 0's file provides the servers' weights and
        optimizer state, which the servers apply just before their next update.
        """
        if self._optimizer is None:
            raise RuntimeError(
                "kvstore '%s': load_optimizer_states needs the store initialised "
                "(trainer.step or trainer.load_states do it; with the Module API, "
                "mod.init_optimizer)" % self.policy_class.name)
        self._ready_to_step()
        with open(fname, "rb") as f:
            blob = pickle.load(f)
        if not isinstance(blob, dict) or blob.get("format") not in (STATES_FORMAT,
                                                                    STATES_FORMAT_CHUNKED):
            raise ValueError("%s is not a states file written by mxnet-cpsgd" % fname)
        if blob["algorithm"] != self.policy_class.name:
            raise ValueError("%s holds the state of kvstore '%s', not '%s'"
                             % (fname, blob["algorithm"], self.policy_class.name))
        saved = blob["params"]
        server_states = {}
        for index, param in self._params.items():
            entry = saved.get(index)
            if entry is None or entry["weights"].shape != tuple(param.shape):
                raise ValueError("%s does not match this model: parameter %r %s"
                                 % (fname, index, "missing" if entry is None else
                                    "has shape %s, expected %s"
                                    % (entry["weights"].shape, tuple(param.shape))))
            state = entry["server_state"]
            if blob["format"] == STATES_FORMAT_CHUNKED:
                state = join_chunk_states(state, int(np.prod(param.shape)))
            if state.shape != (self._state_per_element, int(np.prod(param.shape))):
                raise ValueError("%s holds %s server-state values for parameter %r; this "
                                 "optimizer keeps %d per element"
                                 % (fname, " x ".join(map(str, state.shape)), index,
                                    self._state_per_element))
            server_states[index] = state
        self._flush_step()
        mx.nd.waitall()
        worker_momentum.load(self._worker_momentum, blob, fname)
        if blob["optimizer"] is not None:
            # like MXNet's own Trainer.load_states: continue with the saved optimizer
            # (its rescale_grad and counters); the servers get a fresh copy, and a new
            # server optimizer needs its state mirrors registered again
            loaded = blob["optimizer"]
            loaded.param_dict = self._optimizer.param_dict
            self._adopt_optimizer(loaded)
            for param in self._params.values():
                self._register_mirrors(param, init=False)
        self._steps = dict(blob["steps"])
        self._rounds = dict(blob["rounds"])
        if self._local is not None and blob["local"] is not None:
            self._local.set_states(blob["local"])
        leader = self._kv.rank == 0
        base = self._layout.mirror_base
        keys, values = [], []
        for index, param in sorted(self._params.items()):
            entry = saved[index]
            param.glob[:] = entry["global"]
            # a whole-array copy: MXNet cannot write numpy into MKL-DNN-layout arrays
            mx.nd.array(entry["weights"], dtype=param.weights.dtype).copyto(param.weights)
            flat_w = entry["server_weights"].reshape(-1)
            self._loaded_server_weights[index] = entry["server_weights"]
            state = server_states[index]
            for chunk in param.chunks:
                chunk_state = state[:, chunk.start:chunk.stop].reshape(-1)
                payload = np.zeros(self._mirror_size(chunk), dtype=np.float32)
                if leader:
                    payload[:chunk_state.size] = chunk_state
                    payload[chunk_state.size:chunk_state.size + chunk.size] = \
                        flat_w[chunk.start:chunk.stop]
                    payload[-3] = self._rounds[index]
                    payload[-2] = chunk.size
                    payload[-1] = 1.0
                keys.append(base + chunk.key)
                values.append(mx.nd.array(payload))
        self._dense_push(keys, values)
        mx.nd.waitall()
