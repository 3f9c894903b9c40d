"""Turn the per-epoch JSON logs of a reproduction into tables, plots and Markdown.

Everything here is a pure function of the files under one output directory
(see docs/reproduce.md for the layout)::

    OUT/
      reproduce.json              # optional: spec name/title, the commands that ran
      runs/<experiment>/<run>/    # one directory per run
        run.json                  # what ran: label, algorithm, M, k, rate, seed, status
        log.json                  # rank 0's JSON lines (one per epoch)
        log.rank1.json ...        # the other ranks' lines

A run directory without ``run.json`` is still read: its metadata is taken from
its log records (algorithm, num_workers), its label from the algorithm.

Definitions used by every table (docs/reproduce.md):

- per epoch, a run's value is the mean over its workers' (ranks') records; a
  rank that logged the same epoch twice (a resumed run) counts with its last line;
- final = the last epoch's value; best = the highest validation accuracy of any epoch;
- Te / Tc = the mean ``epoch_time`` / ``comm_time`` over the epochs after the
  first (the first epoch, with start-up and warm-up, is left out; a run with a
  single epoch uses it);
- runs that differ only by seed are averaged (the ``+-`` is the standard
  deviation over seeds, shown when there are several).

The report never reads anything but these files, so it can be regenerated with
``cpsgd-reproduce --report-only`` or ``python -m mxnet_cpsgd.repro.report OUT``.
Its accuracy figures are drawn by :mod:`.report_figures`.
"""
import argparse
import glob
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .logs import load_runs, read_reproduce_meta
from .summary import (FAILED_POINTS, Group, TeTcTable,
                      accuracy_table, group_runs, k_sensitivity,
                      summarize_run, te_tc_tables)
from .markdown import (accuracy_markdown, findings, fmt_num, fmt_pct, md_table,
                       te_tc_markdown, te_tc_relative_markdown)
from .plots import plot_k_sensitivity
from .paired import PairedDiff, chosen_differences, paired_differences
from .report_figures import accuracy_figures
from .time_to_accuracy import time_to_accuracy_section
from .measured_tta import measured_section
from . import bench_report
from .run_tables import experiments_section, in_progress, runs_section
# importable from here as before they moved to run_tables.py
from .run_tables import code_text, sittings_code_text, sittings_note  # noqa: F401


# ----------------------------------------------------------------------------
# the report

@dataclass
class Report:
    """What :func:`generate` wrote."""
    markdown_path: str
    markdown: str
    figures: List[str]
    accuracy_rows: List[Dict[str, object]]
    te_tc: List[TeTcTable]
    k_sensitivity: List[Dict[str, object]]
    findings: List[str]
    bench: List[bench_report.BenchExperiment] = None


