#!/usr/bin/env python
"""Check bitsgd_collapse.py's numpy 2-bit replica against what the servers applied.

    python reports/perf/bitsgd_collapse_check.py DIR --lr 0.05 --momentum 0.9 --wd 1e-4 \\
        --step-batch 64 --max-update 3748

``DIR`` holds ``window.rank0.npz`` and ``window.rank1.npz`` (``--diag-save-window``).
The servers run MXNet's SGD on the sum s_t of the M pushes of round t:
``m_t = mu m_{t-1} - lr_t (s_t / step_batch + wd W_t)``, ``W_{t+1} = W_t + m_t``, so
from three consecutive pulled weights ``s_t = step_batch (-(m_t - mu m_{t-1}) / lr_t -
wd W_t)``.  The script compares that with the sum of the workers' recorded pushes
(the replica's 2-bit output on compressed iterations, the gradient on dense ones) and
prints, per iteration, the largest absolute difference over all 61,706 elements.
lr_t is MXNet's CosineScheduler (base lr, final 0) at update t + 1.
"""
import argparse
import os

import numpy as np
import mxnet as mx


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("dir")
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--momentum", type=float, required=True)
    ap.add_argument("--wd", type=float, required=True)
    ap.add_argument("--step-batch", type=float, required=True)
    ap.add_argument("--max-update", type=int, required=True)
    args = ap.parse_args()
    ranks = []
    r = 0
    while os.path.exists(os.path.join(args.dir, "window.rank%d.npz" % r)):
        ranks.append(np.load(os.path.join(args.dir, "window.rank%d.npz" % r)))
        r += 1
    sched = mx.lr_scheduler.CosineScheduler(max_update=args.max_update, base_lr=args.lr,
                                            final_lr=0)
    ts = ranks[0]["t"]
    w = [d["w"].astype(np.float64) for d in ranks]
    same = all(np.array_equal(w[0], x) for x in w[1:])
    print("workers: %d; pulled weights identical on every worker: %s" % (len(ranks), same))
    W = np.concatenate([ranks[0]["w_before"][None].astype(np.float64), w[0]])  # W_A..W_B
    push = sum(d["push"].astype(np.float64) for d in ranks)
    worst = 0.0
    for i in range(1, len(ts)):
        t = int(ts[i])
        m_t = W[i + 1] - W[i]
        m_prev = W[i] - W[i - 1]
        lr = float(sched(t + 1))
        s = args.step_batch * (-(m_t - args.momentum * m_prev) / lr - args.wd * W[i])
        diff = np.abs(s - push[i])
        worst = max(worst, float(diff.max()))
        print("t=%d lr=%.6f |s - sum of pushes|: max %.2e, mean %.2e; |sum of pushes| max "
              "%.3f; elements differing by >= 0.25: %d"
              % (t, lr, diff.max(), diff.mean(), np.abs(push[i]).max(),
                 int((diff >= 0.25).sum())))
    print("largest difference over the window: %.3e" % worst)


if __name__ == "__main__":
    main()
