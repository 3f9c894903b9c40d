"""Steady-state time per iteration of cpsgd-bench runs, beside the bench's own figure.

    python reports/perf/steady_rate.py RESULTS [RESULTS ...]
    python reports/perf/steady_rate.py --keep-iterations RESULTS_DIR NAME-iterations.json

RESULTS: a cpsgd-bench --out-dir, or a copy of its results.json named NAME-results.json
beside NAME-iterations.json, which ``--keep-iterations`` writes from the directory (every
worker's per-iteration times and link bytes, the format reports/perf/iteration_rounds.py
also reads).

The bench's ms/iter ends its timed window when every piece of work the window issued
has finished, so work a store defers to later steps (cpsgd's rounds in flight after
the last timed step) drains after the last step with nothing to overlap, once per
window: it adds drain / iterations, more for 20 iterations than for 60.  A long
training run never drains between steps, so this script also prints the *steady*
rate: every worker's gaps between consecutive losses becoming readable over whole
correction periods (the run's ``correction_period``, 1 for stores without one),
starting at the second timed iteration (the first gap holds only a forward pass, the
window having begun from a drained pipeline); mean over workers.  For a store that
defers nothing (Horovod) both figures agree.

Columns: drained = the bench's ms/iter; steady; each / max(compute, transfer bound);
steady / Horovod's steady in the same invocation, where Horovod ran.
"""
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from iteration_rounds import load_run  # noqa: E402

#: what an -iterations.json keeps of each worker's JSON (reports/perf/iteration_rounds.py
#: reads the same files)
KEPT_FIELDS = ("rank", "iter_times_s", "iter_tx_bytes", "iter_rx_bytes", "iter_tcp_timeouts",
               "iter_tcp_retrans", "iter_machine_busy_s", "window_start_unix")


def iteration_times(results):
    """run name ('<rate>-<label>') -> every worker's iteration times (s, as measured)."""
    if os.path.isdir(results):
        return {name: [w["iter_times_s"] for w in workers]
                for name, workers in kept_workers(results).items()}
    with open(results[:-len("results.json")] + "iterations.json") as f:
        return {name: [w["iter_times_s"] for w in workers]
                for name, workers in json.load(f)["runs"].items()}


def kept_workers(results_dir):
    """run name -> each worker's KEPT_FIELDS, of the runs whose workers timed iterations."""
    runs = {}
    for run_dir in sorted(glob.glob(os.path.join(results_dir, "runs", "*"))):
        workers = [{k: w.get(k) for k in KEPT_FIELDS} for w in load_run(run_dir)]
        if workers and all(w["iter_times_s"] for w in workers):
            runs[os.path.basename(run_dir)] = workers
    return runs


def keep_iterations(results_dir, path):
    """Write ``path``: the -iterations.json of a results directory."""
    with open(os.path.join(results_dir, "results.json")) as f:
        config = json.load(f)["config"]
    with open(path, "w") as f:
        json.dump({"source": "per timed iteration, every worker of every run (worker JSON "
                             "fields %s; seconds and bytes, not dilated)"
                             % ", ".join(KEPT_FIELDS[1:]),
                   "time_scale": config["time_scale"], "warmup_iters": config["warmup_iters"],
                   "runs": kept_workers(results_dir)}, f)


def steady_ms(times, time_scale, period):
    """(steady ms per iteration, timed iterations used) of one run's iteration times."""
    times = np.array(times) * 1000.0 / time_scale  # workers x iterations
    whole = (times.shape[1] - 1) // period * period
    if whole == 0:
        raise SystemExit("fewer timed iterations than one period + 1")
    return float(times[:, 1:1 + whole].mean()), whole


def rows(source):
    """One dict per run of ``source`` (see the module docstring) that did not fail."""
    path = os.path.join(source, "results.json") if os.path.isdir(source) else source
    with open(path) as f:
        results = json.load(f)
    times = iteration_times(source)
    config = results["config"]
    knobs = {v["label"]: v["knobs"] for v in config["variants"]}
    out = []
    for row in results["rows"]:
        if row.get("failure") or row["algorithm"] == "compute":
            continue
        period = int(knobs.get(row["algorithm"], {}).get(
            "correction_period", config["correction_period"] if row["store"].startswith(
                "cpsgd") else 1))
        steady, used = steady_ms(times["%s-%s" % (row["rate"], row["algorithm"])],
                                 row["time_scale"], period)
        floor = max(config["emulate_compute"] or 0.0, row["transfer_bound_ms"] or 0.0)
        out.append(dict(rate=row["rate"], algorithm=row["algorithm"], drained=row["mean_ms"],
                        steady=steady, used=used, floor=floor))
    horovod = {r["rate"]: r["steady"] for r in out if r["algorithm"] == "horovod"}
    for r in out:
        r["vs_horovod"] = r["steady"] / horovod[r["rate"]] if r["rate"] in horovod else None
    return out


def main(argv=None):
    dirs = sys.argv[1:] if argv is None else argv
    if not dirs:
        raise SystemExit(__doc__)
    if dirs[0] == "--keep-iterations":
        if len(dirs) != 3 or not dirs[2].endswith("-iterations.json"):
            raise SystemExit("--keep-iterations RESULTS_DIR NAME-iterations.json")
        keep_iterations(dirs[1], dirs[2])
        return
    print("| results | rate | algorithm | drained ms/iter | steady ms/iter (iterations) | "
          "drained / max(compute, bound) | steady / max(compute, bound) | "
          "steady / horovod |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for results_dir in dirs:
        for r in rows(results_dir):
            print("| %s | %s | %s | %.1f | %.1f (%d) | %.3f | %.3f | %s |" % (
                os.path.basename(os.path.normpath(results_dir)).replace("-results.json", ""),
                r["rate"], r["algorithm"],
                r["drained"], r["steady"], r["used"], r["drained"] / r["floor"],
                r["steady"] / r["floor"],
                "-" if r["vs_horovod"] is None else "%.2f" % r["vs_horovod"]))


if __name__ == "__main__":
    main()
