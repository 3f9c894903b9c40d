#!/usr/bin/env python
"""Tables and the figure of reports/perf/bitsgd-collapse.md from bitsgd_collapse.py's records.

    python reports/perf/bitsgd_collapse_report.py DIR [--png reports/perf/bitsgd-collapse.png]

``DIR/<label>/diag.rank<r>.jsonl`` per run (labels: SSGD, BIT-wu, BIT-wu-mom0,
BIT-corr5, ...).  Parameters are grouped into LeNet-5's five layers (weight and bias
together: the L2 norm over both; the sent fraction weighted by size).  Prints
markdown: the loss check against reports/reproduction-3rd, then per run and layer the
window means of rank 0's norms, and the loss per window (both workers).
"""
import argparse
import gzip
import json
import math
import os
import re

import numpy as np

LAYERS = ("conv0", "conv1", "dense0", "dense1", "dense2")
SIZES = {"conv0_weight": 150, "conv0_bias": 6, "conv1_weight": 2400, "conv1_bias": 16,
         "dense0_weight": 48000, "dense0_bias": 120, "dense1_weight": 10080,
         "dense1_bias": 84, "dense2_weight": 840, "dense2_bias": 10}
QUANTITIES = ("g", "push", "res", "upd", "w")
REPORT_RUNS = {"SSGD": "SSGD", "BIT-wu": "BIT-wu", "BIT-wu-mom0": "BIT-wu-mom0",
               "BIT-corr5": "BIT-corr5"}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def per_layer(records, step_batch):
    """arrays[layer][quantity] over iterations; plus 'sent' and 'cos' (size-weighted),
    'backlog' and 'gain' (derived, see the tables' titles)."""
    lr = np.array([rec["lr"] for rec in records])
    out = {}
    for layer in LAYERS:
        q = {k: [] for k in QUANTITIES + ("sent", "big", "cos")}
        for rec in records:
            parts = {re.sub(r"^lenet\d+_", "", n): v for n, v in rec["layers"].items()}
            mine = [(n, v) for n, v in parts.items() if n.startswith(layer + "_")]
            for k in QUANTITIES:
                q[k].append(math.sqrt(sum(v[k] ** 2 for _, v in mine)))
            total = sum(SIZES[n] for n, _ in mine)
            for k in ("sent", "big"):
                q[k].append(sum(v[k] * SIZES[n] for n, v in mine) / total)
            # cosine of the concatenated (weight, bias) push and gradient
            dot = sum(v["cos"] * v["push"] * v["g"] for _, v in mine)
            pn, gn = q["push"][-1], q["g"][-1]
            q["cos"].append(dot / (pn * gn) if pn > 0 and gn > 0 else 0.0)
        out[layer] = {k: np.array(v) for k, v in q.items()}
        # RMS residual per element in units of tau: how many iterations of +-tau
        # pushes the residual holds (tau = 0.5 in every run here)
        size = sum(v for n, v in SIZES.items() if n.startswith(layer + "_"))
        out[layer]["backlog"] = out[layer]["res"] / math.sqrt(size) / 0.5
        # tau relative to the RMS gradient element of the layer
        g = out[layer]["g"]
        with np.errstate(divide="ignore", invalid="ignore"):
            out[layer]["tau_rel"] = np.where(g > 0, 0.5 / (g / math.sqrt(size)), np.nan)
        # the applied update relative to the step this worker's push alone would make
        # without momentum (lr_t x rescale x ||push||): at most M / (1 - mu) when both
        # workers push the same values every iteration
        # (nan where nothing was pushed, e.g. a layer whose gradient is 0: dead ReLUs)
        push = out[layer]["push"]
        with np.errstate(divide="ignore", invalid="ignore"):
            out[layer]["gain"] = np.where(push > 0, out[layer]["upd"] / (lr * push / step_batch),
                                          np.nan)
    return out


