"""The accuracy figures of a reproduction's report (:func:`.report.generate`):
the figures its spec asks for, per experiment the accuracy bands over seeds and
the seed-paired bars, and the accuracy curves of every setting.  Each function
appends the figures' links to the report's Markdown and returns their file names.
"""
import os
from typing import Dict, List, Sequence

from .summary import Group, setting_keys, setting_name
from .markdown import figure_name
from .plots import plot_curves, plot_iteration_bands, plot_paired_bars
from .paired import iteration_series, paired_differences


def accuracy_figures(meta: Dict[str, object], acc_groups: List[Group], out_dir: str,
                      md: List[str]) -> List[str]:
    """The spec's figures, per experiment the bands and paired bars, and the
    accuracy curves; appends their links to ``md``, returns their file names."""
    figures: List[str] = []
    settings = setting_keys(acc_groups)
    if meta.get("figures"):
        figures += _spec_figures(meta["figures"], acc_groups, out_dir, md)
    for exp in dict.fromkeys(g.experiment for g in acc_groups):
        figures += _band_figures([g for g in acc_groups if g.experiment == exp], exp,
                                 out_dir, md)
        # the bars: each label against its own reference only
        exp_pairs = [d for d in paired_differences(acc_groups) if d.n and
                     d.experiment == exp]
        if exp_pairs and any(g.epochs > 1 for g in acc_groups if g.experiment == exp):
            fname = "paired-%s.png" % _file_part(exp)
            plot_paired_bars(exp_pairs, os.path.join(out_dir, fname),
                             "%s: final accuracy minus S-SGD's, seed-paired "
                             "(bars: 95 %% interval; dots: seeds)" % exp)
            figures.append(fname)
            md += ["![paired differences to S-SGD, %s](%s)" % (exp, fname), ""]
    md += ["## Accuracy curves", ""]
    for exp, m, rate in settings:
        gs = [g for g in acc_groups
              if (g.experiment, g.num_workers, g.rate) == (exp, m, rate)]
        if max(g.epochs for g in gs) < 2:
            md += ["%s: one epoch per run, no curve." % setting_name(exp, m, rate), ""]
            continue
        fname = figure_name("curves", exp, m, rate)
        plot_curves(gs, os.path.join(out_dir, fname),
                    "%s, M=%d, %s" % (exp, m, rate or "loopback"))
        figures.append(fname)
        md += ["![validation accuracy vs epoch, %s](%s)" % (
            setting_name(exp, m, rate), fname), ""]
    return figures


def _file_part(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(text))


def _figure_labels(labels) -> List[tuple]:
    """A figure's ``labels`` as ``[(shown name, run label)]``: a list whose items are
    run labels or one-key mappings ``{shown name: run label}`` (in the order given),
    or a mapping shown name -> run label."""
    if isinstance(labels, dict):
        labels = [{k: v} for k, v in labels.items()]
    out = []
    for item in labels:
        if isinstance(item, dict):
            out += [(str(k), str(v)) for k, v in item.items()]
        else:
            out.append((str(item), str(item)))
    return out


def _spec_figures(specs: Sequence[Dict[str, object]], groups: Sequence[Group],
                  out_dir: str, md: List[str]) -> List[str]:
    """The figures the spec asks for (``figures``): ``curves`` draws accuracy vs
    iterations with one panel per listed experiment (a band over seeds per label,
    the same colour for the same shown name in every panel); ``paired`` draws one bar
    chart of the listed labels' seed-paired differences to S-SGD in one experiment.
    Written as ``figure-<name>.png``; a label with no runs is left out."""
    out, body = [], []
    for fig in specs:
        fname = "figure-%s.png" % _file_part(fig["name"])
        title = fig.get("title") or fig["name"]
        if fig["kind"] == "curves":
            panels = []
            for panel in fig["panels"]:
                lines = []
                for shown, label in _figure_labels(panel["labels"]):
                    for g in groups:
                        if (g.experiment, g.label) == (panel["experiment"], label):
                            lines.append({"label": shown, "seeds": iteration_series(g)})
                if lines:
                    panels.append({"name": panel.get("title") or panel["experiment"],
                                   "lines": lines})
            if not panels or max(len(s) for p in panels for line in p["lines"]
                                 for s in line["seeds"]) < 2:
                continue
            plot_iteration_bands(panels, os.path.join(out_dir, fname), title)
        else:
            wanted = [label for _, label in _figure_labels(fig["labels"])]
            diffs = [d for d in paired_differences(groups)
                     if d.n and d.experiment == fig["experiment"] and d.label in wanted]
            if not diffs:
                continue
            diffs.sort(key=lambda d: wanted.index(d.label))
            plot_paired_bars(diffs, os.path.join(out_dir, fname), title)
        out.append(fname)
        body += ["![%s](%s)" % (title, fname), ""]
    if out:
        md += ["## Summary figures", ""] + body
    return out


def _band_figures(groups: Sequence[Group], exp: str, out_dir: str,
                  md: List[str]) -> List[str]:
    """Accuracy vs iterations, one panel per M: the labels with several seeds
    (``accuracy-seeds-EXP.png``) and every label (``accuracy-all-EXP.png``)."""
    if not groups or max(g.epochs for g in groups) < 2:
        return []
    out = []
    multi = [g for g in groups if len(g.runs) > 1]
    for kind, gs in (("seeds", multi), ("all", groups)):
        if not gs or (kind == "all" and len(gs) == len(multi)):
            continue
        ms = sorted({g.num_workers for g in gs})
        panels = [{"name": "%s, M = %d" % (exp, m),
                   "lines": [{"label": g.label, "seeds": iteration_series(g)}
                             for g in gs if g.num_workers == m]} for m in ms]
        fname = "accuracy-%s-%s.png" % (kind, _file_part(exp))
        what = ("runs with several seeds (line: mean, band: range over seeds)"
                if kind == "seeds" else "every run (band: range over seeds where several)")
        plot_iteration_bands(panels, os.path.join(out_dir, fname),
                             "%s: validation accuracy vs iterations, %s" % (exp, what))
        out.append(fname)
        md += ["![validation accuracy vs iterations, %s, %s](%s)" % (exp, kind, fname), ""]
    return out