def generate(root: str, out_dir: Optional[str] = None, name: str = "report.md",
             title: Optional[str] = None, command: Optional[str] = None,
             plots: bool = True) -> Report:
    """Read every run under ``root`` and write the Markdown report and its PNGs.

    Args:
        root: the output directory of a reproduction (or any tree of run directories).
        out_dir: where to write (default ``root``).
        name: the Markdown file's name.
        title: the report's title (default: from ``reproduce.json``, else the directory).
        command: the command that regenerated the report (shown beside the one in
            ``reproduce.json`` that ran the experiments).
        plots: write the PNGs (and link them).

    Returns:
        the :class:`Report` (tables as data, for tests and callers).
    """
    out_dir = out_dir or root
    os.makedirs(out_dir, exist_ok=True)
    _remove_stale_figures(out_dir)
    meta = read_reproduce_meta(root)
    runs = load_runs(root)
    bench_exps = bench_report.load(root, meta)
    # a resumable run that has not finished yet: its last epoch is not its final one
    summaries = [summarize_run(r) for r in runs if not in_progress(r)]
    groups = group_runs(summaries)
    purposes = {e.get("name"): e.get("purpose", "both") for e in meta.get("experiments") or []}
    timing_only = {n for n, p in purposes.items() if p == "timing"}
    acc_groups = [g for g in groups if g.experiment not in timing_only]
    acc_rows = accuracy_table(groups)
    tables = te_tc_tables(groups)
    ksens = k_sensitivity(groups)
    for e in ksens:   # accuracy of a timing-only experiment is not a result
        if e["experiment"] in timing_only:
            e["final_val_acc"] = [None] * len(e["k"])
            e["references"] = {k: (None, v[1]) for k, v in e["references"].items()}
    found = findings(groups, accuracy=set(purposes) - timing_only if purposes else None)
    figures: List[str] = []
    title = title or meta.get("title") or meta.get("name") or os.path.basename(
        os.path.abspath(root))

    md: List[str] = ["# %s" % title, ""]
    md += _how_produced(root, meta, runs, bench_exps, command)

    if bench_exps:
        bench_md, bench_figures = bench_report.markdown(bench_exps, out_dir, plots)
        md += bench_md
        figures += bench_figures
    if not runs and bench_exps:
        # a benchmark-only reproduction: no training logs to tabulate
        notes = meta.get("notes")
        if notes:
            md += ["## Notes", "", str(notes).strip(), ""]
        path, text = _write_markdown(md, out_dir, name)
        return Report(path, text, figures, acc_rows, tables, ksens, found, bench_exps)

    md += ["## Final accuracy", ""]
    md += [accuracy_markdown(acc_rows, timing_only) if acc_rows
           else "No run logged an epoch.", ""]
    if timing_only:
        md += ["Experiment(s) %s measure time only (their spec says `purpose: timing`): "
               "their accuracies are not shown, compared, plotted or checked (they are "
               "in their logs)." % ", ".join(sorted(timing_only)), ""]

    md += _paired_sections(meta, acc_groups)
    if meta.get("time_to_accuracy"):
        md += time_to_accuracy_section(acc_groups, meta["time_to_accuracy"],
                                       out_dir if plots else None)
    if meta.get("measured_time_to_accuracy"):
        md += measured_section(runs, meta["measured_time_to_accuracy"], bench_exps)
    if plots:
        figures += accuracy_figures(meta, acc_groups, out_dir, md)

    md += _te_tc_section(tables, meta)

    if ksens:
        figures += _k_sensitivity_section(ksens, out_dir, plots, md)

    md += ["## Automatic checks", ""]
    md += (["- " + f for f in found] if found else ["Nothing to compare."]) + [""]

    notes = meta.get("notes")
    if notes:
        md += ["## Notes", "", str(notes).strip(), ""]

    md += runs_section(runs)
    path, text = _write_markdown(md, out_dir, name)
    return Report(path, text, figures, acc_rows, tables, ksens, found, bench_exps)


def _remove_stale_figures(out_dir: str) -> None:
    # figures of an earlier report that this one may not write again
    for stale in glob.glob(os.path.join(out_dir, "curves-*.png")) + \
            glob.glob(os.path.join(out_dir, "k-sensitivity.png")) + \
            glob.glob(os.path.join(out_dir, "bench-sweep-*.png")) + \
            glob.glob(os.path.join(out_dir, "accuracy-*.png")) + \
            glob.glob(os.path.join(out_dir, "paired-*.png")) + \
            glob.glob(os.path.join(out_dir, "figure-*.png")) + \
            glob.glob(os.path.join(out_dir, "time-to-accuracy.png")):
        os.remove(stale)


def _how_produced(root: str, meta: Dict[str, object], runs, bench_exps,
                  command: Optional[str]) -> List[str]:
    """The description, the analysis, and how the runs and the report were made."""
    md: List[str] = []
    if meta.get("description"):
        md += [str(meta["description"]).strip(), ""]
    # the hand-written reading of the results (claims against ours) comes first
    analysis = os.path.join(root, "analysis.md")
    if os.path.isfile(analysis):
        with open(analysis) as f:
            md += ["## Analysis", "", f.read().strip(), ""]
    md += ["## How this report was produced", ""]
    if meta.get("command"):
        md += ["Runs produced by:", "", "```", str(meta["command"]), "```", ""]
    if command and command != meta.get("command"):
        md += ["Report regenerated from the logs by:", "", "```", command, "```", ""]
    if meta.get("environment"):
        env = meta["environment"]
        md += ["Machine: " + ", ".join("%s %s" % (k, v) for k, v in sorted(env.items())), ""]
    if meta.get("script"):
        md += ["Training script `%s`; flags common to every run: `%s`." % (
            meta["script"], " ".join(meta.get("common_args") or [])), ""]
    if meta.get("experiments"):
        md += experiments_section(meta, runs)
    if runs or not bench_exps:
        md += ["Per epoch, a run's value is the mean over its workers; Te/Tc are the mean "
               "epoch time / communication time over the epochs after the first; runs that "
               "differ only by seed are averaged (`+-`: std over seeds). Accuracies in %. "
               "See docs/reproduce.md.", ""]
    return md


