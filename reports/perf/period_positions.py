"""Time per iteration by position in cpsgd's correction period, from a cpsgd-bench run.

    python reports/perf/period_positions.py RESULTS_DIR --time-scale D --label cpsgd \
        [--rate 180mbit] [--period 5] [--first 10]

Reads every worker's ``iter_times_s`` under RESULTS_DIR/runs/<rate>-<label>/ (timed
iterations t = first, first + 1, ...; ``first`` is the bench's --warmup-iters) and
prints, for each position p = (t + 1) % period (0: the iteration that ends with a
correction step's loss), the median over workers of each worker's mean iteration
time there, in ms divided by D.  An iteration is the gap between two consecutive
losses becoming readable, so a forward that waits for its weights lengthens the
iteration it belongs to.
"""
import argparse
import glob
import json
import os

import numpy as np


def positions(run_dir, time_scale, period, first):
    """(mean ms, [median-worker ms per position]) of one run directory."""
    times = []
    for path in sorted(glob.glob(os.path.join(run_dir, "worker-*.json"))):
        with open(path) as f:
            times.append(np.array(json.load(f)["iter_times_s"]) * 1000.0 / time_scale)
    if not times:
        raise SystemExit("no worker-*.json under %s" % run_dir)
    times = np.array(times)  # workers x iterations
    by_position = []
    for p in range(period):
        cols = [i for i in range(times.shape[1]) if (first + i + 1) % period == p]
        by_position.append(float(np.median(times[:, cols].mean(axis=1))))
    return float(times.mean()), by_position


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results_dir")
    parser.add_argument("--time-scale", type=float, required=True)
    parser.add_argument("--label", action="append", required=True,
                        help="an algorithm label of the run (repeatable)")
    parser.add_argument("--rate", default="180mbit")
    parser.add_argument("--period", type=int, default=5)
    parser.add_argument("--first", type=int, default=10)
    args = parser.parse_args(argv)
    print("| run | mean | " + " | ".join("(t+1) %% %d = %d" % (args.period, p)
                                         for p in range(args.period)) + " |")
    print("|---|---:|" + "---:|" * args.period)
    for label in args.label:
        run_dir = os.path.join(args.results_dir, "runs", "%s-%s" % (args.rate, label))
        mean, by_position = positions(run_dir, args.time_scale, args.period, args.first)
        print("| %s | %.1f | %s |" % (label, mean, " | ".join("%.1f" % v for v in by_position)))


if __name__ == "__main__":
    main()
