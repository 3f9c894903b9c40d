"""Which keys of a correction round were acknowledged last, and to whom: from a --timeline trace.

    python reports/perf/late_keys.py TRACE --time-scale D [--keys-per-round K] [--show N]

TRACE: a merged trace of cpsgd-bench --timeline (timeline/<rate>-<label>.trace.json) or a
run directory with the workers' profile-*.json.  A correction round is every worker's
next K dense pushes (KVStoreDistDefaultPush; K = 76: ResNet-20 on 16 servers), in the
order each worker started them (every worker pushes the keys in the same order), so the
j-th push of a round is the same key on every worker.  A dense push is acknowledged
once the key's server has every worker's push of that round and has applied it (MXNet's
synchronous server answers all of them then), so:

* acknowledged at the same moment on every worker: the server answered late, because
  one worker's push reached it late (or the server was slow);
* acknowledged at different moments: the answers travelled at different speeds.

Per round, the N keys acknowledged last: the key's place in the round, when its push
started (earliest and latest worker), when the workers got the acknowledgement (first
and last), all in dilated ms after the round's first push started, and the spread of the
acknowledgements.  Then how many keys were acknowledged within the median key's time
plus one compute period (--period-ms, default 100).

With --samples (tcp_sampler.py's file, written beside the same run; the trace's and the
samples' clocks are both the wall clock): the sockets whose unacknowledged bytes stayed
the same longest between the median key's acknowledgement and the last one (host, ports,
seconds real), with their unacknowledged bytes, RTOs in a row and congestion window at
each sample from the round's start.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from compute_gaps import traces  # noqa: E402
from tcp_sampler import load_samples, socket_holds  # noqa: E402


def rounds(found, keys_per_round):
    """[round][key place] -> list over workers of (start, end) in trace microseconds."""
    per_worker = {}
    for rank, ops in found.items():
        pushes = sorted((o for o in ops if o["name"] == "KVStoreDistDefaultPush"),
                        key=lambda o: o["start"])
        per_worker[rank] = [(o["start"], o["end"]) for o in pushes]
    count = min(len(p) for p in per_worker.values()) // keys_per_round
    return [[[per_worker[r][n * keys_per_round + j] for r in sorted(per_worker)]
             for j in range(keys_per_round)] for n in range(count)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--time-scale", type=float, required=True)
    p.add_argument("--keys-per-round", type=int, default=76)
    p.add_argument("--show", type=int, default=6, help="keys per round to list (default 6)")
    p.add_argument("--period-ms", type=float, default=100.0)
    p.add_argument("--samples", default=None, help="tcp_sampler.py's samples (.jsonl[.gz])")
    args = p.parse_args(argv)
    samples = load_samples(args.samples) if args.samples else None
    found = rounds(traces(args.trace), args.keys_per_round)
    if not found:
        sys.exit("no complete round of %d dense pushes per worker in %s"
                 % (args.keys_per_round, args.trace))
    ms = 1e3 * args.time_scale  # trace microseconds per dilated millisecond
    for n, keys in enumerate(found):
        t0 = min(s for key in keys for s, _ in key)
        rows = []
        for j, key in enumerate(keys):
            starts = [(s - t0) / ms for s, _ in key]
            ends = [(e - t0) / ms for _, e in key]
            rows.append((max(ends), min(ends), min(starts), max(starts), j))
        median_end = statistics.median(r[0] for r in rows)
        within = sum(1 for r in rows if r[0] <= median_end + args.period_ms)
        print("round %d: %d keys x %d workers; last acknowledgement %.1f ms after the first "
              "push started, median key %.1f; %d of %d keys acknowledged within the median "
              "+ %.0f ms" % (n, len(keys), len(keys[0]), max(r[0] for r in rows), median_end,
                             within, len(rows), args.period_ms))
        print("| key place | push started ms (first, last worker) | acknowledged ms "
              "(first, last worker) | spread of the acknowledgements ms |")
        print("|---:|---|---|---:|")
        for last, first, s0, s1, j in sorted(rows, reverse=True)[:args.show]:
            print("| %d | %.1f, %.1f | %.1f, %.1f | %.1f |" % (j, s0, s1, first, last,
                                                             last - first))
        print()
        if samples is not None:
            # trace microseconds -> wall-clock seconds
            holding(samples, t0 / 1e6, (t0 + median_end * ms) / 1e6,
                    (t0 + max(r[0] for r in rows) * ms) / 1e6, args.show)


def holding(samples, start, median_end, last_end, show):
    """Print the sockets whose unacknowledged bytes stayed the same longest within
    [median_end, last_end] (wall-clock seconds), with their samples from ``start``."""
    longest = {}
    for first, last, name in socket_holds(
            [s for s in samples if median_end <= s["t"] <= last_end]):
        longest[name] = max(longest.get(name, 0.0), last - first)
    points = {}
    for s in samples:
        if start <= s["t"] <= last_end:
            for host, sockets in s["hosts"].items():
                for k in sockets:
                    if k["unacked"] > 0:
                        points.setdefault((host, k["local"], k["remote"]), []).append((s["t"], k))
    print("sockets holding the same unacknowledged bytes longest between the median "
          "key's acknowledgement and the last (s real): unacked bytes / RTOs in a row / "
          "cwnd at each sample, s after the round's first push")
    for held, name in sorted(((v, k) for k, v in longest.items()), reverse=True)[:show]:
        host, local, remote = name
        print("- host %s, %d > %d, held %.2f s: %s" % (
            host, local, remote, held, " ".join(
                "%+.2f:%d/%d/%d" % (t - start, k["unacked"], k["rtos"], k["cwnd"])
                for t, k in points[name])))
    print()


if __name__ == "__main__":
    main()