def _paired_sections(meta: Dict[str, object], acc_groups: List[Group]) -> List[str]:
    """Seed-paired differences to S-SGD, and between the runs the spec compares."""
    md: List[str] = []
    margin = meta.get("equivalence_margin")
    min_seeds = min_seeds_by_experiment(meta)
    pairs = [d for d in paired_differences(acc_groups, also_base=True) if d.n]
    if pairs:
        md += ["## Seed-paired differences to S-SGD", ""]
        md += ["Final accuracy of each run minus that of S-SGD (same experiment, M, "
               "network and seed; a label ending in `-X` against `SSGD-X` where that "
               "exists, and then also against `SSGD`), in points: mean over the paired "
               "seeds and its 95 % confidence interval (Student's t). The verdict says only "
               "what the interval allows.",
               ""]
        if margin:
            md += [equivalence_note(margin, min_seeds), ""]
        md += [paired_markdown(pairs, margin, min_seeds), ""]
    chosen = [d for d in chosen_differences(acc_groups, meta.get("comparisons") or [])
              if d.n]
    if chosen:
        md += ["## Seed-paired differences between chosen runs", ""]
        md += ["The comparisons the spec lists (`comparisons`): final accuracy of the run "
               "minus that of the run it is compared with, same experiment, M, network "
               "and seed, in points, as above. Where either run did not train at a seed "
               "(more than %.0f points below the best seed of its label) a second row "
               "leaves those seeds out." % FAILED_POINTS, ""]
        md += [paired_markdown(chosen, margin, min_seeds), ""]
    return md


def _te_tc_section(tables: List[TeTcTable], meta: Dict[str, object]) -> List[str]:
    md = ["## Epoch time Te and communication time Tc (seconds, paper layout)", ""]
    for t in tables:
        md += ["### %s, %s" % (t.experiment, t.rate or "loopback (no shaping)"), ""]
        md += [te_tc_markdown(t), ""]
        rel = te_tc_relative_markdown(t)
        if rel:
            md += ["Relative to S-SGD:", "", rel, ""]
        its = sorted({v for v in t.iterations.values() if v is not None})
        if its:
            md += ["Iterations per epoch (mean of the epochs used): %s." % ", ".join(
                "%g" % v for v in its), ""]
    if meta.get("reference_te_tc"):
        md += ["### Published (the paper's table, for comparison)", ""]
        md += [reference_markdown(meta["reference_te_tc"]), ""]
    return md


def _k_sensitivity_section(ksens: List[Dict[str, object]], out_dir: str, plots: bool,
                           md: List[str]) -> List[str]:
    """The table (and plot) of accuracy and epoch time against k; appends to
    ``md``, returns the figure's file name if one was written."""
    figures: List[str] = []
    md += ["## Sensitivity to the correction period k", ""]
    rows = []
    for e in ksens:
        for k, acc, te in zip(e["k"], e["final_val_acc"], e["te"]):
            rows.append([e["experiment"], e["num_workers"], e["rate"] or "loopback", k,
                         fmt_pct(acc), fmt_num(te)])
    md += [md_table(["experiment", "M", "network", "k", "final val acc %", "Te (s)"],
                    rows, ["l", "r", "l", "r", "r", "r"]), ""]
    if plots and any(e["k"] for e in ksens):
        fname = "k-sensitivity.png"
        plot_k_sensitivity(ksens, os.path.join(out_dir, fname))
        figures.append(fname)
        md += ["![final accuracy and epoch time vs k](%s)" % fname, ""]
    return figures


def _write_markdown(md: List[str], out_dir: str, name: str):
    """Write the report; returns its path and text."""
    text = "\n".join(md).rstrip() + "\n"
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        f.write(text)
    return path, text


def min_seeds_by_experiment(meta: Dict[str, object]) -> Dict[Optional[str], int]:
    """Paired seeds each experiment's equivalence verdict waits for: its own
    ``equivalence_min_seeds``, else the spec's (key None), else 2."""
    default = meta.get("equivalence_min_seeds") or 2
    out: Dict[Optional[str], int] = {None: default}
    for exp in meta.get("experiments") or []:
        if isinstance(exp, dict) and exp.get("equivalence_min_seeds"):
            out[exp.get("name")] = exp["equivalence_min_seeds"]
    return out


