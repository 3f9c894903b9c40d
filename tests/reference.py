"""Independent numpy reference of every algorithm's update rule (float64).

Written from the rules in docs / shared notes (algorithms.md), not from the
store's code.  Notation: M workers, iteration ``t`` counted from 0 (warm-up
included), per-worker batch ``B`` passed to ``trainer.step(B)`` so the Trainer's
``rescale_grad`` is ``r = 1/B``; ``g_t^i`` is worker i's gradient (summed over its
batch) at its current weights ``L_t^i``; ``W_t`` are the servers' weights before
round ``t``.

MXNet SGD (:class:`SGD`)::

    momentum mu > 0:  m <- mu*m - lr*(rescale*g + wd*w);  w <- w + m
    momentum 0:       w <- w - lr*(rescale*g + wd*w)

Servers: ``W_{t+1} = Opt_g(W_t, sum_i push_t^i)``, the Trainer's SGD (rescale r,
its own momentum state), once per round; round t uses the global learning rate
``lr(t)`` (constant, or the Trainer's schedule evaluated at update count t + 1).

Local optimizer ``Opt_l`` (odsgd, cpsgd, ssdsgd; the authors' rule): a separate
optimizer of type ``local_optimizer`` (``'sgd'``, or ``'dcasgd'``: MXNet's DCASGD
with momentum 0, see :class:`DCASGD`) with rescale ``r`` (the Trainer's),
momentum ``local_momentum`` (default 0 for odsgd and ssdsgd; for cpsgd the
Trainer's momentum, or 0 with momentum_path 'worker'), weight decay ``local_wd`` (default: 0 for
cpsgd, the Trainer's wd for odsgd and ssdsgd) and learning rate
``ratio * lr(t)`` at iteration t, ``ratio = local_lr / lr`` if ``local_lr`` is set,
else M.  localsgd: SGD with the Trainer's momentum and wd (``local_momentum``
overrides), rescale ``r*M``, learning rate ``ratio * lr(t)`` with ratio
``local_lr / lr`` or 1.  Each worker has its own optimizer state (zero at the first
local step, kept across iterations).

2-bit quantizer ``Q`` (threshold tau, residual per worker and parameter, starts at
0 and persists): ``res += x``; out = +tau where res >= tau (res -= tau), -tau where
res <= -tau (res += tau), else 0.

Algorithms (what ``simulate`` does per iteration t):
  ssgd:     push g dense; L_{t+1} = W_{t+1}.
  bitsgd:   push Q(g); L_{t+1} = W_{t+1}.  With warmup_steps: t < warmup pushes g
            dense; with correction_period k: after warm-up, (t + 1) % k == 0 pushes
            g dense (both leave the residual untouched).
  odsgd:    t < warmup: as ssgd.  Else push g dense and L_{t+1} = Opt_l(W_t, g_t^i).
  cpsgd:    as odsgd, but after warm-up the push is Q(g) unless
            (t + 1) % correction_period == 0 (then dense g, residual untouched);
            warm-up pushes are dense and do not touch the residual.
            correction_schedule 'staggered': parameter n is dense when
            (t + 1 - phase_n) % correction_period == 0 instead, phases from
            ``staggered_phases`` (w0's order is the Trainer's).
            correction_delay 1 (aligned only): if t - 1 >= warmup and
            t % correction_period == 0 (the step after a correction), the local
            step starts from the worker's own weights, L_{t+1} = Opt_l(L_t, g_t);
            every other step from W_t as above (so step t + 1 from W_{t+1}).
            correction_delay 2: the same, and if t - 1 >= warmup and
            (t + 1) % correction_period == 0 (the correction itself) also
            L_{t+1} = Opt_l(L_t, g_t).
  ssdsgd:   warm-up as ssgd.  After: push g dense every round; with n = t - warmup
            and k = sync_period, the base is W_t (the newest pulled global weights)
            if n % k == 0, else L_t; L_{t+1} = GLU(base, g) with
            GLU(w, g) = Opt_l(w, g) - lr_l * glu_weight * (w_s - w); w_s (per worker
            and parameter) starts as the base of the first local step and is set to
            the result after local steps number 0, k, 2k, ...  A pull of W_{t+1}
            happens when (n + 1) % k == 0; it is the base at n + 1.
  localsgd: L <- Opt_l(L, g) every iteration; if (t+1) % sync_period == 0 each worker
            pushes W_sync - L, servers run SGD(lr 1, no momentum, wd 0, rescale 1/M):
            W <- W - (1/M) * sum_i (W_sync - L_i); everybody pulls: L = W_sync = W.
  asgd:     no deterministic order; see ``asgd_linear_final``.

momentum_path 'worker' (bitsgd, cpsgd): the servers run SGD with momentum 0 and wd 0
(rescale r, lr(t)); worker i keeps u^i per parameter (0 at the start) and at every
iteration t, warm-up included, sets
    u^i <- mu * (lr(t-1) / lr(t)) * u^i + g_t^i + wd * W_t / (r * M)
(the ratio 1 at t = 0 or when lr(t) = 0) and pushes u^i wherever the rule above
pushes g_t^i (2-bit quantized or dense, the same schedule and residual).  cpsgd's
local step reads u^i (local_input 'momentum' or None) or g_t^i ('gradient').
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

ALGORITHMS = ("ssgd", "bitsgd", "odsgd", "cpsgd", "ssdsgd", "localsgd")

# knobs each algorithm accepts, with the documented defaults
DEFAULTS = {
    "ssgd": {},
    "bitsgd": {"threshold": 0.5, "warmup_steps": None, "correction_period": None,
               "momentum_path": "server"},
    "odsgd": {"warmup_steps": 200, "local_lr": None, "local_momentum": 0.0,
              "local_optimizer": "sgd", "local_wd": None},
    "cpsgd": {"threshold": 0.5, "correction_period": 5, "warmup_steps": 1000,
              "correction_schedule": "aligned", "correction_delay": 0, "local_lr": None,
              "local_momentum": None, "local_optimizer": "sgd",
              "local_wd": 0.0, "momentum_path": "server", "local_input": None},
    "ssdsgd": {"warmup_steps": 499, "sync_period": 5, "glu_weight": 0.5,
               "local_lr": None, "local_momentum": 0.0, "local_optimizer": "sgd",
               "local_wd": None},
    "localsgd": {"sync_period": 5, "local_lr": None, "local_momentum": None},
}

Weights = Dict[str, np.ndarray]


# --------------------------------------------------------------------- optimizer
class SGD:
    """MXNet's SGD with its own momentum state (one array per parameter name)."""

    def __init__(self, lr, momentum=0.0, wd=0.0, rescale=1.0):
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.wd = float(wd)
        self.rescale = float(rescale)
        self.state = {}

    def step(self, name, w, g):
        """Return the new weights; updates the momentum state of ``name``."""
        w = np.asarray(w, np.float64)
        g = np.asarray(g, np.float64)
        direction = self.rescale * g + self.wd * w
        if self.momentum > 0:
            m = self.state.get(name)
            if m is None:
                m = np.zeros_like(w)
            m = self.momentum * m - self.lr * direction
            self.state[name] = m
            return w + m
        return w - self.lr * direction

    def step_all(self, weights, grads):
        return {n: self.step(n, weights[n], grads[n]) for n in weights}


