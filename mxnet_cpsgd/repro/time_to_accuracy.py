"""Time to accuracy: how soon each algorithm reaches S-SGD's final accuracy.

The target of a label is the mean final validation accuracy of its reference (S-SGD
of the same experiment, M and network) minus a drop (0.5 and 1 point by default).  Per
seed, the iterations to the target are those of the first epoch end whose validation
accuracy reaches it: the logs have one validation per epoch, so this is an upper bound
that can be up to one epoch late.  Multiplied by a time per iteration measured
elsewhere (``cpsgd-bench`` at the same M), it gives a time to accuracy: the iterations
are measured, the time is combined, and the report says so.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .markdown import md_table
from .paired import iteration_series, reference_label, same_setting
from .summary import Group

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

    @property
    def reached(self) -> int:
        return sum(1 for i in self.iterations if i is not None)

    @property
    def mean_iterations(self) -> Optional[float]:
        """Mean over the seeds that reached the target (None if none did)."""
        got = [i for i in self.iterations if i is not None]
        return sum(got) / len(got) if got else None

    def seconds(self, ms_per_iteration: Optional[float]) -> Optional[float]:
        """Mean iterations x a measured time per iteration (None if either is missing)."""
        mean = self.mean_iterations
        if mean is None or ms_per_iteration is None:
            return None
        return mean * ms_per_iteration / 1000.0


def time_to_accuracy(groups: Sequence[Group], drops: Sequence[float] = DEFAULT_DROPS,
                     base: str = "SSGD") -> List[TimeToAccuracy]:
    """For every group that has an S-SGD reference (as the paired differences pick it,
    the reference itself included) and every drop, the iterations to the target."""
    out = []
    for g in groups:
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
    return out


def time_to_accuracy_markdown(rows: Sequence[TimeToAccuracy],
                              ms_per_iteration: Optional[Dict[str, Dict[str, float]]] = None
                              ) -> str:
    """The rows as a table; with ``ms_per_iteration`` ({experiment: {label: ms}}), the
    combined time too."""
    ms_per_iteration = ms_per_iteration or {}
    body = []
    for r in rows:
        ms = (ms_per_iteration.get(r.experiment) or {}).get(r.label)
        seconds = r.seconds(ms)
        body.append([
            r.experiment, r.num_workers, r.rate or "loopback", r.label, r.reference,
            "%.1f" % r.drop, "%.2f" % (100.0 * r.target),
            "%d of %d" % (r.reached, len(r.iterations)),
            "%.0f" % r.mean_iterations if r.mean_iterations is not None else "not reached",
            "%.1f" % ms if ms is not None else "n/a",
            "%.0f" % seconds if seconds is not None else "n/a"])
    return md_table(["experiment", "M", "network", "run", "reference", "drop (points)",
                     "target (%)", "seeds reached", "iterations (measured, mean)",
                     "ms / iteration (measured)", "time to target, s (combined)"], body,
                    ["l", "r", "l", "l", "l", "r", "r", "r", "r", "r", "r"])


def time_to_accuracy_section(groups: Sequence[Group], settings: Dict[str, object]) -> List[str]:
    """The report's "Time to accuracy" section (Markdown lines) for the spec's
    ``time_to_accuracy`` settings: ``drops`` (points, default 0.5 and 1),
    ``ms_per_iteration`` ({experiment: {label: ms}}, measured elsewhere) and
    ``source`` (where those times come from)."""
    rows = time_to_accuracy(groups, drops=settings.get("drops") or DEFAULT_DROPS)
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
    return md
