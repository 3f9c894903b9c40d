"""Time to accuracy: how soon each algorithm reaches S-SGD's final accuracy.

The target of a label is the mean final validation accuracy of its reference (S-SGD
of the same experiment, M and network) minus a drop (0.5 and 1 point by default).  Per
seed, the iterations to the target are those of the first epoch end whose validation
accuracy reaches it: the logs have one validation per epoch, so this is an upper bound
that can be up to one epoch late.  Multiplied by a time per iteration measured
elsewhere (``cpsgd-bench`` at the same M), it gives a time to accuracy: the iterations
are measured, the time is combined, and the report says so.
"""
import os
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from .markdown import md_table
from .paired import iteration_series, reference_label, same_setting
from .summary import Group

#: the section's figure (written beside the report)
FIGURE = "time-to-accuracy.png"

#: points below the reference's final accuracy that count as "there"
DEFAULT_DROPS = (0.5, 1.0)


def iterations_to_target(points: Sequence[Tuple[float, float]],
                         target: float) -> Optional[float]:
    """The iteration count of the first ``(iterations, accuracy)`` point whose
    accuracy is at least ``target`` (None if none is)."""
    for iterations, value in points:
        if value >= target:
            return iterations
    return None


@dataclass
class TimeToAccuracy:
    """Iterations ``label`` needs to reach ``reference``'s final accuracy minus ``drop``."""
    experiment: str
    num_workers: int
    rate: Optional[str]
    label: str
    reference: str
    drop: float                         # points
    target: float                       # accuracy (fraction)
    seeds: List[object]
    iterations: List[Optional[float]]   # per seed; None: never reached
    #: a run label whose iterations this row takes (an algorithm with the same arithmetic,
    #: such as Horovod's all-reduce S-SGD for S-SGD, that has no training runs of its own)
    iterations_of: Optional[str] = None

    @property
    def reached(self) -> int:
        return sum(1 for i in self.iterations if i is not None)

    @property
    def mean_iterations(self) -> Optional[float]:
        """Mean over the seeds that reached the target (None if none did)."""
        got = [i for i in self.iterations if i is not None]
        return sum(got) / len(got) if got else None

    def ms_from(self, ms_per_iteration: Dict[str, Dict[str, float]]) -> Optional[float]:
        """This row's time per iteration in a ``{experiment: {label: ms}}`` table."""
        return (ms_per_iteration.get(self.experiment) or {}).get(self.label)

    def seconds(self, ms_per_iteration: Optional[float]) -> Optional[float]:
        """Mean iterations x a measured time per iteration (None if either is missing)."""
        mean = self.mean_iterations
        if mean is None or ms_per_iteration is None:
            return None
        return mean * ms_per_iteration / 1000.0


def time_to_accuracy(groups: Sequence[Group], drops: Sequence[float] = DEFAULT_DROPS,
                     base: str = "SSGD", experiments: Optional[Sequence[str]] = None,
                     same_iterations: Optional[Dict[str, str]] = None
                     ) -> List[TimeToAccuracy]:
    """For every group that has an S-SGD reference (as the paired differences pick it,
    the reference itself included) and every drop, the iterations to the target.

    Args:
        experiments: only these experiments (default: all).
        same_iterations: {name: run label}: a row ``name`` that takes the iterations of
            ``run label`` in the same experiment (an algorithm computing the same update,
            timed but not trained), right after that label's row.
    """
    out = []
    for g in groups:
        if experiments is not None and g.experiment not in experiments:
            continue
        same = same_setting(groups, g)
        labels = [h.label for h in same]
        ref_label = g.label if g.label == base else reference_label(g.label, labels, base)
        if ref_label is None:
            continue
        ref = next(h for h in same if h.label == ref_label)
        final = ref.mean("final_val_acc")
        if final is None:
            continue
        for drop in drops:
            target = final - drop / 100.0
            out.append(TimeToAccuracy(
                g.experiment, g.num_workers, g.rate, g.label, ref_label, drop, target,
                g.seeds, [iterations_to_target(pts, target) for pts in iteration_series(g)]))
    sources: Dict[str, List[str]] = {}
    for name, source in (same_iterations or {}).items():
        sources.setdefault(source, []).append(name)
    rows = []
    for r in out:
        rows.append(r)
        rows += [replace(r, label=name, iterations_of=r.label)
                 for name in sources.get(r.label, [])]
    return rows


def time_to_accuracy_markdown(rows: Sequence[TimeToAccuracy],
                              ms_per_iteration: Optional[Dict[str, Dict[str, float]]] = None
                              ) -> str:
    """The rows as a table; with ``ms_per_iteration`` ({experiment: {label: ms}}), the
    combined time too."""
    ms_per_iteration = ms_per_iteration or {}
    body = []
    for r in rows:
        ms = r.ms_from(ms_per_iteration)
        seconds = r.seconds(ms)
        label = (r.label if r.iterations_of is None
                 else "%s (iterations of %s)" % (r.label, r.iterations_of))
        body.append([
            r.experiment, r.num_workers, r.rate or "loopback", label, r.reference,
            "%.1f" % r.drop, "%.2f" % (100.0 * r.target),
            "%d of %d" % (r.reached, len(r.iterations)),
            "%.0f" % r.mean_iterations if r.mean_iterations is not None else "not reached",
            "%.1f" % ms if ms is not None else "n/a",
            "%.0f" % seconds if seconds is not None else "n/a"])
    return md_table(["experiment", "M", "network", "run", "reference", "drop (points)",
                     "target (%)", "seeds reached", "iterations (measured, mean)",
                     "ms / iteration (measured)", "time to target, s (combined)"], body,
                    ["l", "r", "l", "l", "l", "r", "r", "r", "r", "r", "r"])


