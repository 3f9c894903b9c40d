"""Scaling against workers (``cpsgd-bench --plot-workers``): the results.json
of one worker count are one group; per group and algorithm the plots draw the
mean time per iteration and throughput over its invocations, with their spread
(the fastest to the slowest invocation) where it has several.  With several
invocations of a worker count, scaling.md also puts every invocation's time and
efficiency side by side ("a / b", as docs/performance.md's Summary).

Invocations are averaged only where they measured the same thing: the same
model, batch size, servers, placement, link queue, emulated compute, rates and
time dilation (:func:`group_by_workers` refuses anything else).  What may differ
is how long they timed and which algorithms they ran.

With ``--plot-rate fastest|slowest`` each results.json is first reduced to one
of its rates (:func:`one_rate_of`), so files that ran different rate sets (one
point, or both the balanced and the exchange-bound point) share a plot; the
invocations of a worker count must then share that chosen rate.
"""
from typing import Dict, List, Optional, Sequence

from mxnet_cpsgd.bench.worker import COMPUTE_ONLY
from mxnet_cpsgd.cluster import netem

from .output import one_rate_each, scaling_table, timed_rows
from .runs import BenchError, fmt_value, rate_sort_key

#: config keys that must agree between invocations averaged into one point,
#: with the names the refusal uses and the value a key has when absent
SAME_SETTINGS = (("model", "model", None), ("batch_size", "batch size", None),
                 ("num_servers", "servers", None), ("placement", "placement", "separate"),
                 ("queue", "link queue", "fifo"), ("emulate_compute", "emulated compute", 0),
                 ("rates", "rates", []), ("time_scale", "time scale", 1))

COMPUTE_LABEL = "compute only"

#: ``--plot-rate`` choices: which of a file's rates it is reduced to
PLOT_RATES = ("fastest", "slowest")


def one_rate_of(result: dict, which: str) -> dict:
    """The result reduced to its fastest or slowest rate (compared by bits per
    second; an unshaped rate is the fastest): config "rates" that one, the rows
    of the other rates dropped, the compute-only job's row (rate "-") kept."""
    rates = list(result["config"].get("rates") or [])
    if len(rates) < 2:
        return result
    try:
        keyed = sorted(rates, key=rate_sort_key)
    except netem.NetemError as err:
        raise BenchError("--plot-rate: %s" % err)
    chosen = keyed[-1] if which == "fastest" else keyed[0]
    rows = [row for row in result["rows"]
            if row["algorithm"] == COMPUTE_ONLY or row.get("rate") == chosen]
    return dict(result, config=dict(result["config"], rates=[chosen]), rows=rows)


def _setting(cfg: dict, key: str, absent):
    value = cfg.get(key)
    if value is None:
        value = absent
    if key == "time_scale":
        value = value or 1
    return list(value) if isinstance(value, (list, tuple)) else value


def group_by_workers(results: Sequence[dict], paths: Optional[Sequence[str]] = None,
                     plot_rate: Optional[str] = None) -> Dict[int, List[dict]]:
    """{workers: [results of that worker count, in the order given]}; raises
    :class:`BenchError` when invocations of one worker count differ in a setting
    of :data:`SAME_SETTINGS` (their mean would mix two measurements); with
    ``plot_rate`` the refusal says that the rates compared are the chosen ones."""
    paths = list(paths) if paths is not None else ["result %d" % (i + 1)
                                                   for i in range(len(results))]
    groups: Dict[int, List[tuple]] = {}
    for path, result in zip(paths, results):
        groups.setdefault(result["config"]["num_workers"], []).append((path, result))
    for n, members in groups.items():
        first_path, first = members[0]
        for path, result in members[1:]:
            for key, name, absent in SAME_SETTINGS:
                want = _setting(first["config"], key, absent)
                got = _setting(result["config"], key, absent)
                if got != want:
                    raise BenchError(
                        "--plot-workers: the %d-worker results differ in %s (%s: %s; %s: "
                        "%s): invocations with the same worker count are averaged into one "
                        "point, so they must share %s" % (
                            n, name, first_path, _shown(want), path, _shown(got),
                            ", ".join(s[1] for s in SAME_SETTINGS))
                        + ("; with --plot-rate %s a file's rate is its %s one" % (
                            plot_rate, plot_rate) if plot_rate and key == "rates" else ""))
    return {n: [r for _, r in members] for n, members in sorted(groups.items())}


def _shown(value) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "%g" % value if isinstance(value, (int, float)) else str(value)


def invocation_times(result: dict, one_rate: bool) -> Dict[str, float]:
    """{label: ms per iteration} of one invocation, the compute-only job under
    :data:`COMPUTE_LABEL`; a label is the algorithm, with its rate when the
    results ran several rates."""
    times = {}
    if result.get("compute_ms"):
        times[COMPUTE_LABEL] = result["compute_ms"]
    for label, row in timed_rows(result, one_rate):
        times[label] = row["mean_ms"]
    return times