class DCASGD(SGD):
    """MXNet's DCASGD with momentum 0 (delay-compensated SGD)::

        w_new = w - lr*(rescale*g + wd*w + lamda*(rescale*g)**2 * (w - w_prev))

    ``w_prev`` is the weights the previous update of that parameter started from
    (at the first update: ``w`` itself)."""

    def __init__(self, lr, wd=0.0, rescale=1.0, lamda=0.04):
        super().__init__(lr, 0.0, wd, rescale)
        self.lamda = float(lamda)
        self.previous = {}

    def step(self, name, w, g):
        w = np.asarray(w, np.float64)
        g = self.rescale * np.asarray(g, np.float64)
        prev = self.previous.get(name, w)
        new = w - self.lr * (g + self.wd * w + self.lamda * g * g * (w - prev))
        self.previous[name] = w.copy()
        return new


class GLU:
    """SSD-SGD's local rule on top of a local optimizer ``opt``::

        GLU(w, g) = opt(w, g) - opt.lr * weight * (w_s - w)

    ``w_s`` per parameter: the ``w`` of the first step; after steps number
    0, period, 2*period, ... it is set to the step's result."""

    def __init__(self, opt, weight, period):
        self.opt = opt
        self.weight = float(weight)
        self.period = int(period)
        self.snapshot = {}
        self.count = {}

    def step_all(self, weights, grads):
        out = {}
        for n in weights:
            w = np.asarray(weights[n], np.float64)
            snap = self.snapshot.setdefault(n, w.copy())
            c = self.count.setdefault(n, 0)
            new = self.opt.step(n, w, grads[n]) - self.opt.lr * self.weight * (snap - w)
            if c % self.period == 0:
                self.snapshot[n] = new.copy()
            self.count[n] = c + 1
            out[n] = new
        return out


