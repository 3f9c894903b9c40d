"""Seed-paired comparisons: each run against the reference run of the same seed.

Runs of one experiment, M and network that share a seed share their data order and
initial weights, so the difference of their final accuracies is paired: its mean over
seeds and a 95 % confidence interval (Student's t on the paired differences) say more
than two means with their spreads.  "Equal" needs more than an interval that includes 0:
:meth:`PairedDiff.equivalence` is the two one-sided tests (TOST) at a margin fixed before
the runs (the 90 % interval inside [-margin, +margin]).  The reference of a label is S-SGD at the same
setting: ``SSGD`` for plain labels, ``SSGD-<suffix>`` for a label ending in
``-<suffix>`` (e.g. ``k5-mom0`` against ``SSGD-mom0``) when such a group exists.
"""
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .summary import FAILED_POINTS, Group

#: two-sided 95 % quantiles of Student's t, by degrees of freedom (1..30)
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
       2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
       2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


#: one-sided 95 % quantiles (two-sided 90 %), by degrees of freedom (1..30): TOST's
T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
       1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
       1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t90(df: int) -> float:
    """Two-sided 90 % (one-sided 95 %) quantile of Student's t with ``df`` degrees of
    freedom (>= 1); 1.645 beyond the table."""
    if df < 1:
        raise ValueError("t90 needs df >= 1, got %r" % df)
    return T90[df - 1] if df <= len(T90) else 1.645


def t95(df: int) -> float:
    """Two-sided 95 % quantile of Student's t with ``df`` degrees of freedom (>= 1);
    1.96 beyond the table."""
    if df < 1:
        raise ValueError("t95 needs df >= 1, got %r" % df)
    return T95[df - 1] if df <= len(T95) else 1.96


@dataclass
class PairedDiff:
    """Final accuracy of ``label`` minus ``reference``'s, per seed, in points."""
    experiment: str
    num_workers: int
    rate: Optional[str]
    label: str
    reference: str
    seeds: List[object]
    diffs: List[float]          # percentage points, one per paired seed

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> Optional[float]:
        return sum(self.diffs) / self.n if self.diffs else None

    @property
    def std(self) -> Optional[float]:
        if self.n < 2:
            return None
        m = self.mean
        return math.sqrt(sum((d - m) ** 2 for d in self.diffs) / (self.n - 1))

    @property
    def ci(self) -> Optional[Tuple[float, float]]:
        """95 % confidence interval of the mean difference (None below 2 seeds)."""
        if self.n < 2:
            return None
        half = t95(self.n - 1) * self.std / math.sqrt(self.n)
        return self.mean - half, self.mean + half

    @property
    def ci90(self) -> Optional[Tuple[float, float]]:
        """90 % confidence interval of the mean difference (None below 2 seeds): the
        interval of the two one-sided tests at level 5 % each."""
        if self.n < 2:
            return None
        half = t90(self.n - 1) * self.std / math.sqrt(self.n)
        return self.mean - half, self.mean + half

    def equivalence(self, margin: float, min_seeds: int = 2) -> str:
        """TOST at +-``margin`` points: 'equivalent' when the 90 % interval lies inside
        [-margin, +margin], 'not shown equivalent (...)' otherwise, naming the end(s) of the
        interval outside the margin (the one-sided test(s) that failed),
        'one seed: no interval' with one seed; with fewer than ``min_seeds`` pairs (a
        number fixed before the runs) the test is not decided yet, whatever the interval."""
        if margin <= 0:
            raise ValueError("an equivalence margin must be > 0 points, got %r" % margin)
        ci = self.ci90
        if ci is None:
            return "one seed: no interval"
        if self.n < min_seeds:
            return "not decided (%d of %d seeds)" % (self.n, min_seeds)
        low_inside, high_inside = -margin < ci[0], ci[1] < margin
        if low_inside and high_inside:
            return "equivalent"
        # which one-sided test failed tells a user more than the bare verdict: a lower
        # end inside the margin still shows "not worse by the margin"
        if low_inside:
            return "not shown equivalent (upper end above %+g)" % margin
        if high_inside:
            return "not shown equivalent (lower end below %+g)" % -margin
        return "not shown equivalent (both ends outside +-%g)" % margin

    @property
    def not_trained(self) -> List[object]:
        """The seeds whose run ended more than FAILED_POINTS below its reference: it
        did not train (collapsed), which says more as a count than inside a mean."""
        return [s for s, d in zip(self.seeds, self.diffs) if d < -FAILED_POINTS]

    def trained(self) -> "PairedDiff":
        """The same comparison over the seeds that trained only."""
        keep = [(s, d) for s, d in zip(self.seeds, self.diffs) if d >= -FAILED_POINTS]
        return PairedDiff(self.experiment, self.num_workers, self.rate, self.label,
                          self.reference, [s for s, _ in keep], [d for _, d in keep])

    @property
    def verdict(self) -> str:
        """What the interval allows: 'below', 'above', 'not distinguishable' or,
        with one seed, 'one seed: no interval'."""
        ci = self.ci
        if ci is None:
            return "one seed: no interval"
        if ci[1] < 0:
            return "below"
        if ci[0] > 0:
            return "above"
        return "not distinguishable"


