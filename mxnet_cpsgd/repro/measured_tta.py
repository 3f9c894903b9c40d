"""Time to accuracy *measured*: wall clock of real training runs on emulated hosts,
beside the projection (iterations x a benchmark's time per iteration).

The runs train with ``--emulate-compute`` (each iteration's compute padded to an
emulated accelerator's time), ``--val-every-iters`` (validation several times per
epoch) and, usually, ``--time-scale D`` with links D times slower; their validation
logs (``log-val*.json``, see mxnet_cpsgd/training/timed_training.py) give, per
validation, the iteration, the accuracy and the training clock (validation time
excluded, divided here by D).  Per validation the ranks' accuracies are combined
weighted by their samples and the clock is the slowest rank's.

For every label, drop and seed: the first validation whose accuracy reaches the
reference's (S-SGD's) final accuracy (mean over its seeds, from the same logs)
minus the drop; the measured time is that validation's clock, the iterations its
iteration count (both at most one validation interval late).  Paired by seed, the
difference to the reference's time gets a 95 % interval (Student's t).  The
projection multiplies the same iteration counts by the spec's
``bench_ms_per_iteration`` ({experiment: {label: ms}}), or else the ms per iteration
that the spec's bench experiment named in ``bench_experiments`` ({experiment: bench
experiment}) measured for the label at the same M and rate (cpsgd-bench, the same
model's shapes, alone on the machine); the ratio projection / measured says how far a projection is from what a
run takes.  A run with a dense warm-up (its ``warmup_steps`` knob) exchanges as S-SGD
does until then, so the projection counts its first ``warmup_steps`` iterations at the
reference's ms per iteration and only the rest at its own.
"""
import glob
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .logs import Run
from .markdown import md_table
from .paired import t95

SETTINGS_KEYS = ("experiments", "reference", "drops", "bench_ms_per_iteration",
                 "bench_experiments", "bench_source")
_VAL_FILE = re.compile(r"^log-val(?:\.rank\d+)?\.json$")


@dataclass
class Point:
    """One validation of a run: all ranks combined."""
    iteration: int
    seconds: float        # training clock, validation excluded, undilated
    accuracy: float       # fraction


def run_points(run_dir: str) -> Tuple[List[Point], float]:
    """The run's validations (iterations every rank validated at), in order, and the
    largest fraction of the clock by which a rank's real compute overran its padding.

    Args:
        run_dir: a run directory holding ``log-val*.json``.
    """
    by_iteration: Dict[int, List[dict]] = {}
    ranks = 0
    overrun = 0.0
    for path in sorted(glob.glob(os.path.join(run_dir, "log-val*.json"))):
        if not _VAL_FILE.match(os.path.basename(path)):
            continue
        ranks += 1
        last = None
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a run killed while writing leaves a broken last line
                by_iteration.setdefault(int(rec["iteration"]), []).append(rec)
                last = rec
        if last and last.get("train_clock"):
            overrun = max(overrun, float(last.get("compute_overrun") or 0.0)
                          / float(last["train_clock"]))
    points = []
    for iteration in sorted(by_iteration):
        recs = by_iteration[iteration]
        if len(recs) != ranks:
            continue
        samples = sum(int(r.get("val_samples") or 1) for r in recs)
        accuracy = sum(float(r["val_acc"]) * int(r.get("val_samples") or 1)
                       for r in recs) / samples
        seconds = max(float(r["train_clock"]) / float(r.get("time_scale") or 1.0)
                      for r in recs)
        points.append(Point(iteration, seconds, accuracy))
    return points, overrun


