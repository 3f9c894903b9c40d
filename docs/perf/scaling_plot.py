"""Draw docs/performance.md's scaling plots from several cpsgd-bench invocations.

    python docs/perf/scaling_plot.py --algorithms ssgd,bitsgd,cpsgd,horovod \
        --out-dir docs/perf RESULTS [RESULTS ...]

RESULTS: a results.json that cpsgd-bench wrote, or the results .md it wrote
(docs/perf/*-results.md: its first table is read).  Invocations with the same
worker count are one point: the mean of their ms per iteration, with a bar from the
fastest to the slowest invocation.  Writes time_vs_workers-dilated.png and
throughput_vs_workers-dilated.png (samples/s of all workers, with the ideal line
workers x batch / compute-only time) and prints every invocation's ms per iteration
and efficiency (its compute-only time / ms) as a markdown table.
"""
import argparse
import json
import os
import re
from collections import defaultdict

COMPUTE = "compute"


def read_results(path):
    """(workers, batch, time_scale, rate, {algorithm: ms/iter}) of one invocation."""
    if path.endswith(".json"):
        with open(path) as f:
            result = json.load(f)
        cfg = result["config"]
        times = {row["algorithm"]: row["mean_ms"] for row in result["rows"]
                 if row.get("mean_ms") is not None}
        return (cfg["num_workers"], cfg["batch_size"], cfg.get("time_scale") or 1,
                "/".join(cfg.get("rates") or []), times)
    with open(path) as f:
        text = f.read()
    found = re.search(r"(\d+) workers, \d+ server\(s\), batch (\d+) per worker", text)
    scale = re.search(r"\*\*Dilated x(\d+)\*\*", text)
    times, rates = {}, set()
    table = text.split("| rate | algorithm | ms/iter |", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[2] not in ("", "-"):
            times[cells[1]] = float(cells[2].replace(",", ""))
            if cells[0] != "-":
                rates.add(cells[0])
    return (int(found.group(1)), int(found.group(2)), int(scale.group(1)) if scale else 1,
            "/".join(sorted(rates)), times)


def collect(paths, algorithms):
    """{workers: {algorithm: [ms, ...]}}, {workers: batch}, {workers: 'rate xD'},
    {workers: [{algorithm: ms} of each invocation]}."""
    points, batch, labels = defaultdict(lambda: defaultdict(list)), {}, defaultdict(set)
    invocations = defaultdict(list)
    for path in paths:
        n, b, scale, rate, times = read_results(path)
        batch[n] = b
        labels[n].add("%s x%d" % (rate, scale))
        invocations[n].append(times)
        for algorithm, ms in times.items():
            if algorithm == COMPUTE or algorithm in algorithms:
                points[n][algorithm].append(ms)
    return points, batch, {n: ", ".join(sorted(v)) for n, v in labels.items()}, invocations


def plot(points, batch, labels, algorithms, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted(points)
    title = "resnet20 shapes, colocated, emulated compute 100 ms, dilated\n" + \
        "; ".join("%d: %s" % (n, labels[n]) for n in workers)
    for kind in ("time", "throughput"):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for algorithm in [COMPUTE] + algorithms:
            ns = [n for n in workers if points[n].get(algorithm)]
            if not ns:
                continue
            values = [points[n][algorithm] for n in ns]
            if kind == "time":
                ys = [[v for v in vs] for vs in values]
            else:  # samples per second of the whole job
                ys = [[n * batch[n] / (v / 1e3) for v in vs] for n, vs in zip(ns, values)]
            mean = [sum(y) / len(y) for y in ys]
            err = [[m - min(y) for m, y in zip(mean, ys)], [max(y) - m for m, y in zip(mean, ys)]]
            style = dict(fmt="k--x", label="compute only" if kind == "time"
                         else "ideal (compute only)") if algorithm == COMPUTE else \
                dict(fmt="-o", label=algorithm)
            ax.errorbar(ns, mean, yerr=err, capsize=3, **style)
        ax.set_xlabel("workers")
        ax.set_ylabel("ms per iteration (dilated, divided back)" if kind == "time"
                      else "samples/s, all workers")
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers)
        ax.set_xticklabels([str(n) for n in workers])
        ax.set_ylim(0, None)
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "%s_vs_workers-dilated.png" % kind), dpi=110)
        plt.close(fig)


def table(invocations, labels, algorithms):
    """Per worker count and algorithm: every invocation's ms per iteration and, in
    brackets, its efficiency (that invocation's compute-only time / ms)."""
    workers = sorted(invocations)
    lines = ["| algorithm | " + " | ".join("%d workers (%s)" % (n, labels[n]) for n in workers)
             + " |", "|---|" + "---:|" * len(workers)]
    for algorithm in [COMPUTE] + algorithms:
        cells = []
        for n in workers:
            runs = [t for t in invocations[n] if algorithm in t]
            if not runs:
                cells.append("-")
                continue
            ms = " / ".join("%.1f" % t[algorithm] for t in runs)
            if algorithm == COMPUTE or not all(COMPUTE in t for t in runs):
                cells.append(ms)
            else:
                cells.append("%s (%s)" % (ms, " / ".join(
                    "%.2f" % (t[COMPUTE] / t[algorithm]) for t in runs)))
        lines.append("| %s | %s |" % (algorithm, " | ".join(cells)))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--algorithms", default="ssgd,bitsgd,cpsgd,horovod")
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args(argv)
    algorithms = args.algorithms.split(",")
    points, batch, labels, invocations = collect(args.results, algorithms)
    plot(points, batch, labels, algorithms, args.out_dir)
    print(table(invocations, labels, algorithms))


if __name__ == "__main__":
    main()
