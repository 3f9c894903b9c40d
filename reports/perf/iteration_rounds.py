"""Per timed iteration of a cpsgd-bench run: its time and the busiest link's bytes.

    python reports/perf/iteration_rounds.py RESULTS_DIR [--period K] [--periods]
    python reports/perf/iteration_rounds.py reports/perf/NAME-iterations.json --periods

For every run under RESULTS_DIR/runs/ (worker-*.json; or in an -iterations.json
that keeps those fields of every worker), one line per timed
iteration: the slowest and the median worker's iteration time and the most bytes
any host link carried one way in that iteration (workers record their host
link's counters after every iteration), and then the means by the iteration's
phase in the correction period (phase K-1 = the step of a dense correction
round when the timed window starts on a multiple of K).  Times are divided by
the run's dilation.  Needs runs whose workers recorded iter_tx_bytes; where they
also recorded iter_tcp_timeouts, the job's TCP retransmission timeouts and the
machine's busy cores in each iteration too.

With --periods, also one line per whole correction period of the timed window,
taken from phase 1 to phase 0 (the dense step, phase K-1, with the short step
after it; --period-start 2: from phase 2 to phase 1, with the step that waits
for the dense round's pulls): every worker's own sum of its K iteration times (the fastest, median
and slowest worker), the median worker's time of the dense step and the step
after it (phases K-1 and 0) and of phase 1,
the mean bytes per host link and iteration, the busiest host link of the period,
and how far apart the workers' clocks are at the period's end (the spread of
their summed iteration times since the timed window began, after a barrier).
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
        timeouts = busy = None
        if all(w.get("iter_tcp_timeouts") for w in workers):
            # every host's namespace counts its own sockets: the job's sum
            timeouts = sum(w["iter_tcp_timeouts"][i] for w in workers)
            # the whole machine's busy cores over worker 0's iteration
            busy = workers[0]["iter_machine_busy_s"][i] / workers[0]["iter_times_s"][i]
        rows.append({"i": i, "max_ms": times[-1], "median_ms": times[len(times) // 2],
                     "link_kb": None if link is None else link / 1e3,
                     "tcp_timeouts": timeouts, "busy_cores": busy})
    return rows


def periods_of(workers, scale, warmup, period, start_phase=1):
    """One dict per whole correction period (start_phase .. start_phase - 1) of the
    timed window."""
    n = min(len(w["iter_times_s"]) for w in workers)
    first = next(i for i in range(n) if (warmup + i) % period == start_phase % period)
    ms = [[1e3 * t / scale for t in w["iter_times_s"][:n]] for w in workers]
    out = []
    for start in range(first, n - period + 1, period):
        span = range(start, start + period)
        sums = sorted(sum(m[i] for i in span) for m in ms)
        at = {(warmup + i) % period: i for i in span}
        dense = sorted(m[at[period - 1]] + m[at[0]] for m in ms)
        phase1 = sorted(m[at[1 % period]] for m in ms)
        ends = [sum(m[:start + period]) for m in ms]
        row = {"iters": "%d-%d" % (span[0], span[-1]), "min": sums[0],
               "median": sums[len(sums) // 2], "max": sums[-1],
               "dense": dense[len(dense) // 2], "phase1": phase1[len(phase1) // 2],
               "spread": max(ends) - min(ends), "host_kb": None, "busiest": None}
        if all(w.get("iter_tx_bytes") for w in workers):
            links = {}
            for w in workers:
                links["host %d up" % w["rank"]] = sum(w["iter_tx_bytes"][i] for i in span)
                links["host %d down" % w["rank"]] = sum(w["iter_rx_bytes"][i] for i in span)
            up = [v for k, v in links.items() if k.endswith("up")]
            row["host_kb"] = sum(up) / len(up) / period / 1e3
            busiest = max(links, key=links.get)
            row["busiest"] = "%s %.0f" % (busiest, links[busiest] / period / 1e3)
        out.append(row)
    return out


def print_periods(workers, scale, warmup, period, start_phase=1):
    rows = periods_of(workers, scale, warmup, period, start_phase)
    if not rows:
        return
    print("whole correction periods (phase %d .. phase %d), each worker's own sum:\n"
          % (start_phase % period, (start_phase - 1) % period))
    print("| iterations | fastest worker ms | median worker ms | slowest worker ms "
          "| median ms/step | phases %d + 0, median ms | phase 1, median ms "
          "| KB/iter per host link (up) | busiest link, KB/iter | workers' spread at end ms |"
          % (period - 1))
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print("| %s | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %s | %s | %.1f |" % (
            r["iters"], r["min"], r["median"], r["max"], r["median"] / period, r["dense"],
            r["phase1"], "-" if r["host_kb"] is None else "%.0f" % r["host_kb"],
            r["busiest"] or "-", r["spread"]))
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results_dir", help="a results directory or an -iterations.json")
    p.add_argument("--period", type=int, default=5)
    p.add_argument("--periods", action="store_true",
                   help="also the table of whole correction periods")
    p.add_argument("--period-start", type=int, default=1,
                   help="the phase a period starts at in that table (default 1: the "
                        "dense step and the short step after it end the period; 2: "
                        "the step after those two, which waits for the dense round's "
                        "pulls, ends it)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="the dilation (default: results.json's)")
    p.add_argument("--warmup-iters", type=int, default=None,
                   help="discarded iterations (default: results.json's)")
    args = p.parse_args()
    config = {}
    if os.path.isfile(args.results_dir):  # a committed *-iterations.json
        with open(args.results_dir) as f:
            saved = json.load(f)
        config = {"time_scale": saved["time_scale"], "warmup_iters": saved["warmup_iters"]}
        runs = sorted(saved["runs"].items())
    else:
        path = os.path.join(args.results_dir, "results.json")
        if os.path.exists(path):  # absent while the sweep still runs
            with open(path) as f:
                config = json.load(f)["config"]
        runs = [(os.path.basename(d), load_run(d))
                for d in sorted(glob.glob(os.path.join(args.results_dir, "runs", "*")))]
    scale = args.time_scale or float(config.get("time_scale") or 1.0)
    warmup = (args.warmup_iters if args.warmup_iters is not None
              else int(config.get("warmup_iters") or 0))
    for name, workers in runs:
        if not workers:
            continue
        rows = rows_of(workers, scale)
        print("## %s (dilated x%g; step = %d + i)\n" % (name, scale,
                                                        warmup))
        print("| i | phase | slowest worker ms | median worker ms | busiest link KB "
              "| TCP timeouts, all hosts | machine busy cores |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print("| %d | %d | %.1f | %.1f | %s | %s | %s |" % (
                r["i"], (warmup + r["i"]) % args.period, r["max_ms"], r["median_ms"],
                "-" if r["link_kb"] is None else "%.0f" % r["link_kb"],
                "-" if r["tcp_timeouts"] is None else r["tcp_timeouts"],
                "-" if r["busy_cores"] is None else "%.2f" % r["busy_cores"]))
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
        if args.periods:
            print_periods(workers, scale, warmup, args.period, args.period_start)


if __name__ == "__main__":
    main()
