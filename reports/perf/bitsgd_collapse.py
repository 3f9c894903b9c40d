#!/usr/bin/env python
"""Per-iteration, per-layer norms of a real distributed LeNet-5 job.

Run it as the workers' command of the launcher, with scripts/train_mnist.py's flags
plus ``--diag-out DIR``::

    python -m mxnet_cpsgd.launch -n 2 -s 1 --env MXNET_CPU_WORKER_NTHREADS=1 \\
        OMP_NUM_THREADS=1 -- python reports/perf/bitsgd_collapse.py --diag-out OUT \\
        --algorithm bitsgd --seed 1 ... (the run's own flags) ... --max-iters 937

It trains exactly as scripts/train_mnist.py (same parser, same ``common.main``); the
only additions are two wrappers installed in this process before training starts:

- ``gluon.loss.SoftmaxCrossEntropyLoss.forward`` is wrapped to keep its last
  output (the loss the loop computes before ``trainer.step``);
- ``gluon.Trainer.step`` reads every gradient before the original step and the pulled
  weights after it (``asnumpy``: it waits for the pull, it changes no value).

Per iteration t it writes one JSON line to ``DIR/diag.rank<r>.jsonl`` with, per
parameter (one store key each; LeNet-5 has no chunked parameter):

- ``g``: L2 norm of the gradient as this worker pushes it.  The stores push the raw
  batch-summed gradient (``param.send`` is a copy of the gradient); the rescale
  ``1/step_batch`` (1/64 here, ``--lr-convention mean``, M = 2) is applied by the
  servers' optimizer, so the 2-bit threshold compares against the raw sum;
- ``push``: L2 norm of what this worker sends: ``g`` on a dense iteration (warm-up,
  correction), the 2-bit output on a compressed one;
- ``res``: L2 norm of the 2-bit residual after iteration t, from a numpy replica of
  MXNet's quantizer (float32, as MXNet's ``quantize_2bit``: ``res += g``; ``+tau``
  where ``res >= tau``, ``-tau`` where ``res <= -tau``; ``res -= sent``).  Dense
  pushes leave it untouched, as in the store (tests/reference.py has the same rule);
- ``sent``: fraction of the elements sent as +-tau (0 on dense iterations);
- ``big``: fraction of elements with ``|g| >= tau`` (what a zero residual would send);
- ``cos``: cosine between the push and ``g``;
- ``upd``: L2 norm of ``W_{t+1} - W_t`` (the weights pulled after iteration t minus
  those of the iteration before; at t = 0 the weights read before the first step);
  with the servers' SGD at momentum > 0 this is the servers' momentum buffer itself;
- ``w``: L2 norm of ``W_{t+1}``;
plus ``loss`` (the sum of the batch's per-sample losses, as the loop adds it, and
``n`` the batch size), ``lr`` (the schedule at update t + 1) and ``dense``.

With ``--diag-save-window A:B`` it also saves, for t in [A, B), the flat 2-bit output
(or dense push) and the pulled weights to ``DIR/window.rank<r>.npz``, so that
``bitsgd_collapse_check.py`` can check the replica against what the servers applied.
Which iterations are compressed comes from the store's resolved knobs (threshold,
warm-up, correction period) for ``--algorithm bitsgd``; every other algorithm is
recorded as dense (the replica is meant for bitsgd and ssgd, whose workers' weights are
the pulled global weights).  Nothing here is imported by the library.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import numpy as np  # noqa: E402
from mxnet import gluon  # noqa: E402
# asnumpy retried once MKL-DNN's layout made it fail: the store's own helper
from mxnet_cpsgd.stores.state_files import to_numpy as _to_numpy  # noqa: E402


def _pop_flag(argv, flag, default=None):
    if flag in argv:
        i = argv.index(flag)
        value = argv[i + 1]
        del argv[i:i + 2]
        return value
    return default


def _value_after(argv, flag, cast, default):
    return cast(argv[argv.index(flag) + 1]) if flag in argv else default


class Recorder:
    """The state the two wrappers share."""

    def __init__(self, out_dir, argv, window):
        self.out_dir = out_dir
        self.algorithm = _value_after(argv, "--algorithm", str, "")
        # replaced by the store's resolved knobs at the first step
        self.tau = np.float32(_value_after(argv, "--threshold", float, 0.5))
        self.warmup = 0
        self.period = 0
        self.rank = 0
        self.window = window
        self.t = 0
        self.loss = None
        self.residual = {}
        self.prev_w = None
        self.file = None
        self.saved = {"t": [], "push": [], "w": []}

    def compressed(self, t):
        if self.algorithm != "bitsgd" or t < self.warmup:
            return False
        return not (self.period and (t + 1) % self.period == 0)

    def quantize(self, name, g):
        """MXNet's 2-bit quantizer (float32) with this worker's residual of ``name``."""
        res = self.residual.get(name)
        if res is None:
            res = np.zeros_like(g)
        res = res + g
        out = np.zeros_like(g)
        out[res >= self.tau] = self.tau
        out[res <= -self.tau] = -self.tau
        res = res - out
        self.residual[name] = res
        return out

    def configure(self, trainer):
        """Read the knobs the store resolved (threshold, warm-up, correction)."""
        kv = trainer._kvstore
        self.rank = kv.rank if kv is not None and not isinstance(kv, str) else 0
        config = getattr(kv, "config", None)
        if config is not None and self.algorithm == "bitsgd":
            self.tau = np.float32(config.threshold)
            self.warmup = config.warmup_steps or 0
            self.period = config.correction_period or 0

    def step(self, trainer, orig, batch_size, ignore_stale_grad):
        params = [p for p in trainer._params if p.grad_req != "null"]
        grads = {p.name: _to_numpy(p.list_grad()[0]).astype(np.float32) for p in params}
        if self.prev_w is None:
            self.prev_w = {p.name: _to_numpy(p.list_data()[0]) for p in params}
        loss = float(self.loss.sum().asscalar()) if self.loss is not None else None
        n = int(self.loss.shape[0]) if self.loss is not None else None
        orig(trainer, batch_size, ignore_stale_grad)
        if self.t == 0:
            self.configure(trainer)
        weights = {p.name: _to_numpy(p.list_data()[0]) for p in params}
        t = self.t
        compressed = self.compressed(t)
        layers = {}
        pushes = []
        for p in params:
            name = p.name
            g = grads[name]
            push = self.quantize(name, g) if compressed else g
            res = self.residual.get(name)
            gn = float(np.linalg.norm(g))
            pn = float(np.linalg.norm(push))
            layers[name] = {
                "g": gn, "push": pn,
                "res": float(np.linalg.norm(res)) if res is not None else 0.0,
                "sent": float(np.count_nonzero(push)) / push.size if compressed else 0.0,
                "big": float(np.count_nonzero(np.abs(g) >= self.tau)) / g.size,
                "cos": float(np.dot(push.ravel().astype(np.float64), g.ravel())
                             / (pn * gn)) if pn > 0 and gn > 0 else 0.0,
                "upd": float(np.linalg.norm(weights[name] - self.prev_w[name])),
                "w": float(np.linalg.norm(weights[name])),
            }
            pushes.append(push.ravel())
        if self.window and self.window[0] <= t < self.window[1]:
            self.saved["t"].append(t)
            self.saved["push"].append(np.concatenate(pushes))
            self.saved["w"].append(np.concatenate([weights[p.name].ravel() for p in params]))
            if t == self.window[0]:
                self.saved["w_before"] = np.concatenate(
                    [self.prev_w[p.name].ravel() for p in params])
                self.saved["names"] = np.array([p.name for p in params])
                self.saved["sizes"] = np.array([weights[p.name].size for p in params])
        opt = trainer._optimizer
        lr = float(opt.lr_scheduler(t + 1)) if opt.lr_scheduler is not None else opt.lr
        self.write({"t": t, "loss": loss, "n": n, "lr": lr, "dense": not compressed,
                    "layers": layers})
        self.prev_w = weights
        self.t += 1

    def write(self, record):
        if self.file is None:
            os.makedirs(self.out_dir, exist_ok=True)
            self.file = open(os.path.join(self.out_dir, "diag.rank%d.jsonl" % self.rank), "w")
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self):
        if self.window and self.saved["t"] and self.file is not None:
            np.savez_compressed(os.path.join(self.out_dir, "window.rank%d.npz" % self.rank),
                                t=np.array(self.saved["t"]), push=np.stack(self.saved["push"]),
                                w=np.stack(self.saved["w"]), w_before=self.saved["w_before"],
                                names=self.saved["names"], sizes=self.saved["sizes"])
        if self.file is not None:
            self.file.close()


def install(recorder):
    loss_class = gluon.loss.SoftmaxCrossEntropyLoss
    orig_forward = loss_class.forward  # HybridBlock.forward, inherited

    def forward(self, *args, **kwargs):
        out = orig_forward(self, *args, **kwargs)
        recorder.loss = out
        return out

    loss_class.forward = forward  # the class itself: gluon's super() calls name it
    orig = gluon.Trainer.step

    def step(self, batch_size, ignore_stale_grad=False):
        recorder.step(self, orig, batch_size, ignore_stale_grad)

    gluon.Trainer.step = step


def main():
    argv = sys.argv[1:]
    out_dir = _pop_flag(argv, "--diag-out")
    if out_dir is None:
        sys.exit("usage: bitsgd_collapse.py --diag-out DIR [--diag-save-window A:B] "
                 "TRAIN_MNIST_FLAGS...")
    window = _pop_flag(argv, "--diag-save-window")
    window = tuple(int(x) for x in window.split(":")) if window else None
    recorder = Recorder(out_dir, argv, window)
    install(recorder)
    import train_mnist  # scripts/train_mnist.py: its parser and defaults
    from mxnet_cpsgd.training import common
    try:
        return common.main(train_mnist.get_parser(), argv=argv)
    finally:
        recorder.close()


if __name__ == "__main__":
    sys.exit(main())