# --------------------------------------------------------------------- quantizer
class TwoBitQuantizer:
    """MXNet's 2-bit quantizer with a persistent residual per parameter name.

    Also keeps statistics: how many outputs were 0 / +tau / -tau, and the
    smallest distance of a residual to +-tau seen when deciding (a tiny margin
    means float32 rounding in MXNet could legitimately decide the other way).
    """

    def __init__(self, threshold):
        self.tau = float(threshold)
        self.residual = {}
        self.counts = {"zero": 0, "pos": 0, "neg": 0}
        self.min_margin = np.inf
        self.calls = 0

    def __call__(self, name, x):
        x = np.asarray(x, np.float64)
        res = self.residual.get(name)
        if res is None:
            res = np.zeros_like(x)
        res = res + x
        tau = self.tau
        out = np.zeros_like(x)
        pos = res >= tau
        neg = res <= -tau
        out[pos] = tau
        out[neg] = -tau
        if res.size:
            margin = np.minimum(np.abs(res - tau), np.abs(res + tau))
            # elements whose residual and input are exactly 0 cannot flip
            live = (res != 0)
            if live.any():
                self.min_margin = min(self.min_margin, float(margin[live].min()))
        res = res - out
        self.residual[name] = res
        self.counts["pos"] += int(pos.sum())
        self.counts["neg"] += int(neg.sum())
        self.counts["zero"] += int(x.size - pos.sum() - neg.sum())
        self.calls += 1
        return out


# --------------------------------------------------------------------- simulation
@dataclass
class Trajectory:
    """Result of :func:`simulate`.

    local[t][i]: worker i's weights before iteration t (t = 0..iterations), i.e.
        local[t+1][i] is L_{t+1}^i, what the worker holds after step t.
    server[t]: the servers' weights W_t before round t (t = 0..iterations).
    push_kind[t]: 'dense', 'compressed', 'mixed', 'delta' or None (nothing pushed).
    quantizers[i]: worker i's TwoBitQuantizer (compressing algorithms).
    residual_abs[t]: sum over workers and elements of |residual| after iteration t.
    dense_params[t]: cpsgd after warm-up: the parameters pushed dense at t
        (push_kind 'mixed' when some are and some are not).
    """
    local: List[List[Weights]] = field(default_factory=list)
    server: List[Weights] = field(default_factory=list)
    push_kind: List[Optional[str]] = field(default_factory=list)
    quantizers: List[TwoBitQuantizer] = field(default_factory=list)
    residual_abs: List[float] = field(default_factory=list)
    dense_params: Dict[int, List[str]] = field(default_factory=dict)

    def quant_counts(self):
        total = {"zero": 0, "pos": 0, "neg": 0}
        for q in self.quantizers:
            for k, v in q.counts.items():
                total[k] += v
        return total

    def min_margin(self):
        return min([q.min_margin for q in self.quantizers] or [np.inf])


def staggered_phases(w0: Weights, period: int) -> Dict[str, int]:
    """The staggered correction phases, stated independently of the store:
    parameters by element count, largest first (equal sizes in the Trainer's
    order, which is ``w0``'s), each put on the phase in 0..period-1 that holds
    the fewest elements so far (the lowest such phase)."""
    names = list(w0)
    sizes = np.array([np.asarray(w0[n]).size for n in names], dtype=np.int64)
    order = np.lexsort((np.arange(len(names)), -sizes))
    load = np.zeros(period, dtype=np.int64)
    phases = {}
    for j in order:
        phase = int(np.argmin(load))  # the first of equal minima: the lowest phase
        phases[names[j]] = phase
        load[phase] += sizes[j]
    return phases


def _copy(weights):
    return {n: np.array(a, np.float64) for n, a in weights.items()}


def _lin(a, b, ca=1.0, cb=1.0):
    return {n: ca * a[n] + cb * b[n] for n in a}