def first_reaching(points: Sequence[Point], target: float) -> Optional[Point]:
    """The first point whose accuracy is at least ``target`` (None: none)."""
    return next((p for p in points if p.accuracy >= target), None)


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def mean_interval(values: Sequence[float]) -> Optional[Tuple[float, float, float]]:
    """``(mean, low, high)``: the 95 % Student's t interval of the mean (None for
    fewer than two values)."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = t95(len(values) - 1) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


@dataclass
class Cell:
    """One label at one drop: per seed, the measured time and iterations to the target."""
    experiment: str
    num_workers: int
    rate: Optional[str]
    label: str
    reference: str
    drop: float
    target: float
    seconds: Dict[object, Optional[float]] = field(default_factory=dict)
    iterations: Dict[object, Optional[int]] = field(default_factory=dict)
    spacing: Optional[int] = None      # iterations between validations (largest)
    warmup: int = 0                    # dense warm-up iterations (the runs' knob)

    def reached(self) -> List[object]:
        return [s for s, v in self.seconds.items() if v is not None]

    def projected(self, ms: Optional[float],
                  warmup_ms: Optional[float] = None) -> Dict[object, float]:
        """Per seed that reached the target, in seconds: its iterations x ``ms``;
        with a warm-up, its first ``warmup`` iterations x ``warmup_ms`` (the
        reference's) and the rest x ``ms`` (none without ``warmup_ms``)."""
        if ms is None or (self.warmup and warmup_ms is None):
            return {}
        out = {}
        for s in self.reached():
            dense = min(self.iterations[s], self.warmup)
            out[s] = (dense * (warmup_ms or 0.0) + (self.iterations[s] - dense) * ms) / 1e3
        return out


def measured_cells(runs: Sequence[Run], settings: Dict[str, object]) -> List[Cell]:
    """The cells of the section: per (experiment, M, network) with a reference run,
    per label and drop."""
    reference = str(settings.get("reference") or "SSGD")
    drops = settings.get("drops") or [0.5, 1.0]
    wanted = settings.get("experiments")
    series: Dict[tuple, Dict[object, List[Point]]] = {}
    warmups: Dict[tuple, int] = {}
    for run in runs:
        if wanted and run.experiment not in wanted:
            continue
        points, _ = run_points(run.path)
        if points:
            key = (run.experiment, run.num_workers, run.rate, run.label)
            series.setdefault(key, {})[run.meta.get("seed")] = points
            warmups[key] = max(warmups.get(key, 0), int(run.knobs.get("warmup_steps") or 0))
    cells = []
    for (exp, m, rate, label), by_seed in series.items():
        ref = series.get((exp, m, rate, reference))
        if not ref:
            continue
        final = _mean([pts[-1].accuracy for pts in ref.values()])
        spacing = max((b.iteration - a.iteration for pts in by_seed.values()
                       for a, b in zip(pts, pts[1:])), default=None)
        for drop in drops:
            cell = Cell(exp, m, rate, label, reference, float(drop), final - drop / 100.0,
                        spacing=spacing, warmup=warmups.get((exp, m, rate, label), 0))
            for seed, pts in sorted(by_seed.items(), key=lambda kv: str(kv[0])):
                hit = first_reaching(pts, cell.target)
                cell.seconds[seed] = hit.seconds if hit else None
                cell.iterations[seed] = hit.iteration if hit else None
            cells.append(cell)
    return cells


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "n/a" if value is None else "%.*f" % (digits, value)


def _paired_text(cell: Cell, ref: Optional[Cell]) -> str:
    if ref is None or cell.label == cell.reference:
        return "-"
    diffs = [cell.seconds[s] - ref.seconds[s] for s in cell.reached()
             if ref.seconds.get(s) is not None]
    ci = mean_interval(diffs)
    if ci is None:
        return "%s (%d seed%s)" % (_fmt(_mean(diffs)), len(diffs), "" if len(diffs) == 1
                                   else "s")
    return "%+.1f [%+.1f, %+.1f] (%d seeds)" % (ci + (len(diffs),))


def bench_times(cells: Sequence[Cell], settings: Dict[str, object],
                bench_exps: Sequence[object] = ()) -> Dict[str, Dict[str, float]]:
    """{experiment: {label: ms per iteration}} for the projection: the spec's
    ``bench_ms_per_iteration``, else its ``bench_experiments``' measurements (the
    bench's point at the cell's M and link rate, the rate without its queue).

    Args:
        cells: the section's cells.
        settings: the spec's ``measured_time_to_accuracy``.
        bench_exps: the reproduction's bench experiments
            (:func:`.bench_report.load`).
    """
    out: Dict[str, Dict[str, float]] = {}
    named = settings.get("bench_experiments") or {}
    by_name = {getattr(b, "name", None): b for b in bench_exps}
    for c in cells:
        given = (settings.get("bench_ms_per_iteration") or {}).get(c.experiment) or {}
        ms = given.get(c.label)
        bench = by_name.get(named.get(c.experiment))
        if ms is None and bench is not None:
            rate = (c.rate or "").split(",")[0]
            points = [p for p in bench.points if p.num_workers == c.num_workers]
            point = next((p for p in points if p.rate == rate), None)
            ms = point.ms(c.label) if point is not None else None
        if ms is not None:
            out.setdefault(c.experiment, {})[c.label] = float(ms)
    return out


def measured_markdown(cells: Sequence[Cell],
                      bench_ms: Optional[Dict[str, Dict[str, float]]] = None) -> str:
    """The section's table: measured time, its paired difference to the reference,
    the iterations, the projection and the ratio projection / measured."""
    bench_ms = bench_ms or {}
    refs = {(c.experiment, c.num_workers, c.rate, c.drop): c for c in cells
            if c.label == c.reference}
    body = []
    for c in cells:
        reached = c.reached()
        measured = _mean([c.seconds[s] for s in reached])
        times = bench_ms.get(c.experiment) or {}
        ms = times.get(c.label)
        projected = c.projected(ms, times.get(c.reference))
        proj_mean = _mean(list(projected.values()))
        ratio = proj_mean / measured if proj_mean is not None and measured else None
        body.append([c.experiment, c.num_workers, c.rate or "loopback", c.label,
                     "%.1f" % c.drop, "%.2f" % (100 * c.target),
                     "%d of %d" % (len(reached), len(c.seconds)), _fmt(measured),
                     _paired_text(c, refs.get((c.experiment, c.num_workers, c.rate,
                                               c.drop))),
                     _fmt(_mean([c.iterations[s] for s in reached]), 0),
                     _fmt(ms), _fmt(proj_mean),
                     "%.2f" % ratio if ratio is not None else "n/a"])
    return md_table(["experiment", "M", "network", "run", "drop (points)", "target (%)",
                     "seeds reached", "measured s (mean)", "minus reference's s, "
                     "seed-paired: mean [95 %]", "iterations (mean)",
                     "bench ms / iteration", "projected s (mean)",
                     "projection / measured"], body,
                    ["l", "r", "l", "l"] + ["r"] * 9)


def measured_section(runs: Sequence[Run], settings: Dict[str, object],
                     bench_exps: Sequence[object] = ()) -> List[str]:
    """The report's "Time to accuracy, measured" section (Markdown lines; empty
    when no run has a validation log).

    Args:
        runs: the reproduction's runs.
        settings: the spec's ``measured_time_to_accuracy``.
        bench_exps: its bench experiments (:func:`.bench_report.load`), for
            ``bench_experiments``.
    """
    cells = measured_cells(runs, settings)
    if not cells:
        return []
    overruns = [run_points(r.path)[1] for r in runs
                if not settings.get("experiments")
                or r.experiment in settings["experiments"]]
    spacing = max((c.spacing for c in cells if c.spacing), default=None)
    md = ["## Time to accuracy, measured", "",
          "Wall clock of real training runs (real gradients and test accuracy) whose "
          "compute is padded to an emulated accelerator's time per iteration, on "
          "emulated hosts with shaped links, until the validation accuracy first reaches "
          "the reference's final accuracy (mean over its seeds) minus each drop. The "
          "clock leaves validation out and is divided by the time dilation; validations "
          "every %s iterations, so a time is at most one interval late. Projected: the "
          "same runs' iterations to the target x cpsgd-bench's ms per iteration (the "
          "same model's shapes, the bench alone on the machine), a run's dense warm-up "
          "iterations at the reference's ms: a projection, not a measurement."
          % (spacing if spacing else "n/a"), ""]
    if settings.get("bench_source"):
        md += ["Bench: %s" % settings["bench_source"], ""]
    md += [measured_markdown(cells, bench_times(cells, settings, bench_exps)), ""]
    if overruns:
        md += ["Real compute beyond the padding: at most %.1f %% of a run's clock (the "
               "padding, not this machine's CPU, sets the compute time where this is "
               "small)." % (100 * max(overruns)), ""]
    return md


def check_settings(settings: object) -> Optional[str]:
    """What is wrong with a spec's ``measured_time_to_accuracy`` (None: nothing)."""
    if settings is None:
        return None
    if not isinstance(settings, dict):
        return "'measured_time_to_accuracy' must be a mapping"
    unknown = sorted(set(settings) - set(SETTINGS_KEYS))
    if unknown:
        return "measured_time_to_accuracy: unknown key(s) %s (known: %s)" % (
            ", ".join(unknown), ", ".join(SETTINGS_KEYS))
    drops = settings.get("drops", [0.5])
    if not isinstance(drops, list) or not drops or not all(
            isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0 for d in drops):
        return "measured_time_to_accuracy: 'drops' must be a list of positive points"
    ms = settings.get("bench_ms_per_iteration") or {}
    if not isinstance(ms, dict) or not all(
            isinstance(v, dict) and all(isinstance(x, (int, float)) and x > 0
                                        for x in v.values()) for v in ms.values()):
        return ("measured_time_to_accuracy: 'bench_ms_per_iteration' must map experiment "
                "-> {label: positive ms}")
    named = settings.get("bench_experiments") or {}
    if not isinstance(named, dict) or not all(isinstance(v, str) for v in named.values()):
        return ("measured_time_to_accuracy: 'bench_experiments' must map experiment -> "
                "the name of a bench experiment")
    return None
