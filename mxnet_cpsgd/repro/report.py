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
``cpsgd-reproduce --report-only`` or ``python -m mxnet_cpsgd.report OUT``.
"""
import argparse
import glob
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

#: the paper's column order (labels not listed here follow, in spec order)
PAPER_COLUMNS = ("SSGD", "BIT", "OD", "k2", "k5", "k10", "k20")
#: accuracy gap (percentage points) beyond which CP-SGD does not "match" S-SGD
MATCH_POINTS = 0.5
#: a run this many points below S-SGD is reported as not having trained
FAILED_POINTS = 20.0
RUN_META = "run.json"
REPRODUCE_META = "reproduce.json"
#: earlier failed attempts of a run: <run>/attempts/<n>/ (not runs themselves)
ATTEMPTS_DIR = "attempts"
LOG_RE = re.compile(r"^log(?:\.rank(\d+))?\.json$")


# ----------------------------------------------------------------------------
# loading

@dataclass
class Run:
    """One run: its metadata (``run.json``) and its records by rank."""
    path: str
    meta: Dict[str, object]
    records: Dict[int, List[Dict[str, object]]] = field(default_factory=dict)
    attempts: List[Dict[str, object]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or self.meta.get("algorithm") or "?")

    @property
    def experiment(self) -> str:
        return str(self.meta.get("experiment") or "main")

    @property
    def num_workers(self) -> int:
        return int(self.meta.get("num_workers") or len(self.records) or 1)

    @property
    def rate(self) -> Optional[str]:
        rate = self.meta.get("rate")
        return str(rate) if rate else None

    @property
    def status(self) -> str:
        return str(self.meta.get("status") or ("ok" if self.records else "missing"))

    @property
    def knobs(self) -> Dict[str, object]:
        return dict(self.meta.get("knobs") or {})

    @property
    def k(self) -> Optional[int]:
        """The correction period of a CP-SGD run (None for other algorithms)."""
        if self.meta.get("algorithm") != "cpsgd":
            return None
        k = self.knobs.get("correction_period")
        return int(k) if k is not None else 5  # the store's default


def read_json_lines(path: str) -> List[Dict[str, object]]:
    """The JSON objects of a JSON-lines file (blank and broken lines skipped: a
    run killed while writing leaves at most one broken last line)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def read_run(path: str) -> Run:
    """Read one run directory."""
    meta: Dict[str, object] = {}
    meta_path = os.path.join(path, RUN_META)
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
    records: Dict[int, List[Dict[str, object]]] = {}
    for name in sorted(os.listdir(path)):
        m = LOG_RE.match(name)
        if not m:
            continue
        lines = read_json_lines(os.path.join(path, name))
        if not lines:
            continue
        rank = int(lines[0].get("rank", m.group(1) or 0))
        records[rank] = lines
    if records and not meta:
        first = next(iter(records.values()))[0]
        meta = {"algorithm": first.get("algorithm"), "label": first.get("algorithm"),
                "num_workers": first.get("num_workers"), "status": "ok"}
    if "run_id" not in meta:
        meta["run_id"] = os.path.basename(os.path.normpath(path))
    return Run(path, meta, records, read_attempts(path))


