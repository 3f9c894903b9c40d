"""Prototype and probe for cpsgd's compressed pipeline (not project code).

Run via ``cpsgd-bench --worker-setup reports/perf/cpsgd-pipeline-stores.py``.

cpsgddbuf: cpsgd whose compressed rounds alternate between two send buffers.
    MXNet pulls a key into the array last pushed for it, so with one buffer the
    copy of the next gradient (and with it the next push) of a key waits until
    the previous round's pull of that key has arrived. With two buffers the next
    compressed push waits only for the previous push's acknowledgement (MXNet's
    Quantize writes the key's small buffer, which the previous push reads), which
    still keeps a worker from starting round t+1 of a key on the server before
    round t is complete. After a dense round the same buffer is reused (a dense
    push does not read the small buffer, so only the pull orders it). Same
    arithmetic as cpsgd.
cpsgdnocorr, cpsgdnocorrdbuf: the same without correction rounds (diagnostic).
cpsgdwinN, cpsgdnocorrwinN (N = 128, 256, 512): pulls issued last layer first, each
    gated so that at most about N KiB of pulled weights are in flight (see
    _PullWindowMixin). Same arithmetic as cpsgd.
bitsgdq, cpsgdq, cpsgdnocorrq: the stores as they are, on a host uplink with a short
    queue (a diagnostic of the emulated network, see _short_uplink_queue).

Probe (every store of the project, when MXNET_CPSGD_LINK_PROBE is a directory,
or cpsgd-link-probe in the temporary directory by default): each worker samples its namespace's eth0 byte
counters (its host's link, shared with its server) every 5 ms and logs the
time of every step, to ``<dir>/<store>-<rank>.txt``.
"""
import os
import tempfile
import threading
import time

import mxnet as mx

from mxnet_cpsgd.stores.parameter_server import PolicyStore
from mxnet_cpsgd.stores.policies.base import SYNC_SGD, Push
from mxnet_cpsgd.stores.policies.cpsgd import CPSGD, _COMPRESSED

_PROBE_DIR = os.environ.get("MXNET_CPSGD_LINK_PROBE",
                            os.path.join(tempfile.gettempdir(), "cpsgd-link-probe"))
_STATS = "/sys/class/net/eth0/statistics/"


class _Probe:
    def __init__(self, path):
        self.out = open(path, "w", buffering=1 << 16)
        self.lock = threading.Lock()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        tx_f, rx_f = open(_STATS + "tx_bytes"), open(_STATS + "rx_bytes")
        last_flush = time.time()
        while True:
            tx_f.seek(0)
            rx_f.seek(0)
            now = time.time()
            line = "L %.6f %s %s\n" % (now, tx_f.read().strip(), rx_f.read().strip())
            with self.lock:
                self.out.write(line)
                if now - last_flush > 0.5:
                    self.out.flush()
                    last_flush = now
            time.sleep(0.005)

    def step(self, steps):
        with self.lock:
            self.out.write("F %.6f %d\n" % (time.time(), steps))


_orig_start = PolicyStore._start
_orig_flush = PolicyStore._flush_step


def _start(self):
    fresh = self._kv is None
    _orig_start(self)
    if fresh and os.environ.get("DMLC_ROLE") == "worker" and os.path.isdir("/sys/class/net/eth0"):
        os.makedirs(_PROBE_DIR, exist_ok=True)
        self._probe = _Probe(os.path.join(
            _PROBE_DIR, "%s-%d.txt" % (self.policy_class.name, self._kv.rank)))


def _flush_step(self):
    probe = getattr(self, "_probe", None)
    if probe is not None and self._pending:
        probe.step(max(self._steps.get(k, 0) for k in self._pending))
    _orig_flush(self)


PolicyStore._start = _start
PolicyStore._flush_step = _flush_step


class _DoubleBufferMixin:
    def _flush_step(self):
        last_push = self.__dict__.setdefault("_last_push", {})
        for item in self._pending.values():
            param = item.param
            if item.plan.push is Push.COMPRESSED and last_push.get(item.key) is Push.COMPRESSED:
                alt = getattr(param, "send_alt", None)
                if alt is None:
                    alt = mx.nd.zeros(param.shape, ctx=param.send.context, dtype=param.send.dtype)
                param.send, param.send_alt = alt, param.send
            if item.plan.push is not Push.NONE:
                last_push[item.key] = item.plan.push
        super()._flush_step()


class CPSGDDBufPolicy(CPSGD):
    name = "cpsgddbuf"


class CPSGDNoCorrPolicy(CPSGD):
    name = "cpsgdnocorr"

    def plan(self, step):
        return SYNC_SGD if self.in_warmup(step) else _COMPRESSED


