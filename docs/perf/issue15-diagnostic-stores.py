"""Diagnostic-only stores for issue 15 (not project code; run via --worker-setup).

cpsgdnowait: cpsgd without the global wait for in-flight pulls before a correction
    round's dense pushes. UNSAFE: a pull operation that reads the compression type
    while it is flipped may abort the worker. It exists only to measure what the
    wait costs.
cpsgdnocorr: cpsgd with no correction round after warm-up (compressed every step).
cpsgdstagger: every key corrects every K steps, keys spread over the K phases by size
    (changes the algorithm; measures what spreading the dense burst would give);
    cpsgdstaggernowait: the same without the wait (unsafe, like cpsgdnowait).
"""
import mxnet as mx
import numpy as np

from mxnet_cpsgd.stores.parameter_server import PolicyStore
from mxnet_cpsgd.stores.policies.cpsgd import CPSGD, _COMPRESSED, _CORRECTION
from mxnet_cpsgd.stores.policies.base import SYNC_SGD


class CPSGDNoCorrPolicy(CPSGD):
    name = "cpsgdnocorr"

    def plan(self, step):
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

    def plan(self, step):
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
