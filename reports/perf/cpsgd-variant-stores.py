"""Diagnostic-only stores of the 2-worker cpsgd measurements (not project code;
run via --worker-setup).

cpsgdnowait: cpsgd without the global wait for in-flight pulls before a correction
    round's dense pushes. UNSAFE: a pull operation that reads the compression type
    while it is flipped may abort the worker. It exists only to measure what the
    wait costs.
cpsgdnocorr: cpsgd with no correction round after warm-up (compressed every step).
cpsgdstagger: every key corrects every K steps, keys spread over the K phases by size
    (changes the algorithm; measures what spreading the dense burst would give);
    cpsgdstaggernowait: the same without the wait (unsafe, like cpsgdnowait).
cpsgdbarrier, cpsgdstaggerbarrier: cpsgd and cpsgdstagger with the flip guarded by an
    engine barrier instead of the wait (safe; see the comment above EngineBarrier).
cpsgddefer: cpsgd that issues the compressed round right after a correction round
    only once the correction round's pulls have landed (same numbers, other timing).
cpsgdalign: cpsgd whose correction round's dense pushes wait, after the store's own
    wait for its pulls, for a worker barrier (same numbers, other timing).
cpsgdresync: cpsgddefer with a worker barrier after that wait (same numbers).
"""
import atexit
import ctypes
import os
import sys
import threading
import time
from contextlib import contextmanager

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

from mxnet_cpsgd.stores.parameter_server import PolicyStore
from mxnet_cpsgd.stores.policies.cpsgd import CPSGD, _COMPRESSED, _CORRECTION
from mxnet_cpsgd.stores.policies.base import SYNC_SGD, Push


class CPSGDNoCorrPolicy(CPSGD):
    name = "cpsgdnocorr"

    def plan(self, step, key=None):
        return SYNC_SGD if self.in_warmup(step) else _COMPRESSED


class CPSGDNoWaitPolicy(CPSGD):
    name = "cpsgdnowait"


class cpsgdnocorr(PolicyStore):
    policy_class = CPSGDNoCorrPolicy


class cpsgdnowait(PolicyStore):
    policy_class = CPSGDNoWaitPolicy

    def _wait_for_pulls(self):
        self._pulls_in_flight = {}  # no wait: measures the cost of the wait (unsafe)


for _cls in (cpsgdnocorr, cpsgdnowait):
    mx.kv.KVStoreBase.kv_registry[_cls.__name__] = _cls


class CPSGDStaggerPolicy(CPSGD):
    """Each key corrects every K steps, but the keys are spread over K phases
    (changes the algorithm: the paper corrects every key in the same iteration)."""
    name = "cpsgdstagger"
    key_phase = 0

    def plan(self, step, key=None):
        if self.in_warmup(step):
            return SYNC_SGD
        if (step + 1 + self.key_phase) % self.config.correction_period == 0:
            return _CORRECTION
        return _COMPRESSED


class cpsgdstagger(PolicyStore):
    policy_class = CPSGDStaggerPolicy
    _phases = None

    def _record(self, key, value, out, priority):
        if self._phases is None:
            # greedy: largest keys first, each into the phase with the fewest elements
            period = self._policy.config.correction_period
            load = [0] * period
            self._phases = {}
            sizes = {k: int(np.prod(p.shape)) for k, p in self._params.items()}
            for k in sorted(sizes, key=lambda k: -sizes[k]):
                phase = load.index(min(load))
                self._phases[k] = phase
                load[phase] += sizes[k]
        self._policy.key_phase = self._phases.get(key, 0)
        super()._record(key, value, out, priority)


mx.kv.KVStoreBase.kv_registry["cpsgdstagger"] = cpsgdstagger


class CPSGDStaggerNoWaitPolicy(CPSGDStaggerPolicy):
    name = "cpsgdstaggernowait"


class cpsgdstaggernowait(cpsgdstagger):
    """cpsgdstagger without the wait for in-flight pulls (UNSAFE, like cpsgdnowait)."""
    policy_class = CPSGDStaggerNoWaitPolicy

    def _wait_for_pulls(self):
        self._pulls_in_flight = {}


