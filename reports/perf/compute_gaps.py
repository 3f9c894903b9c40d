"""Where the emulated compute stream of a cpsgd-bench run waits, from its profiles.

    python reports/perf/compute_gaps.py TRACE --time-scale D [--workers 0,1]

TRACE is a merged trace of --timeline (a results directory's
timeline/<rate>-<algorithm>.trace.json) or, while the bench still runs, one
run's directory under runs/ (the workers' profile-*.json).  The emulated compute is one stream of operations
(emulated_forward / emulated_backward); where it stands still between two of them
it waits for an input (a forward waits for its layer's weights: the local update,
which reads the pulled global weights).  For every gap longer than 2 % of an
iteration this prints when it starts (from the first forward, dilated units),
its length, the operation after it, and the latest-ending pull, push, update
and quantize operations that finished inside the gap (what the stream most
likely waited for).  Times are real time / D.
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mxnet_cpsgd.bench.timeline import load_ops  # noqa: E402


def traces(path):
    """rank -> operator intervals (dicts as load_ops gives them)."""
    if os.path.isdir(path):
        return {int(re.findall(r"(\d+)\.json$", p)[0]): load_ops(p)
                for p in glob.glob(os.path.join(path, "profile-*.json"))}
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    found = {}
    for ev in events:
        if ev.get("ph") == "X":
            found.setdefault(int(ev["pid"]), []).append(
                {"name": ev["name"], "start": float(ev["ts"]),
                 "end": float(ev["ts"]) + float(ev["dur"]), "kind": ev.get("cat")})
    return {rank: sorted(ops, key=lambda o: o["start"]) for rank, ops in found.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--time-scale", type=float, required=True)
    p.add_argument("--workers", default=None, help="ranks (default: all)")
    p.add_argument("--min-gap-ms", type=float, default=2.0)
    args = p.parse_args()
    d = args.time_scale
    wanted = set(int(r) for r in args.workers.split(",")) if args.workers else None
    totals = {}
    for rank, ops in sorted(traces(args.run_dir).items()):
        if wanted is not None and rank not in wanted:
            continue
        compute = [o for o in ops if o["kind"] in ("forward", "backward")
                   and o["name"].startswith("emulated")]
        if not compute:
            continue
        t0 = compute[0]["start"]
        ms = lambda us: (us - t0) / 1e3 / d  # noqa: E731
        # the emulated operations play one after another (sorted by their end):
        # one starts on the engine when its inputs are ready and plays from the
        # later of that and the previous one's end, so the stream stands still
        # wherever an operation started after the previous one had ended
        compute.sort(key=lambda o: o["end"])
        waits = []
        for a, b in zip(compute, compute[1:]):
            gap = (b["start"] - a["end"]) / 1e3 / d
            if gap < args.min_gap_ms:
                continue
            inside = {}
            for x in ops:
                if x["kind"] in ("pull", "push", "update", "quantize") and \
                        a["end"] <= x["end"] <= b["start"] + 1e3:
                    if x["kind"] not in inside or x["end"] > inside[x["kind"]]["end"]:
                        inside[x["kind"]] = x
            waits.append((ms(a["end"]), gap, b["name"], inside))
        span = ms(compute[-1]["end"])
        busy = span - sum(w[1] for w in waits)
        totals[rank] = (span, busy, sum(w[1] for w in waits))
        print("worker %d: span %.1f ms, compute %.1f ms, gaps > %.0f ms: %.1f ms"
              % (rank, span, busy, args.min_gap_ms, totals[rank][2]))
        for at, gap, after, inside in waits:
            last = ", ".join("%s %s ends %.1f" % (k, o["name"], ms(o["end"]))
                             for k, o in sorted(inside.items(), key=lambda kv: kv[1]["end"]))
            print("  at %7.1f gap %6.1f before %s; %s" % (at, gap, after, last or "-"))
    if totals:
        print("mean over workers: span %.1f, compute %.1f, waiting %.1f ms"
              % tuple(sum(v[i] for v in totals.values()) / len(totals) for i in range(3)))


if __name__ == "__main__":
    main()