def collect(groups: Dict[int, List[dict]]):
    """(labels in order of first appearance, {workers: [{label: ms} of each
    invocation]}) over grouped results."""
    results = [r for members in groups.values() for r in members]
    one_rate = one_rate_each(results)
    times = {n: [invocation_times(r, one_rate) for r in members]
             for n, members in groups.items()}
    labels = [COMPUTE_LABEL] if any(COMPUTE_LABEL in t for ts in times.values()
                                    for t in ts) else []
    for ts in times.values():
        for t in ts:
            labels += [label for label in t if label not in labels]
    return labels, times


def column_title(n: int, members: List[dict]) -> str:
    cfg = members[0]["config"]
    return "%d workers (%s, x%g)" % (n, "/".join(cfg.get("rates") or []) or "-",
                                    cfg.get("time_scale") or 1)


def summary_table(groups: Dict[int, List[dict]]) -> str:
    """Markdown: a row per algorithm, a column per worker count; a cell holds
    every invocation's ms per iteration ("a / b", in the order given; "-" for
    one that did not run it) and, in brackets, each one's efficiency (its own
    compute-only time / its ms)."""
    labels, times = collect(groups)
    workers = sorted(groups)
    lines = ["| algorithm | " + " | ".join(column_title(n, groups[n]) for n in workers) + " |",
             "|---|" + "---:|" * len(workers)]
    for label in labels:
        cells = []
        for n in workers:
            if not any(label in t for t in times[n]):
                cells.append("-")
                continue
            ms = " / ".join(fmt_value(t.get(label)) for t in times[n])
            if label == COMPUTE_LABEL or not any(COMPUTE_LABEL in t and label in t
                                                 for t in times[n]):
                cells.append(ms)
            else:
                cells.append("%s (%s)" % (ms, " / ".join(
                    fmt_value(t[COMPUTE_LABEL] / t[label] if COMPUTE_LABEL in t
                              and label in t else None, "%.2f") for t in times[n])))
        lines.append("| %s | %s |" % (label, " | ".join(cells)))
    return "\n".join(lines)


def invocation_legend(paths: Sequence[str], results: Sequence[dict]) -> str:
    """Which file is which value of a cell: one line per worker count."""
    by_workers: Dict[int, List[str]] = {}
    for path, result in zip(paths, results):
        by_workers.setdefault(result["config"]["num_workers"], []).append(path)
    return "\n".join("- %d workers: %s" % (n, " / ".join(by_workers[n]))
                     for n in sorted(by_workers))


def spread(values: List[float]):
    """(mean, min, max) of one point's invocations."""
    return sum(values) / len(values), min(values), max(values)


def plotted_points(groups: Dict[int, List[dict]], kind: str = "time"):
    """{label: [(workers, mean, min, max, invocations)]}: what the plots draw,
    ms per iteration (``kind='time'``) or samples/s of all workers
    ('throughput'; for the compute-only label: the ideal, workers x batch /
    compute time)."""
    labels, times = collect(groups)
    points = {}
    for label in labels:
        for n in sorted(groups):
            ms = [t[label] for t in times[n] if label in t]
            if not ms:
                continue
            batch = groups[n][0]["config"]["batch_size"]
            values = ms if kind == "time" else [n * batch / (v / 1e3) for v in ms]
            points.setdefault(label, []).append((n,) + spread(values) + (len(values),))
    return points


def points_table(groups: Dict[int, List[dict]]) -> str:
    """Markdown of the time plot's points: the mean ms per iteration and, where
    a worker count has several invocations, (fastest-slowest)."""
    workers = sorted(groups)
    lines = ["| algorithm | " + " | ".join(column_title(n, groups[n]) for n in workers) + " |",
             "|---|" + "---:|" * len(workers)]
    for label, pts in plotted_points(groups).items():
        cells = {p[0]: fmt_value(p[1]) if p[4] == 1 else "%s (%s-%s)" % (
            fmt_value(p[1]), fmt_value(p[2]), fmt_value(p[3])) for p in pts}
        lines.append("| %s | %s |" % (label, " | ".join(cells.get(n, "-") for n in workers)))
    return "\n".join(lines)


def plot_title(groups: Dict[int, List[dict]], plot_rate: Optional[str] = None) -> str:
    """The plots' title: the setting, each worker count's rate, dilation and
    invocations and, with ``plot_rate``, which of each file's rates is drawn."""
    workers = sorted(groups)
    cfg = groups[workers[0]][0]["config"]
    several = any(len(groups[n]) > 1 for n in workers)
    title = "%s, %s placement, %s\n%s\n%s" % (
        cfg["model"], cfg.get("placement", "separate"),
        "emulated compute %g ms" % cfg["emulate_compute"] if cfg.get("emulate_compute")
        else "real compute",
        "; ".join("%d: %s x%g%s" % (n, "/".join(groups[n][0]["config"].get("rates") or []),
                                     groups[n][0]["config"].get("time_scale") or 1,
                                     " (%d)" % len(groups[n]) if several else "")
                  for n in workers),
        "workers: rate xD (invocations); the mean of the invocations, bars from the fastest "
        "to the slowest" if several else "workers: rate xD")
    if plot_rate:
        title += "\nthe %s rate of each results file" % plot_rate
    return title