mx.kv.KVStoreBase.kv_registry["cpsgdstaggernowait"] = cpsgdstaggernowait


# ---------------------------------------------------------------- engine barrier
# cpsgdbarrier / cpsgdstaggerbarrier: the flip to dense made safe without waiting for
# the pulls in flight. With ThreadedEnginePerDevice every pull lambda (the only code
# that reads the compression type on an engine thread) runs on the CPU worker pool of
# device 0 (MXNET_CPU_WORKER_NTHREADS threads, FIFO queue). The barrier pushes one
# blocking operation per thread of that pool; once all have entered, no pull lambda is
# between its reads of the type and none can start, so the store flips, pushes dense
# (Push_ only enqueues) and flips back before releasing them. If they do not all enter
# within the timeout the store releases them (late ones return at once) and falls back
# to the wait for the pulls in flight.
_ASYNC_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_ON_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class _CallbackOnComplete(ctypes.Structure):
    _fields_ = [("callback", ctypes.c_void_p), ("engine", ctypes.c_void_p),
                ("param", ctypes.c_void_p)]


class _Context(ctypes.Structure):
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


class EngineBarrier:
    def __init__(self, threads, timeout_s=2.0):
        self.threads = threads
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._generation = 0
        self._entered = 0
        self._open = True
        self._slots = [mx.nd.zeros((1,)) for _ in range(threads)]  # private write deps
        self._func = _ASYNC_FUNC(self._on_start)
        self.held = self.fallbacks = 0
        self.wait_s = 0.0

    def _on_start(self, run_context, on_complete, param):
        # on an engine worker thread: stay here until released
        cb = _CallbackOnComplete.from_address(on_complete)
        saved = (cb.callback, cb.engine, cb.param)
        generation = param or 0
        with self._cond:
            if generation == self._generation and not self._open:
                self._entered += 1
                self._cond.notify_all()
                while generation == self._generation and not self._open:
                    self._cond.wait()
        _ON_COMPLETE(saved[0])(saved[1], saved[2], None)

    def acquire(self):
        """True once every worker thread of the pool is held; False after the timeout."""
        t0 = time.perf_counter()
        with self._cond:
            self._generation += 1
            generation = self._generation
            self._entered = 0
            self._open = False
        ctx = _Context(1, 0)  # cpu(0): the pool pulls on cpu_pinned(0) also run on
        for slot in self._slots:
            mut = (ctypes.c_void_p * 1)(slot.handle.value)
            check_call(_LIB.MXEnginePushAsyncND(
                self._func, ctypes.c_void_p(generation), None, ctypes.byref(ctx),
                None, ctypes.c_int(0), mut, ctypes.c_int(1), None, ctypes.c_int(0),
                ctypes.c_char_p(b"EngineBarrier"), ctypes.c_bool(False)))
        with self._cond:
            held = self._cond.wait_for(lambda: self._entered == self.threads,
                                       self.timeout_s)
        waited = time.perf_counter() - t0
        self.wait_s += waited
        if held:
            self.held += 1
        else:
            self.fallbacks += 1
        # one line per correction round (the bench workers leave with os._exit, so
        # an atexit summary would never be written)
        sys.stderr.write("engine barrier: %s after %.1f ms (held %d, fallbacks %d)\n"
                         % ("held" if held else "FALLBACK to the wait", 1e3 * waited,
                            self.held, self.fallbacks))
        return held

    def release(self):
        with self._cond:
            self._open = True
            self._cond.notify_all()


class _BarrierSwitch:
    """The store's CompressionSwitch, flipped only while the engine barrier holds."""

    def __init__(self, store, switch, barrier):
        self._store, self._switch, self._barrier = store, switch, barrier

    @contextmanager
    def dense(self):
        held = self._barrier.acquire()
        if not held:
            self._barrier.release()
            PolicyStore._wait_for_pulls(self._store)  # today's safe path
        try:
            with self._switch.dense():
                yield
        finally:
            if held:
                self._barrier.release()


