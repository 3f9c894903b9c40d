"""The report's figures (matplotlib, imported only when a plot is drawn).
"""
import statistics
import textwrap
from typing import Dict, Sequence

from .summary import FAILED_POINTS, Group


# ----------------------------------------------------------------------------
# plots

def _pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _fit_title(title: str, fig) -> str:
    """The title broken into lines no wider than the figure (about 10 characters an inch),
    so that a long title neither runs off the page nor squeezes the axes."""
    return textwrap.fill(title, int(10 * fig.get_figwidth()))


def plot_curves(groups: Sequence[Group], path: str, title: str) -> None:
    """Validation accuracy (left) and training loss (right) vs epoch, one line per run."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for g in groups:
        acc = g.mean_series("val_acc")
        loss = g.mean_series("train_loss")
        style = "-" if g.algorithm != "cpsgd" else "--"
        if acc:
            ax1.plot([e + 1 for e, _ in acc], [100 * v for _, v in acc], style,
                     marker="o", ms=3, label=g.label)
        if loss:
            ax2.plot([e + 1 for e, _ in loss], [v for _, v in loss], style,
                     marker="o", ms=3, label=g.label)
    from matplotlib.ticker import MaxNLocator
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("validation accuracy (%)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("training loss")
    ax2.set_yscale("log")
    ax2.grid(alpha=0.3)
    fig.suptitle(_fit_title(title, fig))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ref_style(label: str) -> str:
    return {"SSGD": ":", "BIT": "--", "OD": "-."}.get(label, (0, (1, 3)))


def plot_k_sensitivity(entries: Sequence[Dict[str, object]], path: str) -> None:
    """Final validation accuracy (left; runs with several epochs only; bars: std
    over seeds) and Te
    (right; relative to S-SGD's Te of the same setting when every setting has
    S-SGD, so that settings of very different speed share one axis) vs k, one
    line per (experiment, M, rate); S-SGD/BIT-SGD/OD-SGD as horizontal references
    (on the left only those within FAILED_POINTS of S-SGD: a run that did not
    train would flatten the axis; the tables list it)."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    relative = all((e["references"].get("SSGD") or (None, None))[1] for e in entries
                   if e["k"])
    for i, e in enumerate(entries):
        color = colors[i % len(colors)]
        name = "%s M=%d %s" % (e["experiment"], e["num_workers"], e["rate"] or "loopback")
        ks = e["k"]
        if not ks:
            continue
        refs = e["references"]
        if e["epochs"] > 1:
            stds = e.get("final_val_acc_std") or [None] * len(ks)
            pts = [(k, v, sd) for k, v, sd in zip(ks, e["final_val_acc"], stds)
                   if v is not None]
            if pts:
                # error bars: std over seeds (absent with one seed)
                errs = [100 * (sd or 0.0) for _, _, sd in pts]
                ax1.errorbar([k for k, _, _ in pts], [100 * v for _, v, _ in pts],
                             yerr=errs if any(errs) else None, fmt="o-", capsize=3,
                             color=color, label=name)
            base_acc = (refs.get("SSGD") or (None, None))[0]
            for label, (acc, _) in sorted(refs.items()):
                if acc is None or (base_acc is not None and
                                   100 * (base_acc - acc) > FAILED_POINTS):
                    continue
                ax1.axhline(100 * acc, color=color, ls=_ref_style(label), lw=1,
                            label="%s (%s)" % (label, name))
        scale = refs["SSGD"][1] if relative else 1.0
        pts = [(k, v / scale) for k, v in zip(ks, e["te"]) if v is not None]
        if pts:
            ax2.plot([k for k, _ in pts], [v for _, v in pts], "o-", color=color, label=name)
        for label, (_, te) in sorted(refs.items()):
            if te is not None:
                ax2.axhline(te / scale, color=color, ls=_ref_style(label), lw=1,
                            label="%s (%s)" % (label, name))
    all_k = sorted({k for e in entries for k in e["k"]})
    ylabel2 = "Te relative to S-SGD's" if relative else "Te: epoch time (s)"
    for ax, ylabel in ((ax1, "final validation accuracy (%)"), (ax2, ylabel2)):
        ax.set_xscale("log", base=2)
        if all_k:
            ax.set_xticks(all_k)
            ax.set_xticklabels([str(k) for k in all_k])
            ax.minorticks_off()
        ax.set_xlabel("correction period k")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    ax1.set_title("accuracy vs k")
    ax2.set_title("epoch time vs k")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_iteration_bands(panels: Sequence[Dict[str, object]], path: str, title: str) -> None:
    """Validation accuracy vs iterations, one panel per M: per label the mean over
    seeds (line) and the range over seeds (band), distinct colours (a label keeps its
    colour in every panel), the legend outside the axes.  A seed that ended more than
    FAILED_POINTS below the median of its label's seeds did not train: it is left out
    of the mean and the band (it would flatten the others' curves), and the legend
    counts it and gives its final accuracy.

    Args:
        panels: ``[{'name': 'M=2', 'lines': [{'label', 'seeds': [[(iteration,
            accuracy), ...] per seed]}]}]``; accuracies as fractions.
        path: PNG to write.
        title: the figure's title.
    """
    plt = _pyplot()
    labels = list(dict.fromkeys(line["label"] for p in panels for line in p["lines"]))
    cmap = plt.get_cmap("tab20" if len(labels) > 10 else "tab10")
    colors = {label: cmap(i % cmap.N) for i, label in enumerate(labels)}
    # past the colour map's colours a label is told apart by a dashed line
    styles = {label: "-" if i < cmap.N else "--" for i, label in enumerate(labels)}
    cols = len(panels) if len(panels) <= 3 else 2
    rows = -(-len(panels) // cols)
    # the legend under each panel: up to 12 entries a column, up to 3 columns; the
    # figure grows by its rows so that neither legend nor title overlaps the axes
    most = max(len(p["lines"]) for p in panels) if panels else 1
    legend_cols = min(3, 1 + (most - 1) // 12)
    legend_rows = -(-most // legend_cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols + 0.5,
                                                  (4.6 + 0.2 * legend_rows) * rows + 0.8),
                             squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        for line in panel["lines"]:
            seeds = [s for s in line["seeds"] if s]
            if not seeds:
                continue
            color = colors[line["label"]]
            median = statistics.median(100 * s[-1][1] for s in seeds)
            failed = [s for s in seeds if median - 100 * s[-1][1] > FAILED_POINTS]
            everyone = len(seeds)
            seeds = [s for s in seeds if median - 100 * s[-1][1] <= FAILED_POINTS]
            n = min(len(s) for s in seeds)
            xs = [seeds[0][i][0] for i in range(n)]
            vals = [[100 * s[i][1] for s in seeds] for i in range(n)]
            mean = [sum(v) / len(v) for v in vals]
            ax.plot(xs, mean, styles[line["label"]], marker="o", ms=3, color=color,
                    label="%s (%d seed%s%s)" % (
                        line["label"], everyone, "s" if everyone > 1 else "",
                        "; %d did not train, not drawn: final %s %%" % (
                            len(failed), ", ".join("%.2f" % (100 * f[-1][1]) for f in failed))
                        if failed else ""))
            if len(seeds) > 1:
                ax.fill_between(xs, [min(v) for v in vals], [max(v) for v in vals],
                                color=color, alpha=0.18, lw=0)
        ax.set_title(panel["name"])
        ax.set_xlabel("iterations")
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
        # each panel's own legend (its seed counts) under its axes, off the data
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8,
                  frameon=False, ncol=legend_cols)
    fig.suptitle(_fit_title(title, fig))
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_paired_bars(diffs: Sequence[object], path: str, title: str) -> None:
    """One bar per comparison: the mean paired difference of final accuracy to the
    reference (points) over the seeds that trained, with its 95 % interval; a bar of
    a single trained seed is drawn hatched, without an interval.  Seeds that did not
    train (more than FAILED_POINTS below their reference: a collapse) are left out
    of the bar and its interval and counted in its tick label ("1 > 20 below"), so
    that one collapse does not hide the other seeds' difference; a comparison in
    which no seed trained is a bar at its mean, cut at -FAILED_POINTS with its value
    written on it.

    Args:
        diffs: :class:`~mxnet_cpsgd.repro.paired.PairedDiff` objects, in bar order.
        path: PNG to write.
        title: the figure's title.
    """
    plt = _pyplot()
    diffs = [d for d in diffs if d.n]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(diffs) + 2.0), 4.6))
    cmap = plt.get_cmap("tab10")
    refs = list(dict.fromkeys(d.reference for d in diffs))
    floor = -FAILED_POINTS
    shown = [t if t.n else d for d, t in ((d, d.trained()) for d in diffs)]
    lows = [min(s.diffs + ([s.ci[0]] if s.ci else [])) for s in shown]
    highs = [max(s.diffs + ([s.ci[1]] if s.ci else [])) for s in shown]
    bottom = max(floor, min(lows + [0.0]))
    top = max(highs + [0.0])
    span = max(top - bottom, 1.0)
    bottom -= 0.12 * span   # room for a cut bar's value, written above the axis floor
    for i, (d, sd) in enumerate(zip(diffs, shown)):
        color = cmap(refs.index(d.reference) % cmap.N)
        ci = sd.ci
        ax.bar(i, max(sd.mean, bottom), color=color, alpha=0.8 if ci else 0.35,
               hatch=None if ci else "//", edgecolor=color)
        if ci:
            ax.errorbar(i, sd.mean, yerr=[[sd.mean - ci[0]], [ci[1] - sd.mean]],
                        fmt="none", ecolor="black", capsize=4)
        ax.plot([i] * sd.n, [max(v, bottom) for v in sd.diffs], "k.", ms=4)
        if sd is d and d.mean < bottom:
            ax.text(i, bottom + 0.02 * span, "%.1f\n(cut)" % d.mean, ha="center",
                    va="bottom", fontsize=7)
    ax.set_ylim(bottom, top + 0.1 * span)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(diffs)))
    ax.set_xticklabels(["%s\n(n=%d%s)" % (
        d.label, d.n, "; %d > %.0f below, not in bar" % (len(d.not_trained), FAILED_POINTS)
        if d.not_trained and sd is not d else "") for d, sd in zip(diffs, shown)],
        rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("final accuracy minus reference (points)")
    from matplotlib.patches import Patch
    ax.legend([Patch(color=cmap(i % cmap.N)) for i in range(len(refs))],
              ["vs %s" % r for r in refs], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(_fit_title(title, fig), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_time_to_accuracy(panels: Sequence[Dict[str, object]], path: str, title: str) -> None:
    """Horizontal bars of a combined time to accuracy, one panel per experiment.

    Args:
        panels: each ``{"name": str, "bars": [{"label": str, "seconds": float or None,
            "seed_seconds": [float, ...]}]}``; a bar whose time is None (target not
            reached, or no time per iteration) is left empty and labelled so.
        path: PNG to write.
        title: the figure's title.
    """
    plt = _pyplot()
    rows = max(len(p["bars"]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 0.45 * rows + 1.6),
                             squeeze=False)
    for ax, panel in zip(axes[0], panels):
        bars = panel["bars"]
        top = max([b["seconds"] or 0.0 for b in bars]
                  + [s for b in bars for s in b["seed_seconds"]] + [1.0])
        for i, b in enumerate(bars):
            if b["seconds"] is None:
                ax.text(0.01 * top, i, "not reached / not timed", va="center", fontsize=7)
                continue
            ax.barh(i, b["seconds"], color="tab:blue", alpha=0.7)
            ax.plot(b["seed_seconds"], [i] * len(b["seed_seconds"]), "k.", ms=4)
            ax.text(0.01 * top, i, "%.0f s" % b["seconds"], va="center", fontsize=7,
                    color="white")
        ax.set_yticks(range(len(bars)))
        ax.set_yticklabels([b["label"] for b in bars], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1.2 * top)
        ax.set_xlabel("s to target (iterations x ms per iteration, combined)",
                      fontsize=8)
        ax.set_title(panel["name"], fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(_fit_title(title, fig), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