def simulate(algorithm: str, w0: Weights, grad_fn: Callable[[int, int, Weights], Weights],
             num_workers: int, iterations: int, batch: int, lr: float,
             momentum: float = 0.0, wd: float = 0.0, knobs: Optional[dict] = None,
             lr_schedule: Optional[Callable[[int], float]] = None,
             local_lr_schedule: Optional[Callable[[int], float]] = None) -> Trajectory:
    """Run ``algorithm`` on M simulated workers and servers.

    Args:
        algorithm: one of ALGORITHMS.
        w0: initial weights (rank 0's, broadcast to everybody).
        grad_fn: ``grad_fn(i, t, L)`` -> gradients (summed over the batch) of worker
            i at iteration t; ``L`` is the reference's own L_t^i.  A test may ignore
            ``L`` and return the gradient at the weights the real worker recorded
            ("teacher forcing"), which checks each step's rule in isolation.
        num_workers: M.
        iterations: number of iterations.
        batch: B passed to trainer.step (rescale r = 1/B).
        lr, momentum, wd: the Trainer's SGD hyperparameters.
        knobs: the store's knobs (compression_params).
        lr_schedule: ``lr_schedule(t)`` -> the global learning rate of iteration t
            (default: ``lr`` throughout).
        local_lr_schedule: the global learning rate that the local optimizer's
            ``ratio`` multiplies at iteration t (default: ``lr_schedule``).

    Returns:
        Trajectory
    """
    if algorithm not in DEFAULTS:
        raise ValueError("unknown algorithm %r" % algorithm)
    cfg = dict(DEFAULTS[algorithm])
    for k, v in (knobs or {}).items():
        if k == "type":
            assert v == "2bit"
            continue
        if k not in cfg:
            raise ValueError("%s does not take knob %r" % (algorithm, k))
        cfg[k] = v
    M = num_workers
    r = 1.0 / batch
    worker_momentum = cfg.get("momentum_path") == "worker"
    server_opt = SGD(lr, 0.0, 0.0, rescale=r) if worker_momentum \
        else SGD(lr, momentum, wd, rescale=r)
    u = [{n: np.zeros(np.shape(a)) for n, a in w0.items()} for _ in range(M)]
    if algorithm == "localsgd":
        server_opt = SGD(1.0, 0.0, 0.0, rescale=1.0 / M)
    lr_at = lr_schedule if lr_schedule is not None else (lambda t: lr)
    local_lr_at = local_lr_schedule if local_lr_schedule is not None else lr_at
    if algorithm == "localsgd":
        ratio = cfg["local_lr"] / lr if cfg.get("local_lr") is not None else 1.0
        local_mom = cfg["local_momentum"] if cfg.get("local_momentum") is not None \
            else momentum
        local_opts = [SGD(ratio * lr, local_mom, wd, rescale=r * M) for _ in range(M)]
    elif "local_lr" in cfg:
        ratio = cfg["local_lr"] / lr if cfg.get("local_lr") is not None else float(M)
        local_wd = cfg["local_wd"] if cfg["local_wd"] is not None else wd
        local_mom = cfg["local_momentum"]
        if local_mom is None:
            # cpsgd's default: the Trainer's momentum (0 when the workers run momentum)
            local_mom = 0.0 if worker_momentum else momentum
        if cfg["local_optimizer"] == "sgd":
            local_opts = [SGD(ratio * lr, local_mom, local_wd, rescale=r)
                          for _ in range(M)]
        else:
            assert cfg["local_optimizer"] == "dcasgd" and not cfg["local_momentum"]
            local_opts = [DCASGD(ratio * lr, local_wd, rescale=r) for _ in range(M)]
    else:
        ratio, local_opts = 1.0, []
    glus = [GLU(o, cfg["glu_weight"], cfg["sync_period"]) for o in local_opts] \
        if algorithm == "ssdsgd" else []
    quantizers = [TwoBitQuantizer(cfg["threshold"]) for _ in range(M)] \
        if "threshold" in cfg else []
    warmup = cfg.get("warmup_steps") or 0
    phases = {n: 0 for n in w0}
    if cfg.get("correction_schedule") == "staggered":
        phases = staggered_phases(w0, cfg["correction_period"])

    W = _copy(w0)
    L = [_copy(w0) for _ in range(M)]
    W_sync = [_copy(w0) for _ in range(M)]
    traj = Trajectory(quantizers=quantizers)
    traj.local.append([_copy(l) for l in L])
    traj.server.append(_copy(W))

    def server_round(pushes):
        total = {n: sum(p[n] for p in pushes) for n in W}
        return server_opt.step_all(W, total)

    for t in range(iterations):
        if algorithm != "localsgd":
            server_opt.lr = lr_at(t)
        for o in local_opts:
            o.lr = ratio * local_lr_at(t)
        g = [{n: np.asarray(a, np.float64) for n, a in grad_fn(i, t, _copy(L[i])).items()}
             for i in range(M)]
        kind = "dense"
        local_g = g
        if worker_momentum:
            now = lr_at(t)
            ratio_t = lr_at(t - 1) / now if t > 0 and now > 0 else 1.0
            for i in range(M):
                u[i] = {n: momentum * ratio_t * u[i][n] + g[i][n] + wd * W[n] / (r * M)
                        for n in W}
            if cfg.get("local_input") != "gradient":
                local_g = u
            g = u  # what is pushed
        if algorithm == "ssgd" or (algorithm in ("odsgd", "cpsgd", "ssdsgd") and t < warmup):
            W = server_round(g)
            L = [_copy(W) for _ in range(M)]
            W_sync = [_copy(W) for _ in range(M)]
        elif algorithm == "bitsgd":
            k = cfg["correction_period"]
            if t < warmup or (k and (t + 1) % k == 0):
                pushes = g
            else:
                pushes = [{n: quantizers[i](n, g[i][n]) for n in W} for i in range(M)]
                kind = "compressed"
            W = server_round(pushes)
            L = [_copy(W) for _ in range(M)]
        elif algorithm in ("odsgd", "cpsgd"):
            if algorithm == "cpsgd":
                dense = {n for n in W
                         if (t + 1 - phases[n]) % cfg["correction_period"] == 0}
                pushes = [{n: g[i][n] if n in dense else quantizers[i](n, g[i][n])
                           for n in W} for i in range(M)]
                kind = ("dense" if len(dense) == len(W) else
                        "compressed" if not dense else "mixed")
                traj.dense_params[t] = sorted(dense)
            else:
                pushes = g
            k = cfg.get("correction_period")
            delay = cfg.get("correction_delay") or 0
            if t - 1 >= warmup and ((delay >= 1 and t % k == 0) or
                                    (delay >= 2 and (t + 1) % k == 0)):
                # the step after a correction (with delay 2 the correction too):
                # from the worker's own weights
                L = [local_opts[i].step_all(L[i], local_g[i]) for i in range(M)]
            else:
                # local step from the newest global weights the worker holds: W_t
                L = [local_opts[i].step_all(W, local_g[i]) for i in range(M)]
            W = server_round(pushes)
        elif algorithm == "ssdsgd":
            n, k = t - warmup, cfg["sync_period"]
            # the base of this local step: the pulled global weights, or the own ones
            base = [_copy(W) for _ in range(M)] if n % k == 0 else L
            L = [glus[i].step_all(base[i], g[i]) for i in range(M)]
            W = server_round(g)
        elif algorithm == "localsgd":
            L = [local_opts[i].step_all(L[i], g[i]) for i in range(M)]
            if (t + 1) % cfg["sync_period"] == 0:
                deltas = [_lin(W_sync[i], L[i], 1.0, -1.0) for i in range(M)]
                W = server_round(deltas)
                L = [_copy(W) for _ in range(M)]
                W_sync = [_copy(W) for _ in range(M)]
                kind = "delta"
            else:
                kind = None
        else:  # pragma: no cover
            raise AssertionError(algorithm)
        traj.push_kind.append(kind)
        traj.residual_abs.append(float(sum(np.abs(res).sum() for q in quantizers
                                           for res in q.residual.values())))
        traj.local.append([_copy(l) for l in L])
        traj.server.append(_copy(W))
    return traj