def find(run_dir, rank):
    for name in ("diag.rank%d.jsonl" % rank, "diag.rank%d.jsonl.gz" % rank):
        p = os.path.join(run_dir, name)
        if os.path.exists(p):
            return p
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--report-runs", default="reports/reproduction-3rd/runs/m2")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--png", default=None)
    ap.add_argument("--step-batch", type=float, default=64.0,
                    help="the Trainer's step batch: the servers' rescale is its inverse")
    ap.add_argument("--windows", default="350:370,370:380,380:400,400:440,440:500,"
                                         "500:650,650:937")
    args = ap.parse_args()
    labels = [l for l in ("SSGD", "BIT-wu", "BIT-wu-mom0", "BIT-corr5", "SSGD-mom0")
              if os.path.isdir(os.path.join(args.dir, l))]
    runs = {}
    for label in labels:
        ranks = []
        r = 0
        while find(os.path.join(args.dir, label), r):
            ranks.append(load(find(os.path.join(args.dir, label), r)))
            r += 1
        runs[label] = ranks
    windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]

    print("### Loss check against the report's runs (epoch 0, 937 iterations)\n")
    print("| run | rank | train loss, this diagnostic | same command without the "
          "diagnostic (DIR/plain-<run>/log.json) | report's log (reports/reproduction-3rd) |")
    print("| :--- | ---: | ---: | ---: | ---: |")
    for label, ranks in runs.items():
        for r, recs in enumerate(ranks):
            if len(recs) < 937:
                continue
            loss = 0.0
            count = 0
            for rec in recs[:937]:
                loss += rec["loss"]
                count += rec["n"]
            mine = loss / count
            log = os.path.join(args.report_runs, "%s-M2-loopback-s%d" % (label, args.seed),
                               "log.json" if r == 0 else "log.rank%d.json" % r)
            plain = os.path.join(args.dir, "plain-" + label,
                                 "log.json" if r == 0 else "log.rank%d.json" % r)
            cells = []
            for path in (plain, log):
                if os.path.exists(path):
                    with open(path) as f:
                        ref = json.loads(f.readline())["train_loss"]
                    cells.append("%r (%s)" % (ref, "equal" if ref == mine else "differs"))
                else:
                    cells.append("not run")
            print("| %s | %d | %r | %s |" % (label, r, mine, " | ".join(cells)))
    print()

    print("### Training loss per window (mean per sample, both workers)\n")
    print("| run | " + " | ".join("%d-%d" % (a, b - 1) for a, b in windows) + " |")
    print("| :--- |" + " ---: |" * len(windows))
    for label, ranks in runs.items():
        cells = []
        for a, b in windows:
            tot = sum(rec["loss"] for recs in ranks for rec in recs[a:b])
            n = sum(rec["n"] for recs in ranks for rec in recs[a:b])
            cells.append("%.3f" % (tot / n) if n else "-")
        print("| %s | %s |" % (label, " | ".join(cells)))
    print()

    print("### Training loss per 10 iterations around the switch (mean per sample, both "
          "workers)\n")
    starts = list(range(350, 520, 10))
    print("| run | " + " | ".join("%d-" % a for a in starts) + " |")
    print("| :--- |" + " ---: |" * len(starts))
    for label, ranks in runs.items():
        cells = []
        for a in starts:
            tot = sum(rec["loss"] for recs in ranks for rec in recs[a:a + 10])
            n = sum(rec["n"] for recs in ranks for rec in recs[a:a + 10])
            cells.append("%.2f" % (tot / n) if n else "-")
        print("| %s | %s |" % (label, " | ".join(cells)))
    print()

    layered = {label: per_layer(ranks[0], args.step_batch) for label, ranks in runs.items()}
    for qty, title in (("g", "gradient as pushed, ||g|| (raw batch sum, rank 0)"),
                       ("tau_rel", "tau / RMS gradient element (rank 0)"),
                       ("push", "what rank 0 pushes, ||push|| (g when dense)"),
                       ("cos", "cosine(push, g), rank 0"),
                       ("sent", "fraction of elements sent as +-tau, rank 0"),
                       ("big", "fraction of elements with |g| >= tau, rank 0"),
                       ("res", "2-bit residual after the iteration, ||res|| (rank 0)"),
                       ("backlog", "RMS residual per element / tau (rank 0)"),
                       ("upd", "applied update ||W_{t+1} - W_t||"),
                       ("gain", "||W_{t+1} - W_t|| / (lr_t ||push|| / 64), rank 0's push"),
                       ("w", "weights ||W_{t+1}||")):
        print("### %s: window means\n" % title)
        print("| run | layer | " + " | ".join("%d-%d" % (a, b - 1) for a, b in windows) + " |")
        print("| :--- | :--- |" + " ---: |" * len(windows))
        for label, lay in layered.items():
            if qty in ("res", "sent", "backlog") and not label.startswith("BIT"):
                continue
            for layer in LAYERS:
                arr = lay[layer][qty]
                fmt = "%.3f" if qty in ("cos", "sent", "big") else \
                    "%.2f" if qty in ("gain", "tau_rel") else "%.3g"
                cells = [fmt % np.nanmean(arr[a:b])
                         if len(arr[a:b]) and not np.isnan(arr[a:b]).all() else "-"
                         for a, b in windows]
                print("| %s | %s | %s |" % (label, layer, " | ".join(cells)))
        print()

    if args.png:
        plot(args.png, runs, layered)


