"""The report's figures (matplotlib, imported only when a plot is drawn).
"""
from typing import Dict, Sequence

from .summary import FAILED_POINTS, Group


# ----------------------------------------------------------------------------
# plots

def _pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


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
    fig.suptitle(title)
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