def asgd_linear_final(w0: Weights, all_grads: List[Weights], lr: float, batch: int) -> Weights:
    """A-SGD with plain SGD (no momentum, wd 0) and gradients that do not depend
    on the weights: whatever the order, applying every push exactly once gives
    W0 - lr * (1/B) * sum of all pushes."""
    out = _copy(w0)
    for g in all_grads:
        for n in out:
            out[n] = out[n] - lr * (1.0 / batch) * np.asarray(g[n], np.float64)
    return out


# --------------------------------------------------------------------- models
def mlp_forward(x, p, prefix):
    """tanh MLP of record_weights.py; returns (hidden, out)."""
    h = np.tanh(x.dot(p[prefix + "hid_weight"].T) + p[prefix + "hid_bias"])
    out = h.dot(p[prefix + "out_weight"].T) + p[prefix + "out_bias"]
    return h, out


def head_param_names(index, head):
    prefix = "h%d_" % index
    if head["kind"] == "linear":
        return [prefix + "out_weight", prefix + "out_bias"]
    return [prefix + "hid_weight", prefix + "hid_bias", prefix + "out_weight",
            prefix + "out_bias"]


def head_output(index, head, p, x):
    x = np.asarray(x, np.float64)
    prefix = "h%d_" % index
    if head["kind"] == "linear":
        return x.dot(p[prefix + "out_weight"].T) + p[prefix + "out_bias"]
    return mlp_forward(x, p, prefix)[1]