def read_attempts(path: str) -> List[Dict[str, object]]:
    """The ``run.json`` of each earlier failed attempt kept under ``attempts/``."""
    out = []
    base = os.path.join(path, ATTEMPTS_DIR)
    if not os.path.isdir(base):
        return out
    for name in sorted(os.listdir(base), key=lambda n: (len(n), n)):
        meta_path = os.path.join(base, name, RUN_META)
        if os.path.isfile(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            meta["attempt"] = name
            out.append(meta)
    return out


def load_runs(root: str) -> List[Run]:
    """Every run under ``root`` (a directory holding ``run.json`` or ``log*.json``),
    in the order of their ``order`` field (spec order), then by path."""
    found = set()
    for pattern in ("**/" + RUN_META, "**/log.json", "**/log.rank*.json"):
        for p in glob.glob(os.path.join(root, pattern), recursive=True):
            found.add(os.path.dirname(p))
    found = {p for p in found
             if ATTEMPTS_DIR not in os.path.relpath(p, root).split(os.sep)}
    runs = [read_run(p) for p in sorted(found)]
    runs = [r for r in runs if r.meta.get("run_id")]
    runs.sort(key=lambda r: (r.meta.get("order", 1 << 30), r.path))
    return runs


def read_reproduce_meta(root: str) -> Dict[str, object]:
    path = os.path.join(root, REPRODUCE_META)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------
# numbers

def _mean(values: Iterable[Optional[float]]) -> Optional[float]:
    vals = [float(v) for v in values if v is not None and not _isnan(v)]
    return sum(vals) / len(vals) if vals else None


def _std(values: Iterable[Optional[float]]) -> Optional[float]:
    vals = [float(v) for v in values if v is not None and not _isnan(v)]
    if len(vals) < 2:
        return None
    m = sum(vals) / len(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


EPOCH_FIELDS = ("train_acc", "train_loss", "val_acc", "val_loss", "epoch_time",
                "comm_time", "samples_per_sec", "iterations")


def epoch_series(run: Run) -> List[Dict[str, object]]:
    """Per epoch (ascending), the mean over ranks of each field in EPOCH_FIELDS,
    plus ``epoch`` and ``ranks`` (how many ranks logged it)."""
    by_epoch: Dict[int, Dict[int, Dict[str, object]]] = {}
    for rank, lines in run.records.items():
        for rec in lines:  # a later line of the same epoch replaces the earlier
            by_epoch.setdefault(int(rec["epoch"]), {})[rank] = rec
    series = []
    for epoch in sorted(by_epoch):
        recs = list(by_epoch[epoch].values())
        point: Dict[str, object] = {"epoch": epoch, "ranks": len(recs)}
        for name in EPOCH_FIELDS:
            point[name] = _mean(r.get(name) for r in recs)
        series.append(point)
    return series


def steady_mean(series: Sequence[Dict[str, object]], name: str) -> Optional[float]:
    """Mean of ``name`` over the epochs after the first (the only one if just one)."""
    points = list(series[1:]) if len(series) > 1 else list(series)
    return _mean(p.get(name) for p in points)


@dataclass
class RunSummary:
    """The numbers of one run."""
    run: Run
    epochs: int
    final_val_acc: Optional[float]
    best_val_acc: Optional[float]
    final_train_acc: Optional[float]
    final_train_loss: Optional[float]
    final_val_loss: Optional[float]
    te: Optional[float]
    tc: Optional[float]
    iterations: Optional[float]   # mean iterations per epoch (after the first)
    series: List[Dict[str, object]]


def summarize_run(run: Run) -> RunSummary:
    """Final/best accuracies, final losses, Te and Tc of one run."""
    series = epoch_series(run)
    last = series[-1] if series else {}
    vals = [p["val_acc"] for p in series if p.get("val_acc") is not None]
    return RunSummary(
        run=run, epochs=len(series),
        final_val_acc=last.get("val_acc"), best_val_acc=max(vals) if vals else None,
        final_train_acc=last.get("train_acc"), final_train_loss=last.get("train_loss"),
        final_val_loss=last.get("val_loss"),
        te=steady_mean(series, "epoch_time"), tc=steady_mean(series, "comm_time"),
        iterations=steady_mean(series, "iterations"), series=series)


GroupKey = Tuple[str, str, int, Optional[str]]   # experiment, label, M, rate


@dataclass
class Group:
    """Runs that differ only by seed, averaged."""
    key: GroupKey
    runs: List[RunSummary]
    order: int

    @property
    def experiment(self) -> str:
        return self.key[0]

    @property
    def label(self) -> str:
        return self.key[1]

    @property
    def num_workers(self) -> int:
        return self.key[2]

    @property
    def rate(self) -> Optional[str]:
        return self.key[3]

    @property
    def algorithm(self) -> Optional[str]:
        return self.runs[0].run.meta.get("algorithm") if self.runs else None

    @property
    def k(self) -> Optional[int]:
        return self.runs[0].run.k if self.runs else None

    def mean(self, name: str) -> Optional[float]:
        return _mean(getattr(s, name) for s in self.runs)

    def std(self, name: str) -> Optional[float]:
        return _std(getattr(s, name) for s in self.runs)

    @property
    def seeds(self) -> List[object]:
        return [s.run.meta.get("seed") for s in self.runs]

    @property
    def epochs(self) -> int:
        return min(s.epochs for s in self.runs) if self.runs else 0

    def mean_series(self, name: str) -> List[Tuple[int, float]]:
        """``[(epoch, mean over seeds)]`` for epochs every seed has."""
        by_epoch: Dict[int, List[float]] = {}
        for s in self.runs:
            for p in s.series:
                if p.get(name) is not None:
                    by_epoch.setdefault(int(p["epoch"]), []).append(float(p[name]))
        n = len(self.runs)
        return [(e, sum(v) / len(v)) for e, v in sorted(by_epoch.items()) if len(v) == n]


def group_runs(summaries: Sequence[RunSummary]) -> List[Group]:
    """Group run summaries by (experiment, label, M, rate), in first-seen order;
    only runs that logged at least one epoch."""
    groups: Dict[GroupKey, Group] = {}
    for s in summaries:
        if not s.series:
            continue
        r = s.run
        key = (r.experiment, r.label, r.num_workers, r.rate)
        if key not in groups:
            groups[key] = Group(key, [], len(groups))
        groups[key].runs.append(s)
    return list(groups.values())


def column_order(labels: Iterable[str]) -> List[str]:
    """Labels in the paper's order, others after them in the given order."""
    labels = list(dict.fromkeys(labels))
    known = [c for c in PAPER_COLUMNS if c in labels]
    return known + [c for c in labels if c not in PAPER_COLUMNS]


# ----------------------------------------------------------------------------
# tables (as data)

def accuracy_table(groups: Sequence[Group]) -> List[Dict[str, object]]:
    """One row per group: experiment, label, algorithm, M, rate, seeds, epochs,
    final/best validation accuracy, final train accuracy and loss (means over
    seeds), their std over seeds, and the final accuracy minus S-SGD's of the same
    (experiment, M, rate) in percentage points."""
    ssgd = {(g.experiment, g.num_workers, g.rate): g.mean("final_val_acc")
            for g in groups if g.label == "SSGD" or g.algorithm == "ssgd"}
    rows = []
    for g in groups:
        final = g.mean("final_val_acc")
        base = ssgd.get((g.experiment, g.num_workers, g.rate))
        rows.append({
            "experiment": g.experiment, "label": g.label, "algorithm": g.algorithm,
            "num_workers": g.num_workers, "rate": g.rate, "seeds": len(g.runs),
            "epochs": g.epochs,
            "final_val_acc": final, "final_val_acc_std": g.std("final_val_acc"),
            "best_val_acc": g.mean("best_val_acc"),
            "final_train_acc": g.mean("final_train_acc"),
            "final_train_loss": g.mean("final_train_loss"),
            "final_train_loss_std": g.std("final_train_loss"),
            "te": g.mean("te"), "tc": g.mean("tc"),
            "delta_vs_ssgd": (100.0 * (final - base)
                              if final is not None and base is not None else None),
        })
    return rows


@dataclass
class TeTcTable:
    """The paper's layout: rows ``Te M=..`` then ``Tc M=..`` (M descending),
    columns labels; ``cells[(row, column)]`` = seconds (None when missing)."""
    experiment: str
    rate: Optional[str]
    columns: List[str]
    rows: List[str]
    cells: Dict[Tuple[str, str], Optional[float]]
    iterations: Dict[Tuple[int, str], Optional[float]]

    def value(self, kind: str, m: int, column: str) -> Optional[float]:
        return self.cells.get(("%s M=%d" % (kind, m), column))


def te_tc_tables(groups: Sequence[Group]) -> List[TeTcTable]:
    """One Te/Tc table per (experiment, rate), in first-seen order."""
    keys: List[Tuple[str, Optional[str]]] = []
    for g in groups:
        if (g.experiment, g.rate) not in keys:
            keys.append((g.experiment, g.rate))
    tables = []
    for exp, rate in keys:
        gs = [g for g in groups if g.experiment == exp and g.rate == rate]
        columns = column_order(g.label for g in gs)
        ms = sorted({g.num_workers for g in gs}, reverse=True)
        rows = ["Te M=%d" % m for m in ms] + ["Tc M=%d" % m for m in ms]
        cells: Dict[Tuple[str, str], Optional[float]] = {}
        iters: Dict[Tuple[int, str], Optional[float]] = {}
        for g in gs:
            cells[("Te M=%d" % g.num_workers, g.label)] = g.mean("te")
            cells[("Tc M=%d" % g.num_workers, g.label)] = g.mean("tc")
            iters[(g.num_workers, g.label)] = g.mean("iterations")
        tables.append(TeTcTable(exp, rate, columns, rows, cells, iters))
    return tables


def k_sensitivity(groups: Sequence[Group]) -> List[Dict[str, object]]:
    """Per (experiment, M, rate) with CP-SGD runs: ``{'experiment', 'num_workers',
    'rate', 'k': [...], 'final_val_acc': [...], 'te': [...], 'references':
    {label: (final_val_acc, te)}}`` (k ascending; references: S-SGD, BIT-SGD, OD-SGD)."""
    out = []
    seen = []
    for g in groups:
        key = (g.experiment, g.num_workers, g.rate)
        if g.algorithm == "cpsgd" and key not in seen:
            seen.append(key)
    for exp, m, rate in seen:
        gs = [g for g in groups if (g.experiment, g.num_workers, g.rate) == (exp, m, rate)]
        cp: Dict[int, Group] = {}
        for g in gs:
            # the plain CP-SGD runs only (a k label that also changes other knobs
            # is a variant, not a point of the k axis)
            if g.algorithm == "cpsgd" and g.k is not None and \
                    g.label in ("k%d" % g.k, "CP-SGD", "cpsgd"):
                cp.setdefault(g.k, g)
        ks = sorted(cp)
        refs = {g.label: (g.mean("final_val_acc"), g.mean("te")) for g in gs
                if g.algorithm in ("ssgd", "bitsgd", "odsgd")}
        out.append({"experiment": exp, "num_workers": m, "rate": rate, "k": ks,
                    "final_val_acc": [cp[k].mean("final_val_acc") for k in ks],
                    "te": [cp[k].mean("te") for k in ks],
                    "epochs": min([cp[k].epochs for k in ks] or [0]),
                    "references": refs})
    return out


def findings(groups: Sequence[Group], accuracy: Optional[Iterable[str]] = None) -> List[str]:
    """Automatic checks of the paper's claims on these logs, as Markdown bullets.

    Args:
        groups: from :func:`group_runs`.
        accuracy: experiments whose accuracy is checked (None: all).
    """
    lines = []
    accuracy = None if accuracy is None else set(accuracy)
    for exp, m, rate in _settings(groups):
        check_acc = accuracy is None or exp in accuracy
        gs = {g.label: g for g in groups
              if (g.experiment, g.num_workers, g.rate) == (exp, m, rate)}
        where = _setting_name(exp, m, rate)
        for g in gs.values():
            loss = g.mean_series("train_loss")
            if check_acc and len(loss) > 1 and loss[-1][1] > loss[0][1]:
                lines.append("%s: %s did not converge: its training loss rose from %.4f "
                             "(epoch 1) to %.4f (epoch %d); final val acc %s%%."
                             % (where, g.label, loss[0][1], loss[-1][1], loss[-1][0] + 1,
                                fmt_pct(g.mean("final_val_acc"))))
        ssgd = next((g for g in gs.values() if g.algorithm == "ssgd"), None)
        bit = next((g for g in gs.values() if g.algorithm == "bitsgd"), None)
        if check_acc and ssgd is not None and ssgd.epochs > 1:
            base = ssgd.mean("final_val_acc")
            for g in gs.values():
                if g is ssgd or base is None:
                    continue
                acc = g.mean("final_val_acc")
                if acc is None:
                    continue
                gap = 100.0 * (acc - base)
                if round(gap, 6) >= -MATCH_POINTS:
                    verdict = "matches S-SGD (within %.1f points)" % MATCH_POINTS
                elif gap < -FAILED_POINTS:
                    verdict = "did NOT train (more than %.0f points below S-SGD)" % FAILED_POINTS
                else:
                    verdict = "does NOT match S-SGD (more than %.1f points below)" % MATCH_POINTS
                lines.append("%s: %s final val acc %.2f%% vs S-SGD %.2f%% (%+.2f points): %s."
                             % (where, g.label, 100 * acc, 100 * base, gap, verdict))
        if bit is not None and bit.mean("te"):
            for g in gs.values():
                if g.algorithm == "cpsgd" and g.mean("te") is not None:
                    ratio = g.mean("te") / bit.mean("te")
                    lines.append("%s: %s Te = %.2f x BIT-SGD's (%s; the paper reports about "
                                 "0.7x at 56 Gbps on 16-32 GPUs)."
                                 % (where, g.label, ratio,
                                    "%.0f%% faster" % (100 * (1 - ratio)) if ratio < 1
                                    else "%.0f%% slower" % (100 * (ratio - 1))))
    return lines


def _settings(groups: Sequence[Group]) -> List[Tuple[str, int, Optional[str]]]:
    out = []
    for g in groups:
        key = (g.experiment, g.num_workers, g.rate)
        if key not in out:
            out.append(key)
    return out


def _setting_name(exp: str, m: int, rate: Optional[str]) -> str:
    return "[%s, M=%d, %s]" % (exp, m, rate or "loopback")


# ----------------------------------------------------------------------------
# Markdown

def fmt_pct(v: Optional[float], std: Optional[float] = None) -> str:
    """0.91234 -> '91.23'; with std -> '91.23 +- 0.10'; None -> 'n/a'."""
    if v is None:
        return "n/a"
    text = "%.2f" % (100.0 * v)
    if std is not None:
        text += " +- %.2f" % (100.0 * std)
    return text


def fmt_num(v: Optional[float], digits: int = 2, std: Optional[float] = None) -> str:
    if v is None:
        return "n/a"
    text = "%.*f" % (digits, v)
    if std is not None:
        text += " +- %.*f" % (digits, std)
    return text


def fmt_signed(v: Optional[float]) -> str:
    return "n/a" if v is None else "%+.2f" % v


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]],
             align: Optional[Sequence[str]] = None) -> str:
    """A GitHub Markdown table (align: 'l' or 'r' per column)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def accuracy_markdown(rows: Sequence[Dict[str, object]],
                      timing_only: Iterable[str] = ()) -> str:
    """The final-accuracy table; rows of ``timing_only`` experiments show their
    times but '-' for every accuracy and loss."""
    timing_only = set(timing_only)
    header = ["experiment", "run", "M", "network", "seeds", "epochs", "final val acc %",
              "best val acc %", "final train acc %", "final train loss",
              "vs SSGD (points)", "Te (s)", "Tc (s)"]
    body = []
    for r in rows:
        if r["experiment"] in timing_only:
            acc = ["-"] * 5
        else:
            acc = [fmt_pct(r["final_val_acc"], r["final_val_acc_std"]),
                   fmt_pct(r["best_val_acc"]), fmt_pct(r["final_train_acc"]),
                   fmt_num(r["final_train_loss"], 4, r["final_train_loss_std"]),
                   fmt_signed(r["delta_vs_ssgd"])]
        body.append([r["experiment"], r["label"], r["num_workers"], r["rate"] or "loopback",
                     r["seeds"], r["epochs"]] + acc + [fmt_num(r["te"]), fmt_num(r["tc"])])
    return md_table(header, body, ["l", "l", "r", "l"] + ["r"] * (len(header) - 4))


def te_tc_markdown(table: TeTcTable) -> str:
    header = [""] + table.columns
    body = [[row] + [fmt_num(table.cells.get((row, c))) for c in table.columns]
            for row in table.rows]
    return md_table(header, body)


def te_tc_relative_markdown(table: TeTcTable, base: str = "SSGD") -> Optional[str]:
    """Te and Tc divided by the ``base`` column's, same layout (None without base)."""
    if base not in table.columns:
        return None
    body = []
    for row in table.rows:
        b = table.cells.get((row, base))
        cells = []
        for c in table.columns:
            v = table.cells.get((row, c))
            cells.append("%.2f" % (v / b) if v is not None and b else "n/a")
        body.append([row] + cells)
    return md_table(["/ %s" % base] + table.columns, body)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