class CPSGDNoCorrDBufPolicy(CPSGDNoCorrPolicy):
    name = "cpsgdnocorrdbuf"


class cpsgddbuf(_DoubleBufferMixin, PolicyStore):
    policy_class = CPSGDDBufPolicy


class cpsgdnocorr(PolicyStore):
    policy_class = CPSGDNoCorrPolicy


class cpsgdnocorrdbuf(_DoubleBufferMixin, PolicyStore):
    policy_class = CPSGDNoCorrDBufPolicy


for _cls in (cpsgddbuf, cpsgdnocorr, cpsgdnocorrdbuf):
    mx.kv.KVStoreBase.kv_registry[_cls.__name__] = _cls


class _PullWindowMixin:
    """Issue a step's pulls in the order their rounds complete (last layer first) and
    let a pull start only when the pulls issued before it, less the last
    ``pull_window_bytes`` of them, have arrived: a bound on the pulled bytes in flight.

    Why: colocated, a host's uplink carries its server's pull responses and its
    worker's TCP acknowledgements and pull requests for the other server's
    responses. With a whole round of responses queued in the link's FIFO (tbf),
    those acknowledgements wait behind it and the two directions take turns
    instead of running at once (two-way TCP traffic over one queue).
    """
    pull_window_bytes = 256 * 1024

    def _flush_step(self):
        self._deferred_pulls = []
        try:
            super()._flush_step()
        finally:
            deferred, self._deferred_pulls = self._deferred_pulls, None
        deferred.sort(key=lambda pull: -pull[0].index)
        issued = []
        for param, targets, priority in deferred:
            in_flight, gate = 0, None
            for prev in reversed(issued):
                if in_flight >= self.pull_window_bytes:
                    gate = prev
                    break
                in_flight += prev.send.size * 4
            if gate is not None:
                # an engine dependency: the pull writes param.send, this copy first
                # (it reads gate.send, which gate's pull writes); the pull overwrites it
                gate.send.reshape(-1)[0:1].copyto(param.send.reshape(-1)[0:1])
            PolicyStore._pull(self, param, targets, priority)
            issued.append(param)

    def _pull(self, param, targets, priority, push=False):
        if getattr(self, "_deferred_pulls", None) is not None and not push:
            self._deferred_pulls.append((param, targets, priority))
            return
        PolicyStore._pull(self, param, targets, priority, push)


def _window_store(name, policy_base, window):
    policy = type(policy_base.__name__ + str(window), (policy_base,), {"name": name})
    store = type(name, (_PullWindowMixin, PolicyStore),
                 {"policy_class": policy, "pull_window_bytes": window * 1024})
    mx.kv.KVStoreBase.kv_registry[name] = store


for _w in (128, 256, 512):
    _window_store("cpsgdwin%d" % _w, CPSGD, _w)
    _window_store("cpsgdnocorrwin%d" % _w, CPSGDNoCorrPolicy, _w)


# Diagnostic (changes the emulated network, not the store): the *q variants shrink
# the FIFO of the tbf shaper on their host's uplink (the namespace's eth0 egress,
# which carries the host's server's pull responses and its worker's pushes, pull
# requests and TCP acknowledgements) from 400 ms of traffic to 2 bursts (128 KiB,
# 21 ms at 50mbit), so small packets wait less behind bulk responses there (and
# TCP sees drops instead). The downlinks keep their 400 ms FIFO. (fq_codel, sfq
# and fq are not available in this kernel.)
import re
import subprocess
import sys


def _short_uplink_queue():
    shown = subprocess.run(["tc", "qdisc", "show", "dev", "eth0"], capture_output=True,
                           text=True, check=True).stdout
    match = re.search(r"tbf \S+ root .*?rate (\S+) burst (\S+)", shown)
    if not match:
        raise RuntimeError("no tbf on eth0: %r" % shown)
    rate, burst = match.groups()
    subprocess.run(["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                    "burst", "65536", "limit", "131072"], check=True)
    sys.stderr.write("short uplink queue: %s\n" % subprocess.run(
        ["tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout)


def _short_queue_store(name, base):
    def _start(self):
        fresh = self._kv is None
        base._start(self)
        if fresh and os.environ.get("DMLC_ROLE") == "worker":
            _short_uplink_queue()
    policy = type(base.policy_class.__name__ + "Q", (base.policy_class,), {"name": name})
    store = type(name, (base,), {"policy_class": policy, "_start": _start})
    mx.kv.KVStoreBase.kv_registry[name] = store


_short_queue_store("bitsgdq", mx.kv.KVStoreBase.kv_registry["bitsgd"])
_short_queue_store("cpsgdq", mx.kv.KVStoreBase.kv_registry["cpsgd"])
_short_queue_store("cpsgdnocorrq", cpsgdnocorr)
