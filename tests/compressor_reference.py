"""Independent numpy reference (float64) of the compressing all-reduce stores.

Written from the rules in docs/algorithms/{signsgd,topk,powersgd,acpsgd}.md and
the papers, not from the stores' code.  Every worker ``i`` has its own
error-feedback residual per parameter; the exchange returns to every worker
the sum over workers of the decoded messages, and the Trainer's SGD
(``rescale 1/B``) is applied to it on every worker (see tests/reference.py SGD).

Keys: ``gluon.Trainer`` numbers its parameters 0..L-1 in its own order; the
low-rank factors of the parameter with key ``k`` start from
``RandomState(crc32("<p|q>:<k>") + 20190 mod 2**32).standard_normal((rows, r))``.
"""
import math
import zlib

import numpy as np

EPS = 1e-8


def initial_factor(key, which, rows, rank):
    seed = (zlib.crc32(("%s:%d" % (which, key)).encode()) + 20190) % 2 ** 32
    return np.random.RandomState(seed).standard_normal((rows, rank))


def gram_schmidt(a):
    """Columns normalised by (norm + EPS), each projected out of the later ones."""
    a = np.array(a, np.float64)
    for i in range(a.shape[1]):
        a[:, i] /= np.sqrt(np.sum(a[:, i] ** 2)) + EPS
        for j in range(i + 1, a.shape[1]):
            a[:, j] -= np.dot(a[:, i], a[:, j]) * a[:, i]
    return a


def as_matrix(x):
    return x.reshape(x.shape[0], -1)


class SignRef:
    """EF-SignSGD: p = g + e; c = mean|p| * sign(p) (sign(0) = +1); e = p - c."""

    def __init__(self, workers, knobs):
        self.e = [{} for _ in range(workers)]

    def exchange(self, name, key, grads):
        total = 0.0
        for i, g in enumerate(grads):
            p = g.ravel() + self.e[i].get(name, 0.0)
            c = np.abs(p).sum() / p.size * np.where(p >= 0, 1.0, -1.0)
            self.e[i][name] = p - c
            total = total + c
        return total.reshape(grads[0].shape)


class TopKRef:
    """Top-k: k = max(1, round_half_up(ratio * d)) largest |g + e| are sent."""

    def __init__(self, workers, knobs):
        self.ratio = knobs.get("ratio", 0.01)
        self.e = [{} for _ in range(workers)]

    def exchange(self, name, key, grads):
        total = 0.0
        for i, g in enumerate(grads):
            p = g.ravel() + self.e[i].get(name, 0.0)
            k = max(1, int(math.floor(self.ratio * p.size + 0.5)))
            top = np.argsort(-np.abs(p), kind="stable")[:k]
            c = np.zeros_like(p)
            c[top] = p[top]
            self.e[i][name] = p - c
            total = total + c
        return total.reshape(grads[0].shape)


class PowerSGDRef:
    """PowerSGD, rank r, warm start with the mean Q, residual A - (P Q_sum^T) / M."""

    def __init__(self, workers, knobs):
        self.rank = knobs.get("rank", 4)
        self.m = workers
        self.e = [{} for _ in range(workers)]
        self.q = {}

    def exchange(self, name, key, grads):
        shape = grads[0].shape
        if len(shape) < 2:
            return sum(grads)
        n, m = as_matrix(grads[0]).shape
        r = min(self.rank, n, m)
        if r * (n + m) >= n * m / 2.0:
            return sum(grads)
        q = self.q.get(name)
        if q is None:
            q = initial_factor(key, "q", m, r)
        a = [as_matrix(g) + self.e[i].get(name, 0.0) for i, g in enumerate(grads)]
        p = gram_schmidt(sum(ai @ q for ai in a))
        q_sum = sum(ai.T @ p for ai in a)
        out = p @ q_sum.T
        for i in range(self.m):
            self.e[i][name] = a[i] - out / self.m
        self.q[name] = q_sum / self.m
        return out.reshape(shape)


class ACPSGDRef:
    """ACP-SGD: P steps and Q steps alternate (P first), local residuals."""

    def __init__(self, workers, knobs):
        self.rank = knobs.get("rank", 4)
        self.e = [{} for _ in range(workers)]
        self.p, self.q, self.steps = {}, {}, {}

    def exchange(self, name, key, grads):
        shape = grads[0].shape
        if len(shape) < 2:
            return sum(grads)
        n, m = as_matrix(grads[0]).shape
        r = min(self.rank, n, m)
        if name not in self.p:
            self.p[name] = initial_factor(key, "p", n, r)
            self.q[name] = initial_factor(key, "q", m, r)
        step = self.steps.get(name, 0)
        self.steps[name] = step + 1
        a = [as_matrix(g) + self.e[i].get(name, 0.0) for i, g in enumerate(grads)]
        if step % 2 == 0:
            q = gram_schmidt(self.q[name])
            ps = [ai @ q for ai in a]
            for i, ai in enumerate(a):
                self.e[i][name] = ai - ps[i] @ q.T
            self.q[name] = q
            self.p[name] = sum(ps)
            out = self.p[name] @ q.T
        else:
            p = gram_schmidt(self.p[name])
            qs = [ai.T @ p for ai in a]
            for i, ai in enumerate(a):
                self.e[i][name] = ai - p @ qs[i].T
            self.p[name] = p
            self.q[name] = sum(qs)
            out = p @ self.q[name].T
        return out.reshape(shape)