def figure_name(kind: str, exp: str, m: int, rate: Optional[str]) -> str:
    return "%s-%s-M%d-%s.png" % (kind, _slug(exp), m, _slug(rate or "loopback"))


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
    """Final validation accuracy (left; runs with several epochs only) and Te
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
            pts = [(k, v) for k, v in zip(ks, e["final_val_acc"]) if v is not None]
            if pts:
                ax1.plot([k for k, _ in pts], [100 * v for _, v in pts], "o-",
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
    # figures of an earlier report that this one may not write again
    for stale in glob.glob(os.path.join(out_dir, "curves-*.png")) + \
            glob.glob(os.path.join(out_dir, "k-sensitivity.png")):
        os.remove(stale)
    meta = read_reproduce_meta(root)
    runs = load_runs(root)
    summaries = [summarize_run(r) for r in runs]
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
    if meta.get("description"):
        md += [str(meta["description"]).strip(), ""]
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
        rows = [[e.get("name"), "`%s`" % " ".join(e.get("args") or []) if e.get("args")
                 else "", ", ".join(str(m) for m in e.get("workers") or []),
                 ", ".join(e.get("rates") or []), ", ".join(str(s) for s in e.get("seeds") or []),
                 ", ".join(e.get("labels") or [])] for e in meta["experiments"]]
        md += [md_table(["experiment", "its flags", "M", "network", "seeds", "runs"], rows,
                        ["l"] * 6), ""]
    md += ["Per epoch, a run's value is the mean over its workers; Te/Tc are the mean "
           "epoch time / communication time over the epochs after the first; runs that "
           "differ only by seed are averaged (`+-`: std over seeds). Accuracies in %. "
           "See docs/reproduce.md.", ""]

    analysis = os.path.join(root, "analysis.md")
    if os.path.isfile(analysis):
        with open(analysis) as f:
            md += ["## Analysis", "", f.read().strip(), ""]

    md += ["## Final accuracy", ""]
    md += [accuracy_markdown(acc_rows, timing_only) if acc_rows
           else "No run logged an epoch.", ""]
    if timing_only:
        md += ["Experiment(s) %s measure time only (their spec says `purpose: timing`): "
               "their accuracies are not shown, compared, plotted or checked (they are "
               "in their logs)." % ", ".join(sorted(timing_only)), ""]

    settings = _settings(acc_groups)
    if plots:
        md += ["## Accuracy curves", ""]
        for exp, m, rate in settings:
            gs = [g for g in acc_groups
                  if (g.experiment, g.num_workers, g.rate) == (exp, m, rate)]
            if max(g.epochs for g in gs) < 2:
                md += ["%s: one epoch per run, no curve." % _setting_name(exp, m, rate), ""]
                continue
            fname = figure_name("curves", exp, m, rate)
            plot_curves(gs, os.path.join(out_dir, fname),
                        "%s, M=%d, %s" % (exp, m, rate or "loopback"))
            figures.append(fname)
            md += ["![validation accuracy vs epoch, %s](%s)" % (
                _setting_name(exp, m, rate), fname), ""]

    md += ["## Epoch time Te and communication time Tc (seconds, paper layout)", ""]
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

    if ksens:
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

    md += ["## Automatic checks", ""]
    md += (["- " + f for f in found] if found else ["Nothing to compare."]) + [""]

    notes = meta.get("notes")
    if notes:
        md += ["## Notes", "", str(notes).strip(), ""]

    md += runs_section(runs)
    text = "\n".join(md).rstrip() + "\n"
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        f.write(text)
    return Report(path, text, figures, acc_rows, tables, ksens, found)


def reference_markdown(ref: Dict[str, object]) -> str:
    """``{'columns': [...], 'rows': {'Te M=4': [...], ...}}`` as a table."""
    columns = list(ref.get("columns") or [])
    body = [[row] + [fmt_num(v) if v is not None else "n/a" for v in values]
            for row, values in (ref.get("rows") or {}).items()]
    return md_table([""] + columns, body)


def runs_section(runs: Sequence[Run]) -> List[str]:
    md = ["## Runs", ""]
    rows = []
    for r in runs:
        wall = r.meta.get("wall_time")
        rows.append([r.meta.get("run_id"), r.status, r.label, r.num_workers,
                     r.rate or "loopback", r.meta.get("seed", "n/a"),
                     "%.0f" % wall if isinstance(wall, (int, float)) else "n/a",
                     sum(1 for _ in epoch_series(r)),
                     (r.meta.get("failure") or "").replace("|", "/")[:120]])
    md += [md_table(["run", "status", "label", "M", "network", "seed", "wall (s)", "epochs",
                     "note"], rows, ["l"] * 3 + ["r"] * 5 + ["l"]), ""]
    attempts = [(r, a) for r in runs for a in r.attempts]
    if attempts:
        md += ["Earlier failed attempts (files kept in `<run>/attempts/<n>/`; the run "
               "was started again from scratch):", ""]
        md += [md_table(["run", "attempt", "wall (s)", "epochs logged", "failure"],
                        [[r.meta.get("run_id"), a["attempt"],
                          "%.0f" % a["wall_time"] if isinstance(a.get("wall_time"),
                                                                (int, float)) else "n/a",
                          len(epoch_series(read_run(os.path.join(
                              r.path, ATTEMPTS_DIR, a["attempt"])))),
                          (a.get("failure") or "").replace("|", "/")[:160]]
                         for r, a in attempts], ["l", "r", "r", "r", "l"]), ""]
    cmds = [(r.meta.get("run_id"), r.meta.get("command_text")) for r in runs
            if r.meta.get("command_text")]
    if cmds:
        md += ["<details><summary>Worker command of each run</summary>", ""]
        for run_id, cmd in cmds:
            md += ["- `%s`: `%s`" % (run_id, cmd)]
        md += ["", "</details>", ""]
    return md


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m mxnet_cpsgd.report OUT [--out-dir DIR] [--name report.md]``."""
    p = argparse.ArgumentParser(prog="python -m mxnet_cpsgd.report",
                                description="Write the Markdown report of a reproduction's logs.")
    p.add_argument("root", help="output directory of cpsgd-reproduce (or any run tree)")
    p.add_argument("--out-dir", default=None, help="where to write (default: ROOT)")
    p.add_argument("--name", default="report.md", help="Markdown file name")
    p.add_argument("--title", default=None)
    p.add_argument("--no-plots", dest="plots", action="store_false")
    args = p.parse_args(argv)
    if not os.path.isdir(args.root):
        p.error("no such directory: %s" % args.root)
    command = "python -m mxnet_cpsgd.report " + " ".join(
        sys.argv[1:] if argv is None else argv)
    rep = generate(args.root, args.out_dir, args.name, args.title, command, args.plots)
    print(rep.markdown_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