def smooth(x, n=10):
    """Trailing mean over n iterations (the first n - 1 points: over what there is)."""
    c = np.cumsum(np.insert(np.asarray(x, float), 0, 0.0))
    out = np.empty(len(x))
    for i in range(len(x)):
        lo = max(0, i + 1 - n)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def plot(png, runs, layered):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"SSGD": "tab:blue", "BIT-wu": "tab:red", "BIT-wu-mom0": "tab:green",
              "BIT-corr5": "tab:orange", "SSGD-mom0": "tab:cyan"}
    rows = (("upd", "||W_{t+1} - W_t||"), ("g", "||g|| (raw batch sum)"),
            ("res", "||2-bit residual||"),
            ("gain", "||W_{t+1}-W_t|| / (lr ||push|| / 64)"))
    fig = plt.figure(figsize=(20, 17))
    grid = fig.add_gridspec(len(rows) + 1, len(LAYERS))
    top = fig.add_subplot(grid[0, :])
    axes = [[fig.add_subplot(grid[i, j]) for j in range(len(LAYERS))]
            for i in range(1, len(rows) + 1)]
    for label, ranks in runs.items():
        recs = ranks[0]
        t = np.array([rec["t"] for rec in recs])
        loss = np.array([np.mean([rr[i]["loss"] / rr[i]["n"] for rr in ranks
                                  if i < len(rr)]) for i in range(len(recs))])
        top.plot(t, smooth(loss), color=colors[label], lw=1.0, label=label)
        for i, (qty, name) in enumerate(rows):
            if qty == "res" and not label.startswith("BIT"):
                continue
            for j, layer in enumerate(LAYERS):
                ax = axes[i][j]
                y = layered[label][layer][qty]
                ax.plot(t, y if qty == "res" else smooth(y), color=colors[label], lw=0.8,
                        label=label)
                ax.set_yscale("log")
                if i == 0:
                    ax.set_title(layer)
                if j == 0:
                    ax.set_ylabel(name)
    top.set_ylabel("training loss (batch mean, both workers)")
    top.legend(loc="upper right")
    for ax in [top] + [a for row in axes for a in row]:
        ax.axvline(370, color="k", lw=0.8, ls=":")
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("iteration t")
    fig.suptitle("LeNet-5 / Fashion-MNIST, M = 2 workers + 1 server, seed 1, lr 0.05 cosine "
                 "(mean convention), tau 0.5, dense warm-up until t = 370 (dotted). Rank 0, "
                 "per layer (weight and bias); trailing 10-iteration means except the "
                 "residual")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(png, dpi=72)
    print("wrote %s" % png)


if __name__ == "__main__":
    main()
