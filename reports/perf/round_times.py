"""When each profiled step's round is issued, acknowledged and pulled, per worker.

    python reports/perf/round_times.py TRACE --time-scale D [--first-step S] [--period K]
        [--per-worker STEP,STEP...]

TRACE: a merged trace of cpsgd-bench --timeline (timeline/<rate>-<algorithm>.trace.json)
or a run directory with the workers' profile-*.json.  For a store that pushes and
pulls every key once per step (cpsgd and its variants), the n-th group of P push
operations of a worker (P = pushes per step, found from the first step) is step n's
round, and likewise for pulls and for the emulated forward/backward operations.

Per profiled step, the median over workers (dilated ms) of, relative to the
step's forward start on that worker: the end of the backward, the first push
starting (a push op starts when the engine runs it), the last push acknowledged
(in dist_sync a push op ends when the server acknowledges it, after every
worker's push of that key was merged and applied), the last pull landing, and
the next forward's start; and across workers the spread of the forward starts
(the latest minus the earliest, on the merged trace's common clock).
With --per-worker, also each worker's first push start, last push acknowledged
and last pull landed of the listed steps, in dilated ms from the first profiled
forward of any worker (one clock for all).  Pulls are grouped by start order, so
a step is only meaningful where its pulls start after the previous step's.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from compute_gaps import traces  # noqa: E402


def per_step(ops, kind, prefix, count=None):
    """Operations of one kind, in start order, cut into consecutive groups of ``count``."""
    chosen = sorted((o for o in ops if o["kind"] == kind and o["name"].startswith(prefix)),
                    key=lambda o: o["start"])
    if not chosen:
        return []
    count = count or len(chosen)
    return [chosen[i:i + count] for i in range(0, len(chosen) - count + 1, count)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--time-scale", type=float, required=True)
    p.add_argument("--first-step", type=int, default=0,
                   help="the step number of the first profiled step (label only)")
    p.add_argument("--period", type=int, default=5, help="correction period (label only)")
    p.add_argument("--per-worker", default=None,
                   help="comma-separated step numbers to show per worker")
    args = p.parse_args()
    wanted = ([int(x) - args.first_step for x in args.per_worker.split(",")]
              if args.per_worker else [])
    per_worker = {}
    d = args.time_scale
    runs = traces(args.trace)
    table = {}
    for rank, ops in sorted(runs.items()):
        fwd = [o for o in ops if o["kind"] == "forward" and o["name"].startswith("emulated")]
        bwd = [o for o in ops if o["kind"] == "backward" and o["name"].startswith("emulated")]
        if not fwd:
            continue
        # the emulated operations play one after another: sorted by their end, each
        # plays from the later of its start and the previous one's end
        stream = sorted(fwd + bwd, key=lambda o: o["end"])
        prev_end = None
        played = []
        for o in stream:
            begin = o["start"] if prev_end is None else max(o["start"], prev_end)
            played.append(dict(o, start=begin))
            prev_end = o["end"]
        per = _layers_per_step(played)
        steps = len(played) // (2 * per)
        fsteps = [played[2 * per * i:2 * per * i + per] for i in range(steps)]
        bsteps = [played[2 * per * i + per:2 * per * (i + 1)] for i in range(steps)]
        pushes = [o for o in ops if o["kind"] == "push"]
        pulls = [o for o in ops if o["kind"] == "pull"]
        n_push = len(pushes) // steps if steps else 0
        n_pull = len(pulls) // steps if steps else 0
        psteps = per_step(ops, "push", "", n_push) if n_push else []
        lsteps = per_step(ops, "pull", "", n_pull) if n_pull else []
        for k in range(steps):
            t0 = fsteps[k][0]["start"]
            row = {"fwd_start_abs": t0,
                   "bwd_end": (max(o["end"] for o in bsteps[k]) - t0) / 1e3 / d}
            if k < len(psteps):
                row["push_first"] = (psteps[k][0]["start"] - t0) / 1e3 / d
                row["push_acked"] = (max(o["end"] for o in psteps[k]) - t0) / 1e3 / d
                row["dense"] = any("Default" in o["name"] for o in psteps[k])
            if k < len(lsteps):
                row["pull_landed"] = (max(o["end"] for o in lsteps[k]) - t0) / 1e3 / d
            if k + 1 < steps:
                row["next_fwd"] = (fsteps[k + 1][0]["start"] - t0) / 1e3 / d
            table.setdefault(k, []).append(row)
            if k in wanted and k < len(psteps) and k < len(lsteps):
                per_worker.setdefault(rank, {})[k] = (
                    psteps[k][0]["start"], max(o["end"] for o in psteps[k]),
                    max(o["end"] for o in lsteps[k]))
    cols = ["bwd_end", "push_first", "push_acked", "pull_landed", "next_fwd"]
    print("| step | phase | push | backward ends | first push starts | last push acked "
          "| last pull landed | next forward starts | forward-start spread over workers |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for k, rows in sorted(table.items()):
        step = args.first_step + k
        med = []
        for c in cols:
            vals = [r[c] for r in rows if c in r]
            med.append("%.1f" % statistics.median(vals) if vals else "-")
        starts = [r["fwd_start_abs"] for r in rows]
        dense = any(r.get("dense") for r in rows)
        print("| %d | %d | %s | %s | %.1f |" % (
            step, step % args.period, "dense" if dense else "2-bit", " | ".join(med),
            (max(starts) - min(starts)) / 1e3 / d))
    print("\nmedian over %d workers; dilated ms from the step's forward start on each "
          "worker" % len(runs))
    if per_worker:
        origin = min(min(o["start"] for o in ops if o["kind"] == "forward")
                     for ops in runs.values())
        ms = lambda us: (us - origin) / 1e3 / d  # noqa: E731
        print("\nper worker, dilated ms from the first profiled forward: first push "
              "starts / last push acknowledged / last pull landed\n")
        print("| worker | " + " | ".join("step %d" % (args.first_step + k)
                                         for k in wanted) + " |")
        print("|---:|" + "---|" * len(wanted))
        for rank, steps_of in sorted(per_worker.items()):
            print("| %d | %s |" % (rank, " | ".join(
                "%.0f / %.0f / %.0f" % tuple(ms(t) for t in steps_of[k]) if k in steps_of
                else "-" for k in wanted)))


def _layers_per_step(played):
    """Emulated forward operations per step: the run of forwards the stream starts with."""
    count = 0
    for o in played:
        if o["kind"] != "forward":
            break
        count += 1
    return max(1, count)


if __name__ == "__main__":
    main()
