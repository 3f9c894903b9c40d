"""Where cpsgd's correction round lands: per profiled step, from a --timeline trace.

    python reports/perf/correction_round_steps.py TRACE --time-scale D [--first-step S]

TRACE: a merged trace of cpsgd-bench --timeline (timeline/<rate>-<label>.trace.json) or a
run directory with the workers' profile-*.json.  The emulated compute plays as one stream;
a worker's profiled steps are its consecutive groups of one forward and one backward
operation per layer, in the order they end: step k runs from the end of step k - 1's last
operation to the end of its own.  Per step, the median over workers (dilated ms) of: the
step's length, how long the stream stood still before one of the step's operations (a
forward waits for its layer's weights); the workers whose dense pushes
(KVStoreDistDefaultPush: the correction round) started in the step, how long
from the first of them starting to the last acknowledged (the servers had every worker's
push of that key), and in which step that was.  The step whose forward stands still is
the one waiting for a round's pulls.  With --pulls-per-step P (76: ResNet-20 on 16
servers), also when each step's pulls landed, relative to the end of that step's compute
(a step's pulls are its worker's next P pull operations in start order; --unpulled-step
skips a step that issues none, the correction step with correction_delay=1), and, for
the round before the correction, how its landings and the dense pushes' starts spread
over the workers (--correction-step: the correction's step number).  --first-step numbers the
steps as the bench does (its --warmup-iters + --iters).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from compute_gaps import traces  # noqa: E402


def analyse(ops, layers, scale):
    """Per step of one worker: dict of length, wait, dense pushes, landing steps."""
    # the emulated operations play as one stream, in the order they end; a step is
    # one forward and one backward operation per layer
    compute = sorted((o for o in ops if o["name"] in ("emulated_forward", "emulated_backward")),
                     key=lambda o: o["end"])
    chunks = [compute[i:i + 2 * layers] for i in range(0, len(compute), 2 * layers)]
    bounds = [compute[0]["start"]] + [c[-1]["end"] for c in chunks]

    def step_at(t):
        return min(len(chunks) - 1, max(0, sum(1 for b in bounds[1:] if b < t)))

    rows = [{"length": (bounds[k + 1] - bounds[k]) / 1e3 / scale, "wait": 0.0, "dense": 0,
             "acked_in": None, "push_ms": None} for k in range(len(chunks))]
    for k, chunk in enumerate(chunks):
        previous = [compute[k * 2 * layers - 1]] if k else []
        for a, b in zip(previous + chunk, chunk if k else chunk[1:]):
            rows[k]["wait"] += max(0.0, b["start"] - a["end"]) / 1e3 / scale
    # one correction round per burst of dense pushes (a profile of more than one
    # correction period holds more than one); a round's last pushes may start after
    # its step's compute has ended, so a round is split from the next by a gap of a
    # whole step between the starts of two dense pushes, and belongs to the step its
    # first push started in
    step_length = statistics.median(b - a for a, b in zip(bounds, bounds[1:]))
    rounds = []
    for o in sorted((o for o in ops if o["name"] == "KVStoreDistDefaultPush"),
                    key=lambda o: o["start"]):
        if rounds and o["start"] - rounds[-1][-1]["start"] < step_length:
            rounds[-1].append(o)
        else:
            rounds.append([o])
    for dense in rounds:
        first = dense[0]["start"]
        issued = step_at(first)
        last_ack = max(o["end"] for o in dense)
        rows[issued]["dense"] = len(dense)
        # after the profile's last step: counted as the step after it
        rows[issued]["acked_in"] = (step_at(last_ack) if last_ack <= bounds[-1]
                                    else len(chunks)) - issued
        rows[issued]["push_ms"] = (last_ack - first) / 1e3 / scale
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--time-scale", type=float, required=True)
    p.add_argument("--layers", type=int, default=43, help="emulated layers (ResNet-20: 43)")
    p.add_argument("--first-step", type=int, default=30)
    p.add_argument("--pulls-per-step", type=int, default=0)
    p.add_argument("--unpulled-step", type=int, action="append", default=[])
    p.add_argument("--correction-step", type=int, default=34)
    args = p.parse_args(argv)
    found = traces(args.trace)
    per_worker = {r: analyse(ops, args.layers, args.time_scale)
                  for r, ops in sorted(found.items())}
    steps = min(len(rows) for rows in per_worker.values())
    print("| step | length ms | stood still ms | workers whose dense pushes started |"
          " dense pushes: first start to last acknowledged ms | acknowledged in |")
    print("|---:|---:|---:|---:|---:|---|")
    for k in range(steps):
        rows = [w[k] for w in per_worker.values()]
        issued = [r for r in rows if r["dense"]]
        acked = [r["acked_in"] for r in issued]
        where = "-"
        if acked:
            typical = statistics.median_low(acked)
            where = "step + %d (%d of %d)" % (typical, acked.count(typical), len(acked))
        print("| %d | %.1f | %.1f | %s | %s | %s |" % (
            args.first_step + k, statistics.median(r["length"] for r in rows),
            statistics.median(r["wait"] for r in rows), len(issued) or "-",
            "%.1f" % statistics.median(r["push_ms"] for r in issued) if issued else "-",
            where))
    if args.pulls_per_step:
        pull_rounds(found, args.layers, args.pulls_per_step, set(args.unpulled_step),
                    args.time_scale, args.first_step, args.correction_step)

def pull_rounds(per_rank_ops, layers, per_step, unpulled, scale, first_step, correction):
    """Print when each step's pulls landed, and the round before the dense pushes."""
    landed, before_dense, dense_starts = {}, [], []
    for ops in per_rank_ops.values():
        compute = sorted((o for o in ops if o["name"] in ("emulated_forward",
                                                          "emulated_backward")),
                         key=lambda o: o["end"])
        ends = [compute[i + 2 * layers - 1]["end"]
                for i in range(0, len(compute) - 2 * layers + 1, 2 * layers)]
        pulls = sorted((o for o in ops if o["kind"] == "pull"), key=lambda o: o["start"])
        steps = [k for k in range(len(ends)) if k + first_step not in unpulled]
        groups = [pulls[i:i + per_step] for i in range(0, len(pulls) - per_step + 1, per_step)]
        dense = [o["start"] for o in ops if o["name"] == "KVStoreDistDefaultPush"]
        for k, group in zip(steps, groups):
            last = max(o["end"] for o in group)
            landed.setdefault(k, []).append((last - ends[k]) / 1e3 / scale)
        if dense:
            dense_starts.append(min(dense))
            before = [g for k, g in zip(steps, groups) if k + first_step == correction - 1]
            if before:
                before_dense.append(max(o["end"] for o in before[0]))
    print("\n| step | its pulls landed, ms after its compute ended: median | min | max |")
    print("|---:|---:|---:|---:|")
    for k in sorted(landed):
        v = landed[k]
        print("| %d | %.1f | %.1f | %.1f |" % (k + first_step, statistics.median(v), min(v),
                                               max(v)))
    if dense_starts and before_dense:
        t0 = min(dense_starts)
        print("\nms from the first worker's dense push, sorted over workers:")
        print("dense pushes start:", " ".join("%.0f" % ((t - t0) / 1e3 / scale)
                                              for t in sorted(dense_starts)))
        print("round before them landed:", " ".join("%.0f" % ((t - t0) / 1e3 / scale)
                                                    for t in sorted(before_dense)))


if __name__ == "__main__":
    main()
