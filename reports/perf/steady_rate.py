"""Steady-state time per iteration of cpsgd-bench runs, beside the bench's own figure.

    python reports/perf/steady_rate.py RESULTS_DIR [RESULTS_DIR ...]

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


def steady_ms(run_dir, time_scale, period):
    """(steady ms per iteration, timed iterations used) of one run directory."""
    times = []
    for path in sorted(glob.glob(os.path.join(run_dir, "worker-*.json"))):
        with open(path) as f:
            times.append(json.load(f)["iter_times_s"])
    times = np.array(times) * 1000.0 / time_scale  # workers x iterations
    whole = (times.shape[1] - 1) // period * period
    if whole == 0:
        raise SystemExit("%s: fewer timed iterations than one period + 1" % run_dir)
    return float(times[:, 1:1 + whole].mean()), whole


def rows(results_dir):
    with open(os.path.join(results_dir, "results.json")) as f:
        results = json.load(f)
    config = results["config"]
    knobs = {v["label"]: v["knobs"] for v in config["variants"]}
    out = []
    for row in results["rows"]:
        if row.get("failure") or row["algorithm"] == "compute":
            continue
        period = int(knobs.get(row["algorithm"], {}).get(
            "correction_period", config["correction_period"] if row["store"].startswith(
                "cpsgd") else 1))
        run_dir = os.path.join(results_dir, "runs", "%s-%s" % (row["rate"], row["algorithm"]))
        steady, used = steady_ms(run_dir, row["time_scale"], period)
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
    print("| results | rate | algorithm | drained ms/iter | steady ms/iter (iterations) | "
          "drained / max(compute, bound) | steady / max(compute, bound) | "
          "steady / horovod |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for results_dir in dirs:
        for r in rows(results_dir):
            print("| %s | %s | %s | %.1f | %.1f (%d) | %.3f | %.3f | %s |" % (
                os.path.basename(os.path.normpath(results_dir)), r["rate"], r["algorithm"],
                r["drained"], r["steady"], r["used"], r["drained"] / r["floor"],
                r["steady"] / r["floor"],
                "-" if r["vs_horovod"] is None else "%.2f" % r["vs_horovod"]))


if __name__ == "__main__":
    main()
