"""From runs to numbers: per-epoch series, per-run summaries, groups of runs that
differ only by seed, and the report's tables as data (accuracy, Te/Tc, k
sensitivity).  Definitions in :mod:`mxnet_cpsgd.repro.report`.
"""
import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .logs import Run


#: the paper's column order (labels not listed here follow, in spec order)
PAPER_COLUMNS = ("SSGD", "BIT", "OD", "k2", "k5", "k10", "k20")
#: accuracy gap (percentage points) beyond which CP-SGD does not "match" S-SGD
MATCH_POINTS = 0.5
#: a run this many points below S-SGD is reported as not having trained
FAILED_POINTS = 20.0
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
                "comm_time", "samples_per_sec", "iterations", "total_iterations")


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
    # the run labelled SSGD is the reference; else the first plain ssgd run (a variant
    # such as "SSGD-mom0" must not replace it)
    ssgd: Dict[Tuple[str, int, Optional[str]], Optional[float]] = {}
    for g in sorted(groups, key=lambda g: g.label != "SSGD"):
        if g.label == "SSGD" or g.algorithm == "ssgd":
            ssgd.setdefault((g.experiment, g.num_workers, g.rate), g.mean("final_val_acc"))
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
    'rate', 'k': [...], 'final_val_acc': [...], 'final_val_acc_std': [...] (std over
    seeds, None for one seed), 'te': [...], 'references':
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
                    "final_val_acc_std": [cp[k].std("final_val_acc") for k in ks],
                    "te": [cp[k].mean("te") for k in ks],
                    "epochs": min([cp[k].epochs for k in ks] or [0]),
                    "references": refs})
    return out

def setting_keys(groups: Sequence[Group]) -> List[Tuple[str, int, Optional[str]]]:
    out = []
    for g in groups:
        key = (g.experiment, g.num_workers, g.rate)
        if key not in out:
            out.append(key)
    return out


def setting_name(exp: str, m: int, rate: Optional[str]) -> str:
    return "[%s, M=%d, %s]" % (exp, m, rate or "loopback")