def plot_panels(rows: Sequence[TimeToAccuracy],
                ms_per_iteration: Dict[str, Dict[str, float]], drop: float
                ) -> List[Dict[str, object]]:
    """The time-to-accuracy figure's panels (see plots.plot_time_to_accuracy): per
    experiment that has times per iteration, one bar per row at ``drop``."""
    panels: Dict[str, List[Dict[str, object]]] = {}
    for r in rows:
        if r.drop != drop or not ms_per_iteration.get(r.experiment):
            continue
        ms = r.ms_from(ms_per_iteration)
        panels.setdefault("%s, M = %d" % (r.experiment, r.num_workers), []).append({
            "label": "%s (%d of %d seeds)" % (
                r.label if r.iterations_of is None
                else "%s, iter. of %s" % (r.label, r.iterations_of),
                r.reached, len(r.iterations)),
            "seconds": r.seconds(ms),
            "seed_seconds": [i * ms / 1000.0 for i in r.iterations if i is not None]
            if ms else []})
    return [{"name": name, "bars": bars} for name, bars in panels.items()]


def time_to_accuracy_section(groups: Sequence[Group], settings: Dict[str, object],
                             out_dir: Optional[str] = None) -> List[str]:
    """The report's "Time to accuracy" section (Markdown lines) for the spec's
    ``time_to_accuracy`` settings: ``drops`` (points, default 0.5 and 1),
    ``ms_per_iteration`` ({experiment: {label: ms}}, measured elsewhere), ``source``
    (where those times come from), ``experiments`` (only these) and ``same_iterations``
    (rows that take another run's iterations).  With ``out_dir`` and times per
    iteration, the figure ``time-to-accuracy.png`` (the first drop) is written there."""
    rows = time_to_accuracy(groups, drops=settings.get("drops") or DEFAULT_DROPS,
                            experiments=settings.get("experiments"),
                            same_iterations=settings.get("same_iterations"))
    if not rows:
        return []
    md = ["## Time to accuracy", "",
          "Iterations until the validation accuracy first reaches the final accuracy of "
          "S-SGD (the run's reference, mean over its seeds) minus each drop: measured from "
          "the training curves, one validation per epoch, so each count is an upper bound "
          "up to one epoch late; the mean is over the seeds that reached the target. The "
          "time multiplies it by a time per iteration measured elsewhere, so it is combined, "
          "not measured.", ""]
    if settings.get("source"):
        md += ["Time per iteration: %s" % settings["source"], ""]
    md += [time_to_accuracy_markdown(rows, settings.get("ms_per_iteration")), ""]
    drop = (settings.get("drops") or DEFAULT_DROPS)[0]
    panels = plot_panels(rows, settings.get("ms_per_iteration") or {}, drop)
    if out_dir and panels:
        from .plots import plot_time_to_accuracy
        plot_time_to_accuracy(panels, os.path.join(out_dir, FIGURE),
                              "Time to S-SGD's final accuracy minus %g point" % drop)
        md += ["![time to accuracy, combined](%s)" % FIGURE, ""]
    return md


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def check_settings(settings) -> Optional[str]:
    """What is wrong with a spec's ``time_to_accuracy`` (None: nothing): ``drops``
    (positive points), ``ms_per_iteration`` ({experiment: {label: positive ms}}),
    ``source`` (text), ``experiments`` (names) and ``same_iterations`` ({name: run
    label}), each optional."""
    if settings is None:
        return None
    if not isinstance(settings, dict):
        return "'time_to_accuracy' must be a mapping"
    known = ("drops", "ms_per_iteration", "source", "experiments", "same_iterations")
    unknown = sorted(set(settings) - set(known))
    if unknown:
        return ("time_to_accuracy: unknown key(s) %s (known: %s)"
                % (", ".join(unknown), ", ".join(known)))
    exps = settings.get("experiments", [])
    if not isinstance(exps, list) or not all(isinstance(e, str) for e in exps):
        return ("time_to_accuracy: 'experiments' must be a list of experiment "
                "names, got %r" % (exps,))
    same = settings.get("same_iterations") or {}
    if not isinstance(same, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in same.items()):
        return ("time_to_accuracy: 'same_iterations' must map a name to the run "
                "label whose iterations it takes, got %r" % (same,))
    drops = settings.get("drops", [0.5])
    if not isinstance(drops, list) or not drops or not all(_positive(d) for d in drops):
        return ("time_to_accuracy: 'drops' must be a list of positive points, "
                "got %r" % (drops,))
    ms = settings.get("ms_per_iteration") or {}
    if not isinstance(ms, dict) or not all(
            isinstance(v, dict) and all(_positive(x) for x in v.values())
            for v in ms.values()):
        return ("time_to_accuracy: 'ms_per_iteration' must map experiment -> "
                "{label: positive ms}, got %r" % (ms,))
    return None