class FP16Ref:
    """Half precision: every worker rounds g to float16; the sum is taken in float16
    (each addition of two halves rounded to float16); no error memory."""

    def __init__(self, workers, knobs):
        self.e = [{} for _ in range(workers)]

    def exchange(self, name, key, grads):
        total = np.asarray(grads[0]).astype(np.float16)
        for g in grads[1:]:
            total = total + np.asarray(g).astype(np.float16)
        return total.astype(np.float64)


RULES = {"signsgd": SignRef, "topk": TopKRef, "powersgd": PowerSGDRef, "acpsgd": ACPSGDRef,
         "fp16": FP16Ref}


def simulate(algorithm, knobs, w0, grads, keys, sgd, workers=2):
    """Weights after every step.

    Args:
        w0: name -> initial weights.
        grads: grads[t][i][name], worker i's gradient at step t (summed over its batch).
        keys: name -> the Trainer's key of the parameter.
        sgd: tests/reference.SGD with the Trainer's settings (rescale 1/B).

    Returns:
        list of name -> weights, index t = weights after t steps (0..T).
    """
    knobs = dict(knobs or {})
    warmup = knobs.pop("warmup_steps", 0)
    rule = RULES[algorithm](workers, knobs)
    w = {n: np.array(a, np.float64) for n, a in w0.items()}
    out = [w]
    for t, step_grads in enumerate(grads):
        new = {}
        for name in w:
            gs = [np.asarray(step_grads[i][name], np.float64) for i in range(workers)]
            total = sum(gs) if t < warmup else rule.exchange(name, keys[name], gs)
            new[name] = sgd.step(name, w[name], total)
        w = new
        out.append(w)
    return out


def simulate_cp(compressor, knobs, w0, grads, keys, sgd, local_sgds, workers=2):
    """CP-SGD around ``compressor`` on all-reduce (docs/algorithms/cp-compressors.md).

    Per step t (from 0) and parameter, with k = correction_period:

    * t < warmup_steps: W <- Opt_g(W, sum_i g_i); every L_i <- W;
    * otherwise L_i <- Opt_l_i(W, g_i) (W before this step's update) and
      W <- Opt_g(W, x) with x = sum_i g_i when (t + 1 - phase) % k == 0 (phase 0
      for every parameter, or with correction_schedule 'staggered' the
      parameter's own phase from reference.staggered_phases; the memories
      untouched; with correction_residual 'fold': x = sum_i (g_i + e_i) and every
      e_i emptied), else x = the compressor's exchange of the g_i (its memory,
      factors and P/Q alternation move on these steps only).

    momentum_path 'worker': Opt_g is ``sgd`` without momentum and weight decay;
    worker i keeps u_i (0 at first, constant lr) and at every step sets
    u_i <- mu * u_i + g_i + wd * W / (r * M) (mu, wd, r of ``sgd``); u_i takes g_i's
    place in everything above, and in the local step unless local_input is
    'gradient'.

    Args:
        grads: grads[t][i][name], worker i's gradient at its own weights L_i.
        sgd: the Trainer's SGD (Opt_g, one state: W is the same everywhere).
        local_sgds: one SGD per worker (Opt_l, own state each).

    Returns:
        (W, L): W[t] name -> global weights after t steps; L[t][i] worker i's.
    """
    knobs = dict(knobs or {})
    period = knobs.pop("correction_period", 5)
    warmup = knobs.pop("warmup_steps", 1000)
    fold = knobs.pop("correction_residual", "carry") == "fold"
    phase = {n: 0 for n in w0}
    if knobs.pop("correction_schedule", "aligned") == "staggered":
        # each parameter dense every period-th step at its own phase (tests/reference.py)
        from reference import staggered_phases
        phase = staggered_phases({n: w0[n] for n in sorted(w0, key=keys.get)}, period)
    for k in ("local_lr", "local_momentum", "local_wd", "local_optimizer"):
        knobs.pop(k, None)
    worker = knobs.pop("momentum_path", "server") == "worker"
    local_reads_g = knobs.pop("local_input", None) == "gradient"
    mu, wd, r = sgd.momentum, sgd.wd, sgd.rescale
    if worker:
        sgd = type(sgd)(sgd.lr, 0.0, 0.0, rescale=r)
    u = [{n: 0.0 for n in w0} for _ in range(workers)]
    rule = RULES[compressor](workers, knobs)
    w = {n: np.array(a, np.float64) for n, a in w0.items()}
    local = [dict(w) for _ in range(workers)]
    out_w, out_l = [w], [local]
    for t, step_grads in enumerate(grads):
        new_w, new_l = {}, [{} for _ in range(workers)]
        for name in w:
            gs = [np.asarray(step_grads[i][name], np.float64) for i in range(workers)]
            own = gs
            if worker:
                for i in range(workers):
                    u[i][name] = mu * u[i][name] + gs[i] + wd * w[name] / (r * workers)
                gs = [u[i][name] for i in range(workers)]
                own = own if local_reads_g else gs
            if t < warmup:
                total = sum(gs)
            elif (t + 1 - phase[name]) % period == 0:
                if fold:
                    gs = [g + rule.e[i].pop(name, 0.0).reshape(g.shape)
                          if name in rule.e[i] else g for i, g in enumerate(gs)]
                total = sum(gs)
            else:
                total = rule.exchange(name, keys[name], gs)
            new_w[name] = sgd.step(name, w[name], total)
            for i in range(workers):
                new_l[i][name] = (new_w[name] if t < warmup else
                                  local_sgds[i].step(name, w[name], own[i]))
        w, local = new_w, new_l
        out_w.append(w)
        out_l.append(local)
    return out_w, out_l