def same_setting(groups: Sequence[Group], group: Group) -> List[Group]:
    """The groups of ``group``'s experiment, M and network (``group`` included)."""
    return [h for h in groups if (h.experiment, h.num_workers, h.rate) ==
            (group.experiment, group.num_workers, group.rate)]


def reference_label(label: str, labels: Sequence[str], base: str = "SSGD") -> Optional[str]:
    """The S-SGD label ``label`` is compared with (None for the base itself)."""
    if label == base:
        return None
    parts = label.split("-")
    for i in range(1, len(parts)):
        candidate = "-".join([base] + parts[i:])
        if candidate in labels and candidate != label:
            return candidate
    return base if base in labels else None


def _final_by_seed(group: Group) -> Dict[object, float]:
    out = {}
    for s in group.runs:
        if s.final_val_acc is not None:
            out[s.run.meta.get("seed")] = float(s.final_val_acc)
    return out


def paired_differences(groups: Sequence[Group], base: str = "SSGD",
                       also_base: bool = False) -> List[PairedDiff]:
    """Every group's paired difference to its reference group (same experiment, M,
    network), over the seeds both have; groups in their given order, S-SGD variants
    included against ``base``.

    Args:
        groups: the report's groups.
        base: the label of plain S-SGD.
        also_base: a group whose reference is a variant (``SSGD-mom0``) is compared
            with ``base`` too (a second row, after the first).
    """
    out = []
    for g in groups:
        same = same_setting(groups, g)
        labels = [h.label for h in same]
        ref = reference_label(g.label, labels, base)
        if ref is None or ref == g.label:
            continue
        refs = [ref]
        if also_base and ref != base and base in labels:
            refs.append(base)
        for r in refs:
            out.append(paired_difference(g, next(h for h in same if h.label == r)))
    return out


def paired_difference(group: Group, reference: Group) -> PairedDiff:
    """``group``'s final accuracy minus ``reference``'s over the seeds both have."""
    mine, theirs = _final_by_seed(group), _final_by_seed(reference)
    seeds = sorted((s for s in mine if s in theirs), key=lambda s: (str(type(s)), s))
    return PairedDiff(group.experiment, group.num_workers, group.rate, group.label,
                      reference.label, seeds, [100.0 * (mine[s] - theirs[s]) for s in seeds])


def collapsed_seeds(group: Group) -> List[object]:
    """Seeds whose final accuracy is more than FAILED_POINTS below the best seed of
    the same label: runs that did not train."""
    finals = _final_by_seed(group)
    if not finals:
        return []
    best = max(finals.values())
    return [s for s, acc in finals.items() if 100.0 * (best - acc) > FAILED_POINTS]


def chosen_differences(groups: Sequence[Group],
                       comparisons: Sequence[Dict[str, str]]) -> List[PairedDiff]:
    """The spec's ``comparisons`` (``{experiment, run, vs}``: two labels of one
    experiment), each at every M and network where both labels have runs, in the
    spec's order; a comparison without such runs is left out.  Where either run
    did not train at some paired seed (:func:`collapsed_seeds`), a second row
    follows over the other seeds, its label marked ``(seeds that trained)``."""
    out = []
    for c in comparisons:
        for g in groups:
            if g.experiment != c["experiment"] or g.label != c["run"]:
                continue
            ref = next((h for h in groups if h.label == c["vs"] and
                        (h.experiment, h.num_workers, h.rate) ==
                        (g.experiment, g.num_workers, g.rate)), None)
            if ref is None:
                continue
            d = paired_difference(g, ref)
            out.append(d)
            failed = set(collapsed_seeds(g)) | set(collapsed_seeds(ref))
            if failed & set(d.seeds):
                keep = [(s, x) for s, x in zip(d.seeds, d.diffs) if s not in failed]
                out.append(PairedDiff(d.experiment, d.num_workers, d.rate,
                                      "%s (seeds that trained)" % d.label, d.reference,
                                      [s for s, _ in keep], [x for _, x in keep]))
    return out


def iteration_series(group: Group, name: str = "val_acc"):
    """Per seed, ``[(cumulative iterations at the epoch's end, value)]``.

    The count is the epoch's ``total_iterations`` where the log has it: after a
    resume, an epoch's ``iterations`` counts only the steps taken since, so their
    sum would leave out the steps before it.  Logs without it are summed."""
    out = []
    for s in group.runs:
        total, pts = 0.0, []
        for p in s.series:
            if p.get("total_iterations") is not None:
                total = float(p["total_iterations"])
            else:
                total += p.get("iterations") or 0.0
            if p.get(name) is not None:
                pts.append((total, float(p[name])))
        out.append(pts)
    return out