def _per_experiment(min_seeds) -> Dict[Optional[str], int]:
    """``min_seeds`` (a number, or a mapping as min_seeds_by_experiment returns) as
    that mapping."""
    return {None: min_seeds} if isinstance(min_seeds, int) else min_seeds


def equivalence_note(margin: float, min_seeds=2) -> str:
    """How the equivalence column is decided (``min_seeds``: a number, or a mapping as
    min_seeds_by_experiment returns)."""
    min_seeds = _per_experiment(min_seeds)
    default = min_seeds[None]
    own = sorted((name, n) for name, n in min_seeds.items() if name is not None and n != default)
    waits = ""
    if default > 2 or own:
        waits = (" The verdict waits for %d paired seeds (the spec's "
                 "`equivalence_min_seeds`)%s: with fewer it says \"not decided\"." % (
                     default, "".join("; for experiment %s, %d (its own, fixed with the "
                                      "margin before its runs)" % (name, n)
                                      for name, n in own)))
    return ("Equivalence is decided by two one-sided tests (TOST) at the margin the spec "
            "fixed before the runs, +-%g points: \"equivalent\" when the 90 %% confidence "
            "interval of the mean paired difference lies inside [-%g, +%g]; an interval "
            "that includes 0 is not enough. Otherwise the column names the end outside "
            "the margin: with only the upper end above +%g the run is not worse than its "
            "reference by the margin (that one-sided test passed).%s" % (
                margin, margin, margin, margin, waits))


def paired_markdown(pairs: Sequence[PairedDiff], margin: Optional[float] = None,
                    min_seeds=2) -> str:
    """The paired differences as a table (points); with ``margin``, also the 90 %
    interval and the TOST verdict at +-margin points (decided from ``min_seeds`` pairs:
    a number, or a mapping per experiment as min_seeds_by_experiment returns)."""
    per_experiment = _per_experiment(min_seeds)
    rows = []
    for d in pairs:
        ci = d.ci
        row = [d.experiment, d.num_workers, d.rate or "loopback", d.label, d.reference,
               d.n, ", ".join(str(s) for s in d.seeds), "%+.2f" % d.mean,
               "[%+.2f, %+.2f]" % ci if ci else "n/a", d.verdict]
        if margin:
            ci90 = d.ci90
            needed = per_experiment.get(d.experiment, per_experiment[None])
            row += ["[%+.2f, %+.2f]" % ci90 if ci90 else "n/a", d.equivalence(margin, needed)]
        rows.append(row)
    header = ["experiment", "M", "network", "run", "vs", "pairs", "seeds",
              "mean diff (points)", "95 % CI", "verdict"]
    align = ["l", "r", "l", "l", "l", "r", "l", "r", "l", "l"]
    if margin:
        header += ["90 % CI", "TOST at +-%g" % margin]
        align += ["l", "l"]
    return md_table(header, rows, align)


def reference_markdown(ref: Dict[str, object]) -> str:
    """``{'columns': [...], 'rows': {'Te M=4': [...], ...}}`` as a table."""
    columns = list(ref.get("columns") or [])
    body = [[row] + [fmt_num(v) if v is not None else "n/a" for v in values]
            for row, values in (ref.get("rows") or {}).items()]
    return md_table([""] + columns, body)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mxnet_cpsgd.repro.report",
                                description="Write the Markdown report of a reproduction's logs.")
    p.add_argument("root", help="output directory of cpsgd-reproduce (or any run tree)")
    p.add_argument("--out-dir", default=None, help="where to write (default: ROOT)")
    p.add_argument("--name", default="report.md",
                   help="Markdown file name (default report.md)")
    p.add_argument("--title", default=None,
                   help="the report's heading (default: the title or name in "
                        "ROOT/reproduce.json, else ROOT's name)")
    p.add_argument("--no-plots", dest="plots", action="store_false",
                   help="write no PNGs (the report without figures)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m mxnet_cpsgd.repro.report OUT [--out-dir DIR] [--name report.md]``."""
    p = _parser()
    args = p.parse_args(argv)
    if not os.path.isdir(args.root):
        p.error("no such directory: %s" % args.root)
    command = "python -m mxnet_cpsgd.repro.report " + " ".join(
        sys.argv[1:] if argv is None else argv)
    rep = generate(args.root, args.out_dir, args.name, args.title, command, args.plots)
    print(rep.markdown_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