def head_loss(index, head, p, x, y):
    """Loss of record_weights.py summed over the batch."""
    out = head_output(index, head, p, x)
    y = np.asarray(y, np.float64)
    if head.get("loss", "squared") == "squared":
        return 0.5 * float(((out - y) ** 2).sum())
    return float((out * y).sum())


def head_grad(index, head, p, x, y):
    """Exact gradient (summed over the batch) of one head's loss, float64."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    p = {n: np.asarray(a, np.float64) for n, a in p.items()}
    prefix = "h%d_" % index
    loss = head.get("loss", "squared")
    if head["kind"] == "linear":
        out = x.dot(p[prefix + "out_weight"].T) + p[prefix + "out_bias"]
        dout = (out - y) if loss == "squared" else y
        return {prefix + "out_weight": dout.T.dot(x), prefix + "out_bias": dout.sum(0)}
    h, out = mlp_forward(x, p, prefix)
    dout = (out - y) if loss == "squared" else y
    dh = dout.dot(p[prefix + "out_weight"]) * (1.0 - h * h)
    return {prefix + "out_weight": dout.T.dot(h), prefix + "out_bias": dout.sum(0),
            prefix + "hid_weight": dh.T.dot(x), prefix + "hid_bias": dh.sum(0)}


def model_grad(heads, p, batches):
    """Gradient of the summed loss of all heads; batches[h] = (x, y)."""
    g = {}
    for index, head in enumerate(heads):
        x, y = batches[index]
        g.update(head_grad(index, head, p, x, y))
    return g


# --------------------------------------------------------------------- comparison
def describe_diff(actual, expected, rtol, atol):
    """One line about the worst element of ``actual`` vs ``expected``."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    err = np.abs(actual - expected)
    excess = err - (atol + rtol * np.abs(expected))
    idx = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.size else ()
    bad = int((excess > 0).sum())
    return ("%d of %d elements off; worst at %s: got %.9g, expected %.9g (|diff| %.3g); "
            "max |diff| %.3g" % (bad, err.size, tuple(int(i) for i in idx),
                                 actual[idx] if err.size else np.nan,
                                 expected[idx] if err.size else np.nan,
                                 err[idx] if err.size else np.nan,
                                 err.max() if err.size else 0.0))


def compare_trajectories(recorded, expected, num_workers, iterations, params,
                         rtol=1e-5, atol=1e-6, labels=None, max_lines=12):
    """Compare recorded(i, t) with expected(i, t) (dicts param -> array) for all
    workers i and t = 0..iterations.

    Returns:
        (ok, message): ``message`` names the first mismatching (iteration, worker,
        parameter) with the worst element, lists further mismatches, and ends with
        the largest |diff| per iteration over all workers and parameters.
    """
    failures = []
    table = []
    for t in range(iterations + 1):
        worst = 0.0
        for i in range(num_workers):
            got, want = recorded(i, t), expected(i, t)
            for n in params:
                a = np.asarray(got[n], np.float64)
                b = np.asarray(want[n], np.float64)
                if a.shape != b.shape:
                    failures.append("t=%d worker %d %s: shape %s, expected %s"
                                    % (t, i, n, a.shape, b.shape))
                    continue
                if a.size:
                    worst = max(worst, float(np.abs(a - b).max()))
                if not np.allclose(a, b, rtol=rtol, atol=atol):
                    label = (" [%s]" % labels[t]) if labels and labels[t] else ""
                    failures.append("weights after iteration %d (t=%d)%s, worker %d, %s: %s"
                                    % (t - 1, t, label, i, n,
                                       describe_diff(a, b, rtol, atol)))
        table.append("  t=%-3d max|diff| %.3g%s" % (
            t, worst, (" (%s)" % labels[t]) if labels and labels[t] else ""))
    if not failures:
        return True, ""
    lines = ["%d mismatches (rtol %g, atol %g); first:" % (len(failures), rtol, atol)]
    lines += ["  " + f for f in failures[:max_lines]]
    if len(failures) > max_lines:
        lines.append("  ... %d more" % (len(failures) - max_lines))
    lines.append("largest |diff| by t (t = weights before iteration t):")
    lines += table
    return False, "\n".join(lines)