def plot_scaling(groups: Dict[int, List[dict]], time_path: str,
                 throughput_path: str, plot_rate: Optional[str] = None) -> None:
    """time_vs_workers and throughput_vs_workers: per algorithm the mean over a
    worker count's invocations, bars from the fastest to the slowest where it
    has several; the compute-only time (and the ideal throughput) dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    workers = sorted(groups)
    dilated = any((groups[n][0]["config"].get("time_scale") or 1) != 1 for n in workers)
    title = plot_title(groups, plot_rate)
    for kind, path in (("time", time_path), ("throughput", throughput_path)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, pts in plotted_points(groups, kind).items():
            if label == COMPUTE_LABEL:
                style = dict(fmt="k--x", label="compute only" if kind == "time"
                             else "ideal (compute only)")
            else:
                style = dict(fmt="-o", label=label)
            # a point of one invocation has no spread: no bar, not even its caps
            with_bar = np.array([p[4] > 1 for p in pts])
            if with_bar.any():
                style.update(yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                             errorevery=with_bar, capsize=3)
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], **style)
        ax.set_xlabel("workers")
        ax.set_ylabel(("time per iteration, ms" if kind == "time" else "samples/s, all workers")
                      + (" (dilated, divided back)" if dilated else ""))
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers)
        ax.set_xticklabels([str(n) for n in workers])
        ax.minorticks_off()
        ax.set_ylim(0, None)
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def keep_algorithms(results: List[dict], algorithms: Sequence[str]) -> List[dict]:
    """The results with only the rows of ``algorithms`` (and the compute-only
    job's), in that order; raises :class:`BenchError` for a name no result has."""
    present = {row["algorithm"] for r in results for row in r["rows"]}
    missing = [a for a in algorithms if a not in present]
    if missing:
        raise BenchError("--plot-workers --algorithms: %s in none of the results (they have "
                         "%s)" % (", ".join(missing), ", ".join(sorted(
                             present - {COMPUTE_ONLY}))))
    order = {a: i for i, a in enumerate(algorithms)}
    kept = []
    for r in results:
        rows = [row for row in r["rows"] if row["algorithm"] in order
                or row["algorithm"] == COMPUTE_ONLY]
        rows.sort(key=lambda row: order.get(row["algorithm"], -1))
        kept.append(dict(r, rows=rows))
    return kept


def plot_workers(paths: Sequence[str], out_dir: str,
                 algorithms: Optional[Sequence[str]] = None,
                 plot_rate: Optional[str] = None) -> str:
    """``cpsgd-bench --plot-workers``: time_vs_workers.png,
    throughput_vs_workers.png and scaling.md in ``out_dir`` from several
    results.json; returns scaling.md's text: every invocation's row
    (:func:`.output.scaling_table`), after the "a / b" table and the plotted
    points where a worker count has several invocations.  With ``plot_rate``
    ('fastest' or 'slowest') every file is first reduced to that one of its
    rates (:func:`one_rate_of`) and the text begins by saying so."""
    import json
    import os

    results = []
    for path in paths:
        with open(path) as f:
            results.append(json.load(f))
    if plot_rate:
        results = [one_rate_of(r, plot_rate) for r in results]
    if algorithms:
        results = keep_algorithms(results, algorithms)
    groups = group_by_workers(results, paths, plot_rate)
    os.makedirs(out_dir, exist_ok=True)
    plot_scaling(groups, os.path.join(out_dir, "time_vs_workers.png"),
                 os.path.join(out_dir, "throughput_vs_workers.png"), plot_rate)
    text = scaling_table(results)
    if any(len(members) > 1 for members in groups.values()):
        text = "\n\n".join([
            summary_table(groups),
            "ms per iteration of every invocation (\"a / b\": in the order of these files) "
            "and, in brackets, its efficiency (its own compute-only time / ms):",
            invocation_legend(paths, results),
            "The plotted points: the mean ms per iteration over a worker count's "
            "invocations and, in brackets, the fastest-slowest of them (the bars):",
            points_table(groups),
            "Every invocation:", text])
    if plot_rate:
        text = ("Each results file reduced to its %s rate (--plot-rate %s; the compute-only "
                "job kept).\n\n%s" % (plot_rate, plot_rate, text))
    with open(os.path.join(out_dir, "scaling.md"), "w") as f:
        f.write(text + "\n")
    return text
