"""Per timed iteration of a cpsgd-bench run: its time and the busiest link's bytes.

    python docs/perf/iteration_rounds.py RESULTS_DIR [--period K]

For every run under RESULTS_DIR/runs/ (worker-*.json), one line per timed
iteration: the slowest and the median worker's iteration time and the most bytes
any host link carried one way in that iteration (workers record their host
link's counters after every iteration), and then the means by the iteration's
phase in the correction period (phase K-1 = the step of a dense correction
round when the timed window starts on a multiple of K).  Times are divided by
the run's dilation.  Needs runs whose workers recorded iter_tx_bytes.
"""
import argparse
import glob
import json
import os
import statistics


def load_run(run_dir):
    workers = []
    for path in sorted(glob.glob(os.path.join(run_dir, "worker-*.json"))):
        with open(path) as f:
            workers.append(json.load(f))
    return workers


def rows_of(workers, scale):
    n = min(len(w["iter_times_s"]) for w in workers)
    rows = []
    for i in range(n):
        times = sorted(1e3 * w["iter_times_s"][i] / scale for w in workers)
        link = None
        if all(w.get("iter_tx_bytes") for w in workers):
            link = max(max(w["iter_tx_bytes"][i], w["iter_rx_bytes"][i]) for w in workers)
        rows.append({"i": i, "max_ms": times[-1], "median_ms": times[len(times) // 2],
                     "link_kb": None if link is None else link / 1e3})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results_dir")
    p.add_argument("--period", type=int, default=5)
    p.add_argument("--time-scale", type=float, default=None,
                   help="the dilation (default: results.json's)")
    p.add_argument("--warmup-iters", type=int, default=None,
                   help="discarded iterations (default: results.json's)")
    args = p.parse_args()
    config = {}
    path = os.path.join(args.results_dir, "results.json")
    if os.path.exists(path):  # absent while the sweep still runs
        with open(path) as f:
            config = json.load(f)["config"]
    scale = args.time_scale or float(config.get("time_scale") or 1.0)
    warmup = (args.warmup_iters if args.warmup_iters is not None
              else int(config.get("warmup_iters") or 0))
    for run_dir in sorted(glob.glob(os.path.join(args.results_dir, "runs", "*"))):
        workers = load_run(run_dir)
        if not workers:
            continue
        rows = rows_of(workers, scale)
        print("## %s (dilated x%g; step = %d + i)\n" % (os.path.basename(run_dir), scale,
                                                        warmup))
        print("| i | phase | slowest worker ms | median worker ms | busiest link KB |")
        print("|---:|---:|---:|---:|---:|")
        for r in rows:
            print("| %d | %d | %.1f | %.1f | %s |" % (
                r["i"], (warmup + r["i"]) % args.period, r["max_ms"], r["median_ms"],
                "-" if r["link_kb"] is None else "%.0f" % r["link_kb"]))
        print("\nmeans by phase (step mod %d), the first timed iteration left out:\n"
              % args.period)
        print("| phase | iterations | slowest worker ms | median worker ms | busiest link KB |")
        print("|---:|---:|---:|---:|---:|")
        for phase in range(args.period):
            group = [r for r in rows[1:] if (warmup + r["i"]) % args.period == phase]
            if not group:
                continue
            links = [r["link_kb"] for r in group if r["link_kb"] is not None]
            print("| %d | %d | %.1f | %.1f | %s |" % (
                phase, len(group), statistics.mean(r["max_ms"] for r in group),
                statistics.mean(r["median_ms"] for r in group),
                "%.0f" % statistics.mean(links) if links else "-"))
        print()


if __name__ == "__main__":
    main()