class _BarrierMixin:
    def _configure(self):
        super()._configure()
        if self._switch is not None and not isinstance(self._switch, _BarrierSwitch):
            if os.environ.get("MXNET_ENGINE_TYPE", "ThreadedEnginePerDevice") \
                    != "ThreadedEnginePerDevice":
                return  # keep today's wait
            barrier = EngineBarrier(int(os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")))
            self._switch = _BarrierSwitch(self, self._switch, barrier)
            atexit.register(lambda: sys.stderr.write(
                "engine barrier: held %d, fallbacks %d, %.1f ms waiting in all\n"
                % (barrier.held, barrier.fallbacks, 1e3 * barrier.wait_s)))

    def _wait_for_pulls(self):
        pass  # the barrier (or its fallback) guards the flip; keep the pulls recorded


class CPSGDBarrierPolicy(CPSGD):
    name = "cpsgdbarrier"


class cpsgdbarrier(_BarrierMixin, PolicyStore):
    policy_class = CPSGDBarrierPolicy


class CPSGDStaggerBarrierPolicy(CPSGDStaggerPolicy):
    name = "cpsgdstaggerbarrier"


class cpsgdstaggerbarrier(_BarrierMixin, cpsgdstagger):
    policy_class = CPSGDStaggerBarrierPolicy


for _cls in (cpsgdbarrier, cpsgdstaggerbarrier):
    mx.kv.KVStoreBase.kv_registry[_cls.__name__] = _cls


# ----------------------------------------------------------- deferred compressed round
class CPSGDDeferPolicy(CPSGD):
    name = "cpsgddefer"


class cpsgddefer(PolicyStore):
    """cpsgd whose first compressed round after a correction round is issued only
    once the correction round's pulls have landed (the same computation; only
    when the pushes leave changes). The next forward needs those pulls through
    the local update anyway, and that compressed round's pulls are needed one
    step later, so the dense pulls get the links without the compressed round's
    pull responses (as large as theirs: the servers answer with float32 weights)."""
    policy_class = CPSGDDeferPolicy
    _after_dense = False
    deferred = 0

    def _flush_step(self):
        items = list(self._pending.values())
        if (self._after_dense and self._switch is not None
                and any(it.plan.push is Push.COMPRESSED for it in items)):
            self._wait_for_pulls()
            self._deferred()
            self.deferred += 1
        self._after_dense = any(it.plan.push is Push.DENSE for it in items)
        super()._flush_step()

    def _deferred(self):
        """Called once the correction round's pulls have landed (a variant's hook)."""


mx.kv.KVStoreBase.kv_registry["cpsgddefer"] = cpsgddefer


# ------------------------------------------------------- aligned correction round
class CPSGDAlignPolicy(CPSGD):
    name = "cpsgdalign"


class cpsgdalign(PolicyStore):
    """cpsgd whose correction round's dense pushes leave only when every worker's
    pulls of the round before have landed (a ps-lite worker barrier after the
    store's own wait; same numbers, other timing). Without it the workers whose
    pulls land first start their dense pushes, which share the servers' links with
    the pull responses the other workers still wait for (fair queue: one share per
    destination), so those land later still, and every key's dense round waits for
    its last pusher."""
    policy_class = CPSGDAlignPolicy
    aligned = 0

    def _wait_for_pulls(self):
        super()._wait_for_pulls()
        if self._policy.config.correction_schedule == "aligned":
            self._kv._barrier()
            self.aligned += 1


mx.kv.KVStoreBase.kv_registry["cpsgdalign"] = cpsgdalign


class CPSGDResyncPolicy(CPSGD):
    name = "cpsgdresync"


class cpsgdresync(cpsgddefer):
    """cpsgddefer with a ps-lite worker barrier after its wait for the correction
    round's pulls: every worker starts the period's compressed rounds at the same
    moment again (the compressed steps never wait, so nothing else realigns them,
    and each compressed round's merge waits for its last pusher)."""
    policy_class = CPSGDResyncPolicy

    def _deferred(self):
        self._kv._barrier()


mx.kv.KVStoreBase.kv_registry["cpsgdresync"] = cpsgdresync
